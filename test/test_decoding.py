"""Decoder exactness: the cached engine against full-sequence forwards with the explicit mask."""

import copy

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.reference import FullSequenceBackend, module_layers, modules_in_engine, unstacked_engines
from wamdiff_ros.decoding import masks
from wamdiff_ros.decoding.engine import DecoderEngine, fused_layers
from wamdiff_ros.decoding.host import CachedBackend, decode_blocks_host
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.decoding.unmask import tokens_per_step, unmask_confident, unmask_step, unmask_top_k
from wamdiff_ros.errors import DecodeSettingsError
from wamdiff_ros.inputs import encode_prompt

LOGIT_TOL = 1e-4  # fp32: observed differences are ~1e-6 on logits of magnitude ~50
MARGIN_TOL = 1e-3  # decisions closer than this may legitimately flip between the two computations


def _prompt(bundle, image):
    return encode_prompt(bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.2, 0.1), (0.3, -0.2)), image[::2, ::2])


def _cached(bundle, prompt, settings, trace=None, constraint=None):
    engine = DecoderEngine(bundle.model, prompt.length + settings.max_new_tokens + settings.block_size)
    engine.prefill(prompt, bundle.meta.prompt_block_size)
    return decode_blocks_host(CachedBackend(engine), settings, bundle.mask_token_id, bundle.eos_token_id, constraint,
                         ignore_eos=True, on_step=None if trace is None else trace.append)


def _reference(bundle, prompt, settings, trace=None):
    backend = FullSequenceBackend(bundle.model, prompt, settings.block_size, bundle.meta.prompt_block_size)
    return decode_blocks_host(backend, settings, bundle.mask_token_id, bundle.eos_token_id, None, ignore_eos=True,
                         on_step=None if trace is None else trace.append)


def test_mask_rule():
    ids = masks.block_ids(prompt_len=4, response_len=5, block_size=2, prompt_block_size=2)
    assert ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    vis = masks.visible(ids, ids)
    assert vis[0, 1] and not vis[1, 2]  # bidirectional inside a block, causal across blocks
    assert vis[5, 4] and vis[4, 5] and not vis[4, 6]
    causal = masks.block_ids(3, 0, 1, 1)
    assert torch.equal(masks.visible(causal, causal), torch.ones(3, 3, dtype=torch.bool).tril())
    add = masks.additive(vis)
    assert add.shape == (1, 1, 9, 9) and add[0, 0, 1, 2] < -1e30 and add[0, 0, 0, 1] == 0


@pytest.mark.parametrize("prompt_attention", ["block_causal", "causal"])
def test_cached_step_logits_match_full_forward(prompt_attention, road_image):
    from conftest import scaled_tiny

    bundle = scaled_tiny(prompt_attention=prompt_attention, trained_block_size=8)
    prompt = _prompt(bundle, road_image)
    settings = DecodeSettings(block_size=8, steps=8, max_new_tokens=24)
    reference = FullSequenceBackend(bundle.model, prompt, 8, bundle.meta.prompt_block_size)
    steps = []
    result = _cached(bundle, prompt, settings, steps)
    assert len(steps) >= 3 and len({t.offset for t in steps}) == 3
    prev = None
    for t in steps:
        fed = torch.full_like(t.block, bundle.mask_token_id) if t.step == 0 else prev
        committed = torch.tensor(result.tokens[: t.offset], dtype=torch.long)
        want = reference.logits(torch.cat([committed, fed]))[-len(fed):]
        assert (want - t.logits).abs().max().item() < LOGIT_TOL, (t.offset, t.step)
        prev = t.block


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "per-module"])
@pytest.mark.parametrize("n_clean", [0, 8])
def test_engine_layers_equal_the_transformers_modules_bit_for_bit(n_clean, stacked, scaled_bundle, road_image):
    """The lean layer loop (fused RMSNorm, one rotary call for queries and keys, no module wrappers; on the CPU the
    stacked q/k/v and gate/up projections, off it the modules' own) must not change a single bit in fp32:
    closed-loop scores logged before it stay reproducible."""
    prompt = _prompt(scaled_bundle, road_image)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        engine = DecoderEngine(scaled_bundle.model, prompt.length + 64)
        assert engine._fused is not None  # CPU, fp32, a small model
        if not stacked:
            engine._fused = None
        engine.prefill(prompt, scaled_bundle.meta.prompt_block_size)
        tokens = torch.randint(0, scaled_bundle.model.lm_head.weight.shape[0], (n_clean + 16,), generator=generator)
        pos = torch.arange(tokens.shape[0]) + engine.length
        engine.attention.plan(engine.length, tokens.shape[0], n_clean)
        lean = engine._layers(tokens, pos, n_clean, engine.attention)
        keys, values = engine.keys.clone(), engine.values.clone()
        oracle = module_layers(engine, tokens, pos, n_clean, engine.attention)
        assert lean.shape == (16, scaled_bundle.model.lm_head.weight.shape[0])
        assert torch.equal(lean, oracle)
        assert torch.equal(keys, engine.keys) and torch.equal(values, engine.values)


def test_stacked_projections_follow_the_weights(scaled_bundle):
    """Stacked once per model, rebuilt when a weight changes in place (a training step between two plans), and
    not at all where stacking could change the arithmetic (here: bf16)."""
    layers = copy.deepcopy(scaled_bundle.model.model.language_model.layers)
    cpu = torch.device("cpu")
    first = fused_layers(layers, cpu, torch.float32)
    assert first is not None and fused_layers(layers, cpu, torch.float32) is first
    attn = layers[1].self_attn
    with torch.no_grad():
        attn.k_proj.weight.mul_(2.0)
    second = fused_layers(layers, cpu, torch.float32)
    assert second is not first
    q_rows, k_rows = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    assert torch.equal(second[1].qkv[q_rows:q_rows + k_rows], attn.k_proj.weight)
    assert second[1].heads * attn.head_dim == q_rows and second[1].kv_heads * attn.head_dim == k_rows
    assert fused_layers(layers, cpu, torch.bfloat16) is None
    with torch.inference_mode():  # weights without a version counter: not stacked, nothing to go stale
        frozen = copy.deepcopy(layers)
        for p in frozen.parameters():
            p.data = p.data.clone()
    assert fused_layers(frozen, cpu, torch.float32) is None


def test_a_whole_decode_is_the_same_through_the_modules(scaled_bundle, road_image):
    prompt = _prompt(scaled_bundle, road_image)
    settings = DecodeSettings(block_size=8, steps=8, max_new_tokens=24)
    lean = _cached(scaled_bundle, prompt, settings)
    with modules_in_engine():
        assert DecoderEngine._layers is module_layers
        modules = _cached(scaled_bundle, prompt, settings)
    assert DecoderEngine._layers is not module_layers  # restored
    with unstacked_engines():
        assert DecoderEngine(scaled_bundle.model, 8)._fused is None
        unstacked = _cached(scaled_bundle, prompt, settings)
    assert DecoderEngine(scaled_bundle.model, 8)._fused is not None  # restored
    for other in (modules, unstacked):
        assert lean.tokens == other.tokens and lean.confidence == other.confidence
        assert lean.forward_calls == other.forward_calls


def _first_divergence_is_a_near_tie(a, b) -> bool:
    for x, y in zip(a, b):
        if torch.equal(x.fixed, y.fixed) and torch.equal(x.block, y.block):
            continue
        probs = torch.softmax(x.logits.float(), -1)
        top2 = probs.topk(2, -1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        conf = top2[:, 0].sort().values
        gap = (conf[1:] - conf[:-1]).min().item() if len(conf) > 1 else 1.0
        return min(margin, gap) < MARGIN_TOL
    return True


@pytest.mark.parametrize("block_size", [1, 4, 32])
@pytest.mark.parametrize("schedule", ["threshold", "static"])
def test_cached_decoder_matches_naive_reference(block_size, schedule, scaled_bundle, road_image):
    prompt = _prompt(scaled_bundle, road_image)
    steps = max(1, block_size // 4) if schedule == "static" else block_size
    settings = DecodeSettings(block_size=block_size, steps=steps, schedule=schedule, max_new_tokens=40)
    fast, slow = [], []
    cached = _cached(scaled_bundle, prompt, settings, fast)
    naive = _reference(scaled_bundle, prompt, settings, slow)
    if cached.tokens != naive.tokens:
        print("cached and naive decoders diverge; checking that the first divergence is a near tie")
        assert _first_divergence_is_a_near_tie(fast, slow)
    else:
        assert len(cached.tokens) == 40
        np.testing.assert_allclose(cached.confidence, naive.confidence, atol=1e-4)
    # cost accounting: one forward per step actually run (commits ride on the next block's first step)
    assert cached.forward_calls == sum(cached.steps_per_block)


def test_threshold_schedule_fixes_several_tokens_in_some_step(scaled_bundle, road_image):
    prompt = _prompt(scaled_bundle, road_image)
    trace = []
    result = _cached(scaled_bundle, prompt, DecodeSettings(block_size=32, steps=32, max_new_tokens=64), trace)
    fixed = [int(t.fixed.sum()) for t in trace]
    assert max(fixed) > 1 and min(fixed) >= 1
    assert 0.0 < min(result.confidence) and max(result.confidence) < 1.0
    assert result.forward_calls < 64


def test_unmask_rules():
    conf = torch.tensor([0.95, 0.5, 0.97, 0.2])
    masked = torch.tensor([True, True, False, True])
    assert unmask_confident(conf, masked, 0.9).tolist() == [True, False, False, False]
    # none passes: the single most confident masked position
    assert unmask_confident(conf, masked, 0.99).tolist() == [True, False, False, False]
    assert unmask_top_k(conf, masked, 2).tolist() == [True, True, False, False]
    assert unmask_top_k(conf, masked, 10).tolist() == [True, True, False, True]
    # one dispatch for the decoder and the training rollouts: static takes its step's count of tokens_per_step
    conf = torch.tensor([0.99, 0.3, 0.95, 0.2, 0.97, 0.5])
    masked = torch.tensor([False, True, True, False, True, True])
    assert unmask_step("threshold", conf, masked, 0.9, 0, 6).tolist() == [False, False, True, False, True, False]
    assert unmask_step("static", conf, masked, 0.9, 0, 2).tolist() == unmask_top_k(conf, masked, 3).tolist()
    assert unmask_step("static", conf, masked, 0.9, 5, 2).sum() == 3  # past T: the last step's count
    assert tokens_per_step(32, 4) == [8, 8, 8, 8]
    assert tokens_per_step(10, 4) == [3, 3, 2, 2]
    assert tokens_per_step(3, 8) == [1, 1, 1]


def test_eos_stops_after_its_block(scaled_bundle, road_image):
    prompt = _prompt(scaled_bundle, road_image)
    settings = DecodeSettings(block_size=4, steps=4, max_new_tokens=40)
    full = _cached(scaled_bundle, prompt, settings)
    eos = full.tokens[5]  # pretend the sixth token is EOS: decoding must stop after the second block
    engine = DecoderEngine(scaled_bundle.model, prompt.length + 64)
    engine.prefill(prompt, scaled_bundle.meta.prompt_block_size)
    result = decode_blocks_host(CachedBackend(engine), settings, scaled_bundle.mask_token_id, eos)
    assert result.tokens[-1] == eos and len(result.tokens) <= 8
    assert result.forward_calls == sum(result.steps_per_block)


@pytest.mark.parametrize(
    "kwargs", [dict(block_size=0), dict(steps=0), dict(threshold=0.0), dict(threshold=1.5),
               dict(schedule="random"), dict(schedule="prefix"), dict(max_new_tokens=0)]
)
def test_bad_decode_settings_are_refused(kwargs):
    with pytest.raises(DecodeSettingsError):
        DecodeSettings(**kwargs)
