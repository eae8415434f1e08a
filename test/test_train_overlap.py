"""Model-vs-model metrics: top-K overlap (plain and AR-aligned) and per-waypoint L2."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import format as fmt
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import tiny_random
from wamdiff_training import layout as lay
from wamdiff_training.data import encode_answer
from wamdiff_training.overlap import (
    Overlap, ar_aligned_overlap, model_overlap, top_k_hits, top_k_overlap, waypoint_l2,
)

BLOCK = 8
# Unrelated random models: at masked positions every input is [MASK], so within one model the top-K barely moves
# from position to position and each model pair is close to ONE draw of two random K-sets (hypergeometric: K = 50 of
# V = 540 -> mean 0.093, sd 0.04 per pair). Three pairs averaged: sd ~0.023; the tolerance is 0.05 (~2 sd).
CHANCE_K, CHANCE_TOL = 50, 0.05


@pytest.fixture(scope="module")
def layouts(tiny_bundle, road_image):
    rng = np.random.default_rng(0)
    prompts, answers = [], []
    for i, command in enumerate(fmt.Command):
        prompts.append(encode_prompt(tiny_bundle, fmt.plan_prompt(command, (6.0 + i, 0.1), (0.3, -0.2)),
                                     road_image[::2, ::2]))
        answers.append(encode_answer(tiny_bundle, fmt.format_waypoints(rng.uniform(-20, 40, (8, 2)))))
    return lay.diffusion_batch(prompts, answers, BLOCK, tiny_bundle.mask_token_id, tiny_bundle.meta.prompt_block_size,
                               generator=torch.Generator().manual_seed(0))


def test_top_k_hits_by_hand():
    a = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    b = torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    assert top_k_hits(a, b, 2).tolist() == [0.5, 0.0]  # {0,1} vs {0,2}; {4,3} vs {0,1}
    assert top_k_hits(a, b, 3).tolist() == pytest.approx([2 / 3, 1 / 3])
    assert top_k_hits(a, b, 2, exclude=[0]).tolist() == [0.5, 0.0]  # {1,2} vs {2,4}; {4,3} vs {1,2}
    assert top_k_hits(a, a, 5).tolist() == [1.0, 1.0]
    longer = torch.cat([b, torch.full((2, 1), 99.0)], 1)  # an extra (e.g. [MASK]) row is cut away
    assert torch.equal(top_k_hits(a, longer, 2), top_k_hits(a, b, 2))
    result = top_k_overlap(a, b, 2, where=torch.tensor([True, False]))
    assert result == Overlap(0.5, 1, 2)
    assert Overlap.combine([Overlap(0.5, 1, 2), Overlap(0.2, 4, 2)]).rho == pytest.approx(0.26)
    with pytest.raises(ValueError):
        top_k_hits(a, b, 6)


def test_a_model_overlaps_itself_fully(tiny_bundle, layouts):
    result = model_overlap(tiny_bundle.model, tiny_bundle.model, layouts)
    assert result.rho == 1.0 and result.k == 5
    assert result.positions == sum(int((x.labels != lay.IGNORE).sum()) for x in layouts)


def test_unrelated_random_models_overlap_at_chance(tiny_bundle, layouts):
    vocab = tiny_bundle.model.config.text_config.vocab_size - 1  # [MASK] is left out
    chance = CHANCE_K / vocab
    others = [tiny_random(seed=s).model for s in (1, 2, 3)]
    pairs = [(tiny_bundle.model, others[0]), (others[0], others[1]), (others[1], others[2])]
    plain = np.mean([model_overlap(a, b, layouts, CHANCE_K).rho for a, b in pairs])
    aligned = np.mean([ar_aligned_overlap(a, b, layouts, CHANCE_K).rho for a, b in pairs])
    assert abs(plain - chance) < CHANCE_TOL and abs(aligned - chance) < CHANCE_TOL, (plain, aligned, chance)


def test_ar_alignment_compares_logit_i_minus_1_with_masked_logit_i(tiny_bundle, layouts):
    ar_model, diffusion_model = tiny_random(seed=4).model, tiny_bundle.model
    layout = layouts[0]
    length, n = layout.prompt_len, layout.answer_len
    with torch.no_grad():
        ids = torch.cat([layout.input_ids[:length], layout.answer])[None]
        causal = ar_model(input_ids=ids, mm_token_type_ids=layout.mm_token_type_ids[None, :length + n],
                          pixel_values=layout.pixel_values, image_grid_thw=layout.image_grid_thw).logits[0]
        diffusion = lay.forward_layouts(diffusion_model, [layout]).logits
    masked = layout.labels != lay.IGNORE
    k = 100  # wide enough that a one-row misalignment changes the value
    want = top_k_overlap(causal[length - 1:length + n - 1], diffusion, k, masked, [tiny_bundle.mask_token_id])
    off_by_one = top_k_overlap(causal[length:length + n], diffusion, k, masked, [tiny_bundle.mask_token_id])
    assert off_by_one.rho != pytest.approx(want.rho)
    got = ar_aligned_overlap(ar_model, diffusion_model, [layout], k)
    assert got.positions == int(masked.sum()) and got.rho == pytest.approx(want.rho)
    with pytest.raises(ValueError):
        ar_aligned_overlap(ar_model, diffusion_model, [lay.ar_layout(layout.prompt_inputs(), layout.answer)])


def test_per_waypoint_l2_by_hand():
    truth = np.zeros((8, 2))
    near = truth.copy()
    near[:, 0] = np.arange(8)  # error k at waypoint k
    far = truth.copy()
    far[:, 1] = 2 * np.arange(8)  # error 2k at waypoint k
    text = fmt.format_waypoints(far)
    bad_shape, not_finite = np.zeros((7, 2)), np.full((8, 2), np.nan)
    result = waypoint_l2([near, text, "1.00,2.00", bad_shape, not_finite, ""], [truth] * 6)
    assert result.valid == 2 and result.invalid == 4
    np.testing.assert_allclose(result.per_waypoint, 1.5 * np.arange(8))
    assert result.mean == pytest.approx(1.5 * 3.5)
    diagonal = waypoint_l2([np.full((8, 2), 3.0)], [np.full((8, 2), -1.0)])
    np.testing.assert_allclose(diagonal.per_waypoint, np.full(8, np.hypot(4.0, 4.0)))
    none = waypoint_l2(["garbage"], [truth])
    assert none.valid == 0 and none.invalid == 1 and np.isnan(none.per_waypoint).all()
    with pytest.raises(ValueError):
        waypoint_l2([near], [truth, truth])
