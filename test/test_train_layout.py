"""The training layout against the decoder: masks, positions and logits position by position (anchors §1)."""

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
from wamdiff_ros.bench.reference import FullSequenceBackend
from wamdiff_ros.decoding import masks
from wamdiff_ros.inputs import PromptInputs, encode_prompt
from wamdiff_training import layout as lay
from wamdiff_training.data import encode_answer
from wamdiff_training.losses import masked_cross_entropy

LOGIT_TOL = 1e-4  # fp32; observed ~1e-6
BLOCK = 8


def _fake_prompt(length: int) -> PromptInputs:
    ids = torch.arange(10, 10 + length)[None]
    return PromptInputs(ids, torch.zeros_like(ids, dtype=torch.int32), None, None)


@pytest.fixture(scope="module")
def prompt(tiny_bundle, road_image):
    return encode_prompt(tiny_bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.2, 0.1), (0.3, -0.2)), road_image[::2, ::2])


@pytest.fixture(scope="module")
def answer(tiny_bundle):
    rng = np.random.default_rng(0)
    return encode_answer(tiny_bundle, fmt.format_waypoints(rng.uniform(-20, 40, (8, 2))))


def _masked(n: int, seed: int = 0, noise: lay.NoiseConfig = lay.NoiseConfig()) -> torch.Tensor:
    return lay.sample_masked([n], BLOCK, noise, torch.Generator().manual_seed(seed))[0]


def test_visibility_by_hand():
    # prompt of 2 (causal), answer of 4 in blocks of 2: rows/cols = p0 p1 | c0 c1 c2 c3 | n0 n1 n2 n3
    layout = lay.diffusion_layout(_fake_prompt(2), torch.arange(4), torch.ones(4, dtype=torch.bool), 2, 999)
    want = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(layout.visible, want)
    assert layout.block_ids.tolist() == [0, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    assert layout.position_of.tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5]
    assert layout.input_ids[6:].tolist() == [999] * 4 and layout.scored.tolist() == [6, 7, 8, 9]


def _decode_view_index(length: int, n: int, start: int, stop: int) -> torch.Tensor:
    """Layout index of each position of the decoder's sequence at block [start, stop): prompt, clean answer[:start],
    then the noisy block."""
    return torch.cat([torch.arange(length + start), torch.arange(length + n + start, length + n + stop)])


def _assert_rows_match(layout: lay.Layout, rows: torch.Tensor, cols: torch.Tensor, view: torch.Tensor) -> None:
    """Layout rows see exactly the keys ``view`` shows at the mapped columns, and nothing else."""
    got = layout.visible[rows]
    assert torch.equal(got[:, cols], view)
    rest = torch.ones(layout.length, dtype=torch.bool)
    rest[cols] = False
    assert not bool(got[:, rest].any())


@pytest.mark.parametrize("prompt_block_size", [1, 3])
@pytest.mark.parametrize("n", [7, 8, 13])
def test_visibility_equals_the_decoders_rule(prompt_block_size, n):
    length = 5
    layout = lay.diffusion_layout(_fake_prompt(length), torch.arange(n), _masked(n), 3, 999, prompt_block_size)
    # prompt and clean copy: the decoder's prefill + commit view over prompt ⊕ answer
    stream = masks.block_ids(length, n, 3, prompt_block_size)
    _assert_rows_match(layout, torch.arange(length + n), torch.arange(length + n), masks.visible(stream, stream))
    # noisy block b: the decoder's step view of prompt ⊕ clean[:start] ⊕ block b
    for start in range(0, n, 3):
        stop = min(n, start + 3)
        ids = masks.block_ids(length, stop, 3, prompt_block_size)
        view = masks.visible(ids, ids)[length + start:]
        cols = _decode_view_index(length, n, start, stop)
        _assert_rows_match(layout, torch.arange(length + n + start, length + n + stop), cols, view)


def _capture_masks(model):
    seen = []

    def hook(module, args, kwargs):
        seen.append(kwargs["attention_mask"][0, 0] == 0)

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("prompt_block_size", [1, 32])
def test_training_mask_is_what_the_reference_decoder_attends_to(tiny_bundle, prompt, answer, prompt_block_size):
    n, length = len(answer), prompt.length
    layout = lay.diffusion_layout(prompt, answer, _masked(n), BLOCK, tiny_bundle.mask_token_id, prompt_block_size)
    reference = FullSequenceBackend(tiny_bundle.model, prompt, BLOCK, prompt_block_size)
    seen, handle = _capture_masks(tiny_bundle.model)
    try:
        reference.logits(answer)  # everything committed: the prompt and commit view
        for start in range(0, n, BLOCK):
            reference.committed = answer[:start].tolist()
            reference.step(layout.input_ids[layout.scored[start:start + BLOCK]])
    finally:
        handle.remove()
    assert len(seen) == 1 + -(-n // BLOCK)
    _assert_rows_match(layout, torch.arange(length + n), torch.arange(length + n), seen[0])
    for view, start in zip(seen[1:], range(0, n, BLOCK)):
        stop = min(n, start + BLOCK)
        rows = torch.arange(length + n + start, length + n + stop)
        _assert_rows_match(layout, rows, _decode_view_index(length, n, start, stop), view[length + start:])


@pytest.mark.parametrize("block_size,prompt_block_size", [(BLOCK, 32), (BLOCK, 1), (1, 1)])
def test_noisy_block_logits_equal_the_reference_decoders(tiny_bundle, prompt, answer, block_size, prompt_block_size):
    """The tie between training and decoding: a batch (image prompt + text-only prompt, padded) through the training
    forward gives, for every noisy block, the logits the decoder's reference backend gives that block after the
    same committed prefix; the clean copy gives the logits of the committed answer."""
    bundle = tiny_bundle
    text_only = encode_prompt(bundle, fmt.ask_prompt("Is the lane to the left free?"), None)
    short = answer[-20:]
    cases = [(prompt, answer, _masked(len(answer), 1)), (text_only, short, torch.rand(20) < 0.5)]
    if block_size == 1:
        cases = [(p, a, torch.ones_like(a, dtype=torch.bool)) for p, a, _ in cases]
    layouts = [lay.diffusion_layout(p, a, m, block_size, bundle.mask_token_id, prompt_block_size) for p, a, m in cases]
    with torch.no_grad():
        out = lay.forward_layouts(bundle.model, layouts, with_clean=True)
    assert out.logits.shape == (len(answer) + 20, bundle.model.config.text_config.vocab_size)
    for (p, a, _), layout, logits, clean in zip(cases, layouts, out.split(), out.clean.split(out.lengths)):
        reference = FullSequenceBackend(bundle.model, p, block_size, prompt_block_size)
        noisy = layout.input_ids[layout.scored]
        assert torch.equal(noisy == bundle.mask_token_id, layout.labels != lay.IGNORE)
        assert (reference.logits(a) - clean).abs().max().item() < LOGIT_TOL
        starts = range(0, len(a), block_size) if block_size > 1 else [0, 1, 9, len(a) - 1]
        for start in starts:
            block = noisy[start:start + block_size]
            want = reference.logits(torch.cat([a[:start], block]))[-len(block):]
            assert (want - logits[start:start + len(block)]).abs().max().item() < LOGIT_TOL, start


def test_noisy_copy_takes_the_clean_copys_m_rope_positions(tiny_bundle, prompt, answer):
    layout = lay.diffusion_layout(prompt, answer, _masked(len(answer)), BLOCK, tiny_bundle.mask_token_id)
    pos = lay.position_ids(tiny_bundle.model, layout)
    length, n = prompt.length, len(answer)
    assert pos.shape == (3, layout.length)
    assert torch.equal(pos[:, length + n:], pos[:, length:length + n])
    image = prompt.mm_token_type_ids[0].bool()
    assert not torch.equal(pos[1, :length][image], pos[2, :length][image])  # 3-D positions on the image
    want, _ = tiny_bundle.model.model.get_rope_index(
        torch.cat([prompt.input_ids, answer[None]], 1), layout.mm_token_type_ids[None, :length + n],
        image_grid_thw=prompt.image_grid_thw)
    assert torch.equal(pos[:, :length + n], want[:, 0])


def test_labels_only_on_masked_answer_positions(tiny_bundle, prompt, answer):
    masked = _masked(len(answer))
    layout = lay.diffusion_layout(prompt, answer, masked, BLOCK, tiny_bundle.mask_token_id)
    labels = layout.sequence_labels()
    length, n = prompt.length, len(answer)
    assert bool((labels[:length + n] == lay.IGNORE).all())  # never prompt, never the clean copy
    noisy = labels[length + n:]
    assert torch.equal(noisy[masked], answer[masked]) and bool((noisy[~masked] == lay.IGNORE).all())
    assert bool((layout.input_ids[length + n:][masked] == tiny_bundle.mask_token_id).all())
    assert torch.equal(layout.input_ids[length + n:][~masked], answer[~masked])


def test_ar_layout_is_the_plain_causal_forward_shifted(tiny_bundle, prompt, answer):
    layout = lay.ar_layout(prompt, answer)
    assert torch.equal(layout.sequence_labels()[prompt.length - 1:-1], answer)
    with torch.no_grad():
        out = lay.forward_layouts(tiny_bundle.model, [layout])
        ids = torch.cat([prompt.input_ids, answer[None]], 1)
        types = layout.mm_token_type_ids[None]
        plain = tiny_bundle.model(input_ids=ids, mm_token_type_ids=types, pixel_values=prompt.pixel_values,
                                  image_grid_thw=prompt.image_grid_thw).logits[0]
    assert (plain[prompt.length - 1:-1] - out.logits).abs().max().item() < LOGIT_TOL
    assert torch.equal(out.labels, answer)


def test_in_place_b1_variant_masks_every_token(tiny_bundle, prompt, answer):
    layout = lay.in_place_ar_layout(prompt, answer, tiny_bundle.mask_token_id)
    n = len(answer)
    assert torch.equal(layout.labels, answer)
    assert len(set(layout.block_ids[-n:].tolist())) == n
    noisy_rows = layout.visible[-n:]
    assert torch.equal(noisy_rows[:, -n:], torch.eye(n, dtype=torch.bool))  # only itself among the noisy copy
    assert torch.equal(noisy_rows[:, prompt.length:-n], torch.ones(n, n, dtype=torch.bool).tril(-1))


def test_noise_is_stratified_with_a_mask_in_every_block():
    gen = torch.Generator().manual_seed(0)
    rates = lay.sample_mask_rates(40, lay.NoiseConfig(0.1, 0.5), gen)
    strata = ((rates.sort().values - 0.1) / 0.4 * 40).floor()
    assert torch.equal(strata, torch.arange(40.0))
    lens = [33, 8, 1, 17]
    for noise in (lay.NoiseConfig(), lay.NoiseConfig(0.0, 0.0), lay.NoiseConfig(0.1, 0.5)):
        for masked, n in zip(lay.sample_masked(lens, BLOCK, noise, gen), lens):
            assert masked.shape == (n,) and masked.dtype == torch.bool
            per_block = [int(masked[s:s + BLOCK].sum()) for s in range(0, n, BLOCK)]
            assert min(per_block) >= 1
            if noise.t_max == 0.0:
                assert max(per_block) == 1
    many = lay.sample_masked([BLOCK] * 2000, BLOCK, lay.NoiseConfig(0.1, 0.5), gen)
    share = torch.stack(many).float().mean().item()
    assert abs(share - 0.313) < 0.01  # E[max(Binomial(8, t), 1)] / 8 over t ~ U[0.1, 0.5): 0.3 + the forced mask


def test_gradients_flow_through_the_forward(prompt, answer):
    from wamdiff_ros.model import tiny_random

    bundle = tiny_random(seed=3)
    layouts = lay.diffusion_batch([prompt], [answer], BLOCK, bundle.mask_token_id, 32,
                                  generator=torch.Generator().manual_seed(0))
    out = lay.forward_layouts(bundle.model, layouts)
    masked_cross_entropy(out.logits, out.labels).backward()
    grad = bundle.model.model.language_model.embed_tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_answer_helpers_and_refusals(tiny_bundle):
    ids = encode_answer(tiny_bundle, "1.00,2.00")
    assert int(ids[-1]) == tiny_bundle.eos_token_id
    padded = lay.pad_to_blocks(ids, BLOCK, tiny_bundle.eos_token_id)
    assert len(padded) % BLOCK == 0 and torch.equal(padded[:len(ids)], ids)
    assert bool((padded[len(ids):] == tiny_bundle.eos_token_id).all())
    with pytest.raises(ValueError, match="MASK"):
        lay.diffusion_layout(_fake_prompt(3), torch.tensor([1, 999]), torch.ones(2, dtype=torch.bool), 2, 999)
    with pytest.raises(ValueError, match="bool"):
        lay.diffusion_layout(_fake_prompt(3), torch.tensor([1, 2]), torch.ones(3, dtype=torch.bool), 2, 999)
    with pytest.raises(ValueError):
        lay.NoiseConfig(0.6, 0.5)
