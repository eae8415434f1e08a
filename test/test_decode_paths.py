"""One decode entry point: the graph path's code (``GraphRunner``, the plan grammar as a per-position mask inside
the step) run eagerly on the CPU gives exactly the tokens of the host loop (``decode_blocks_host`` with the host
constraint), and the mask is the host constraint's allowed sets, position by position, token by token."""

import numpy as np
import pytest
import torch
from conftest import scaled_tiny

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.generate import generate
from wamdiff_ros.decoding.grammar_mask import allowed_sets, grammar_mask
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import load
from wamdiff_ros.planner import Planner

MODELS = ("tiny-random", "wamdiff-tiny")
COMMANDS = tuple(fmt.Command)


def _bundle(name: str):
    return scaled_tiny() if name == "tiny-random" else load(name)


def _inputs(n: int, seed: int = 0) -> list[tuple[np.ndarray, str]]:
    """``n`` (image, plan prompt) pairs: the sample frame shifted and noised, varied ego state, command and route."""
    from wamdiff_ros.cli import load_rgb, sample_image_path

    rng, base = np.random.default_rng(seed), load_rgb(sample_image_path())
    out = []
    for i in range(n):
        image = np.roll(base, int(rng.integers(-40, 40)), axis=1)
        image = np.clip(image.astype(np.int16) + rng.integers(-20, 20, image.shape), 0, 255).astype(np.uint8)
        route = None if i % 4 == 3 else np.array([[10.0, rng.uniform(-3, 3)], [30.0, rng.uniform(-12, 12)]])
        prompt = fmt.plan_prompt(COMMANDS[i % len(COMMANDS)], (rng.uniform(0, 25), 0.0), (rng.uniform(-2, 2), 0.0),
                                 route)
        out.append((image, prompt))
    return out


@pytest.fixture(scope="module")
def bundles():
    return {name: _bundle(name) for name in MODELS}


def _compare(bundle, block: int, schedule: str, constrained: bool, inputs) -> int:
    steps = 2 if schedule == "static" else min(block, 8)  # any T: fewer forwards keep CI short
    planner = Planner(bundle, DecodeSettings(block_size=block, steps=steps, schedule=schedule, max_new_tokens=112,
                                             constrain=constrained))
    settings, constraint = planner.settings, planner._constraint
    runner = planner._runner_for(4096)
    assert (planner._grammar is not None) == constrained  # fixed width with one-character tokens: in the step
    for image, user in inputs:
        prompt = encode_prompt(bundle, user, image)
        host = generate(bundle, prompt, settings, constraint).result
        path = generate(bundle, prompt, settings, constraint, runner=runner, grammar=planner._grammar).result
        assert path.tokens == host.tokens, user
        np.testing.assert_allclose(path.confidence, host.confidence, atol=1e-5)  # softmax over V vs over the grammar
        assert path.steps_per_block == host.steps_per_block
        assert path.forward_calls == host.forward_calls
    return len(inputs)


@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "free"])
@pytest.mark.parametrize("schedule", ["threshold", "static"])
@pytest.mark.parametrize("block", [4, 8, 32])
@pytest.mark.parametrize("model", MODELS)
def test_graph_path_code_gives_the_host_loops_tokens(bundles, model, block, schedule, constrained):
    assert _compare(bundles[model], block, schedule, constrained, _inputs(20)) == 20


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_graph_path_code_gives_the_host_loops_tokens_on_100_inputs(bundles, model):
    for block in (4, 8, 32):
        for schedule in ("threshold", "static"):
            for constrained in (True, False):
                _compare(bundles[model], block, schedule, constrained, _inputs(100, seed=1))


@pytest.mark.parametrize("model", MODELS)
def test_grammar_mask_is_the_host_constraints_allowed_sets_everywhere(bundles, model):
    """Every position, every token: the mask row is the host constraint's allowed set with the rest masked, and
    fixing any allowed token anywhere leaves every other position's allowed set as it was (so the grammar is a
    product of the mask's rows whatever is fixed)."""
    bundle = bundles[model]
    vocab = bundle.model.get_output_embeddings().weight.shape[0]
    constraint = WaypointConstraint(bundle.tokenizer, bundle.eos_token_id, 128, vocab, bundle.meta.format_version)
    mask = grammar_mask(constraint, bundle.tokenizer, bundle.eos_token_id, vocab)
    assert mask is not None and mask.shape == (128, vocab)
    free = allowed_sets(constraint, 128)
    assert [set(torch.nonzero(row).flatten().tolist()) for row in mask] == free
    assert all(free[j] == {bundle.eos_token_id} for j in range(111, 128))  # 111 characters, then EOS
    for j in range(111):
        for token in sorted(free[j]):
            fixed = allowed_sets(constraint, 128, {j: token})
            assert fixed[:j] + fixed[j + 1:] == free[:j] + free[j + 1:], (j, token)


def test_free_width_keeps_the_host_constraint():
    bundle = scaled_tiny(format_version=1)
    planner = Planner(bundle, DecodeSettings())
    assert planner._grammar is None and planner.backend.endswith("grammar on the host")


def test_backend_report_and_attention_requests_on_the_cpu(caplog):
    bundle = scaled_tiny()
    assert Planner(bundle, DecodeSettings()).backend == "attention sdpa, cuda_graph off (cpu), grammar in the step"
    from wamdiff_ros.decoding import attention

    attention._logged.clear()
    with caplog.at_level("WARNING"):
        planner = Planner(bundle, DecodeSettings(attention="flashinfer"))
    assert planner.backend.startswith("attention sdpa")
    assert [r.getMessage() for r in caplog.records if "fell back to sdpa" in r.getMessage()] == [
        "attention backend: sdpa (flashinfer: fell back to sdpa, device is cpu, FlashInfer needs CUDA)"]
    with pytest.raises(attention.AttentionUnavailable, match="attention 'flashinfer' cannot run: device is cpu"):
        Planner(bundle, DecodeSettings(attention="flashinfer", strict_attention=True))
