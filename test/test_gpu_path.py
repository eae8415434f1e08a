"""The GPU fast path, tested where it can be on a CPU: backend selection and fallback, the graph-safe attention and
FlashInfer's paged layout (against a plain-torch model of its documented contract) matching SDPA, the engine and
the graph runner's eager fallback returning the reference decoder's tokens, the GPU benchmark end to end on the
tiny model, and the device script's syntax. The tests that need CUDA (or FlashInfer) are skipped with the reason."""

import json
import logging
import math
import subprocess
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.reference import FullSequenceBackend, load_state, step_logits
from wamdiff_ros.decoding import attention as attn
from wamdiff_ros.decoding.ar import decode_ar, decode_ar_host
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.generate import generate
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.host import CachedBackend, decode_blocks_host
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (graphs, FlashInfer); this machine has none")


def _flashinfer_importable() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def _prompt(bundle, image):
    return encode_prompt(bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.2, 0.1), (0.3, -0.2)), image[::2, ::2])


def _capacity(prompt, settings, multiple=16):
    return multiple * math.ceil((prompt.length + settings.max_new_tokens + settings.block_size) / multiple)


def _select(requested, device="cpu", strict=False, dtype=torch.float32):
    return attn.select_attention(requested, scale=0.125, capacity=64, heads=4, kv_heads=2, head_dim=64, dtype=dtype,
                                 device=torch.device(device), strict=strict)


# -- backend selection -------------------------------------------------------------------------------------------
def test_auto_on_cpu_runs_sdpa_and_says_why_once(caplog, monkeypatch):
    monkeypatch.setattr(attn, "_logged", set())
    with caplog.at_level(logging.INFO, logger="wamdiff_ros"):
        eager, graph, reason = _select("auto")
        _select("auto")
    assert isinstance(eager, attn.SdpaAttention) and isinstance(graph, attn.StaticSdpaAttention)
    assert "fell back to sdpa" in reason and "cpu" in reason
    lines = [r.getMessage() for r in caplog.records if r.name == "wamdiff_ros"]
    assert lines == [f"attention backend: sdpa ({reason})"]


def test_flashinfer_without_cuda_falls_back_with_a_warning_or_raises_when_strict(caplog, monkeypatch):
    monkeypatch.setattr(attn, "_logged", set())
    with caplog.at_level(logging.INFO, logger="wamdiff_ros"):
        eager, _, reason = _select("flashinfer")
    assert eager.name == "sdpa" and "FlashInfer needs CUDA" in reason
    assert [r.levelno for r in caplog.records if r.name == "wamdiff_ros"] == [logging.WARNING]
    with pytest.raises(attn.AttentionUnavailable, match="needs CUDA"):
        _select("flashinfer", strict=True)
    with pytest.raises(ValueError, match="not one of"):
        _select("flash")


def test_engine_records_its_attention_choice(tiny_bundle):
    engine = DecoderEngine(tiny_bundle.model, 64, attention="auto")
    assert engine.attention.name == "sdpa" and "cpu" in engine.attention_reason
    assert DecoderEngine(tiny_bundle.model, 64).attention_reason == "requested"


# -- attention backends agree ------------------------------------------------------------------------------------
def _qkv(n, heads=4, kv_heads=2, dim=32, capacity=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, n, dim, generator=g), torch.randn(1, kv_heads, capacity, dim, generator=g),
            torch.randn(1, kv_heads, capacity, dim, generator=g))


@pytest.mark.parametrize("prefix,n,n_clean", [(40, 8, 0), (40, 16, 8), (0, 4, 0), (63, 1, 0), (48, 32, 16)])
def test_static_sdpa_matches_the_sliced_reference(prefix, n, n_clean):
    q, k, v = _qkv(n)
    ref = attn.SdpaAttention(32 ** -0.5, torch.device("cpu"))
    ref.plan(prefix, n, n_clean)
    static = attn.StaticSdpaAttention(32 ** -0.5, 96, 4, 2, torch.device("cpu"))
    static.plan(prefix, n, n_clean)
    static.begin(torch.arange(prefix, prefix + n), n_clean)
    torch.testing.assert_close(static.run(q, k, v), ref.run(q, k, v), atol=1e-5, rtol=1e-5)


class _FakePagedWrapper:
    """FlashInfer's documented paged-prefill contract in plain torch: HND pages ``[page, kv_head, entry, dim]``,
    request i = query rows ``qo_indptr[i]:qo_indptr[i+1]`` over pages ``indices[indptr[i]:indptr[i+1]]`` with
    ``kv_len = (pages - 1) * page_size + last_page_len``; ``causal=False``; q head h reads KV head h // group."""

    def __init__(self, workspace, layout, use_cuda_graph=False, backend="auto", qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None):
        assert layout == "HND" and use_cuda_graph
        self.batch = qo_indptr_buf.numel() - 1
        self.max_pages = paged_kv_indices_buf.numel()

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, heads, kv_heads, head_dim, page_size, *,
             causal, sm_scale, q_data_type, kv_data_type):
        assert not causal and len(qo_indptr) == self.batch + 1 and len(kv_indices) <= self.max_pages
        assert all(1 <= x <= page_size for x in last_page_len.tolist())
        self.qo, self.indptr, self.indices = qo_indptr.tolist(), kv_indptr.tolist(), kv_indices
        self.last, self.page_size, self.scale = last_page_len.tolist(), page_size, sm_scale

    def run(self, q, kv):
        k, v = kv
        assert k.shape[2] == self.page_size and q.shape[0] == self.qo[-1]
        out = []
        for i in range(self.batch):
            pages = self.indices[self.indptr[i]:self.indptr[i + 1]].long()
            kv_len = (len(pages) - 1) * self.page_size + self.last[i]
            kk, vv = (x[pages].transpose(0, 1).reshape(x.shape[1], -1, x.shape[3])[:, :kv_len] for x in (k, v))
            qq = q[self.qo[i]:self.qo[i + 1]].transpose(0, 1)
            o = F.scaled_dot_product_attention(qq[None], kk[None], vv[None], scale=self.scale, enable_gqa=True)
            out.append(o[0].transpose(0, 1))
        return torch.cat(out)


FAKE_FLASHINFER = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_FakePagedWrapper, __version__="fake")


def _fake_flashinfer(capacity, heads=4, kv_heads=2, dim=32, page_size=16):
    return attn.FlashInferAttention(FAKE_FLASHINFER, scale=dim ** -0.5, capacity=capacity, heads=heads,
                                    kv_heads=kv_heads, head_dim=dim, dtype=torch.float32, device=torch.device("cpu"),
                                    page_size=page_size)


@pytest.mark.parametrize("prefix,n,n_clean", [(40, 8, 0), (40, 16, 8), (0, 4, 0), (63, 1, 0), (48, 32, 16),
                                              (32, 16, 0), (31, 2, 1)])
def test_flashinfer_pages_and_fused_batch_match_sdpa(prefix, n, n_clean):
    """The page tables and the two-request fused commit that FlashInferAttention plans, read the way FlashInfer
    documents them, give exactly the reference attention (page boundaries included)."""
    q, k, v = _qkv(n)
    fi = _fake_flashinfer(96)
    assert (fi.page_size, fi.pages) == (16, 6)
    fi.plan(prefix, n, n_clean)
    ref = attn.SdpaAttention(32 ** -0.5, torch.device("cpu"))
    ref.plan(prefix, n, n_clean)
    torch.testing.assert_close(fi.run(q, k, v), ref.run(q, k, v), atol=1e-5, rtol=1e-5)
    assert _fake_flashinfer(90).page_size == 90  # a capacity that pages do not divide: one page


# -- the engine and the runner give the reference decoder's tokens ---------------------------------------------------
@pytest.mark.parametrize("block_size,steps,schedule", [(4, 4, "threshold"), (32, 8, "static")])
def test_sdpa_engine_through_the_interface_matches_the_full_sequence_reference(block_size, steps, schedule,
                                                                                scaled_bundle, road_image):
    prompt = _prompt(scaled_bundle, road_image)
    settings = DecodeSettings(block_size=block_size, steps=steps, schedule=schedule, max_new_tokens=40)
    engine = DecoderEngine(scaled_bundle.model, _capacity(prompt, settings), attention="sdpa")
    assert isinstance(engine.attention, attn.SdpaAttention)
    engine.prefill(prompt, scaled_bundle.meta.prompt_block_size)
    fast = decode_blocks_host(CachedBackend(engine), settings, scaled_bundle.mask_token_id, scaled_bundle.eos_token_id,
                         ignore_eos=True)
    reference = FullSequenceBackend(scaled_bundle.model, prompt, block_size, scaled_bundle.meta.prompt_block_size)
    slow = decode_blocks_host(reference, settings, scaled_bundle.mask_token_id, scaled_bundle.eos_token_id,
                         ignore_eos=True)
    assert fast.tokens == slow.tokens and len(fast.tokens) == 40
    assert max(abs(a - b) for a, b in zip(fast.confidence, slow.confidence)) < 1e-4


def test_ar_engine_matches_transformers_generate(tiny_bundle, road_image):
    prompt = _prompt(tiny_bundle, road_image)
    engine = DecoderEngine(tiny_bundle.model, prompt.length + 24, attention="sdpa")
    first = engine.prefill(prompt, 1)
    ours = decode_ar_host(engine, first, 20, tiny_bundle.eos_token_id, ignore_eos=True)
    eos = tiny_bundle.eos_token_id
    with torch.inference_mode():
        out = tiny_bundle.model.generate(
            input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
            pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw,
            mm_token_type_ids=prompt.mm_token_type_ids, do_sample=False, max_new_tokens=20, min_new_tokens=20,
            pad_token_id=eos, eos_token_id=eos)
    assert ours.tokens == out[0, prompt.length:].tolist()


@pytest.mark.parametrize("block_size,steps,schedule", [(4, 4, "threshold"), (32, 8, "static"), (8, 3, "static"),
                                                       (32, 32, "threshold")])
def test_graph_runner_falls_back_to_eager_on_cpu_with_the_same_tokens(block_size, steps, schedule, scaled_bundle,
                                                                      road_image):
    b = scaled_bundle
    prompt = _prompt(b, road_image)
    settings = DecodeSettings(block_size=block_size, steps=steps, schedule=schedule, max_new_tokens=40)
    capacity = _capacity(prompt, settings)
    runner = GraphRunner(DecoderEngine(b.model, capacity), b.mask_token_id, max_block=32)
    runner.capture((block_size,), (schedule,), ar=True)
    assert not runner.use_graphs and runner.captured == []
    reference = DecoderEngine(b.model, capacity)

    def both(eos, ignore_eos):
        reference.prefill(prompt, b.meta.prompt_block_size)
        want = decode_blocks_host(CachedBackend(reference), settings, b.mask_token_id, eos, ignore_eos=ignore_eos)
        runner.engine.prefill(prompt, b.meta.prompt_block_size)
        return want, decode_blocks(runner, settings, eos, ignore_eos=ignore_eos)

    want, got = both(b.eos_token_id, True)
    assert got.tokens == want.tokens and len(got.tokens) == 40
    assert max(abs(x - y) for x, y in zip(got.confidence, want.confidence)) < 1e-4
    if schedule == "static":
        assert got.forward_calls == want.forward_calls and got.steps_per_block == want.steps_per_block
    else:  # the host looks for "any mask left" every 2 steps: at most one extra (no-op) step per block
        assert want.forward_calls <= got.forward_calls <= want.forward_calls + len(got.steps_per_block)
    want_eos, got_eos = both(want.tokens[5], False)  # pretend the sixth token is EOS
    assert got_eos.tokens == want_eos.tokens and want_eos.tokens[-1] == want.tokens[5]
    first = reference.prefill(prompt, 1)
    want = decode_ar_host(reference, first, 30, b.eos_token_id, ignore_eos=True)
    first = runner.engine.prefill(prompt, 1)
    got = decode_ar(runner, first, 30, b.eos_token_id, ignore_eos=True)
    assert got.tokens == want.tokens and got.forward_calls == want.forward_calls == 29


def test_flashinfer_layout_decodes_the_same_tokens_in_the_engine(scaled_bundle, road_image):
    """The whole engine with FlashInfer's planning (paged prefix, fused commit as a 2-request batch) on the model of
    FlashInfer's contract: the same tokens as SDPA, eager and through the runner."""
    b = scaled_bundle
    prompt = _prompt(b, road_image)
    settings = DecodeSettings(block_size=8, steps=3, schedule="static", max_new_tokens=40)
    capacity = _capacity(prompt, settings)
    cfg = b.model.config.text_config
    engine = DecoderEngine(b.model, capacity)
    engine.attention = engine.graph_attention = _fake_flashinfer(
        capacity, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    reference = DecoderEngine(b.model, capacity)
    reference.prefill(prompt, b.meta.prompt_block_size)
    want = decode_blocks_host(CachedBackend(reference), settings, b.mask_token_id, b.eos_token_id, ignore_eos=True)
    engine.prefill(prompt, b.meta.prompt_block_size)
    eager = decode_blocks_host(CachedBackend(engine), settings, b.mask_token_id, b.eos_token_id, ignore_eos=True)
    engine.prefill(prompt, b.meta.prompt_block_size)
    graphed = decode_blocks(GraphRunner(engine, b.mask_token_id), settings, b.eos_token_id, ignore_eos=True)
    assert eager.tokens == graphed.tokens == want.tokens


def test_generate_with_a_runner_matches_generate_without(scaled_bundle, road_image):
    b = scaled_bundle
    prompt = _prompt(b, road_image)
    settings = DecodeSettings(block_size=16, steps=16, max_new_tokens=128)  # format 2's grammar needs >= 112
    runner = GraphRunner(DecoderEngine(b.model, _capacity(prompt, settings)), b.mask_token_id)
    plain = generate(b, prompt, settings, ignore_eos=True)
    fast = generate(b, prompt, settings, ignore_eos=True, runner=runner)
    assert fast.result.tokens == plain.result.tokens and fast.mode == "block"
    vocab = b.model.get_output_embeddings().weight.shape[0]
    constraint = WaypointConstraint(b.tokenizer, b.eos_token_id, settings.max_new_tokens, vocab, b.meta.format_version)
    constrained = generate(b, prompt, settings, constraint, ignore_eos=True)
    assert generate(b, prompt, settings, constraint, ignore_eos=True, runner=runner).result.tokens == \
        constrained.result.tokens  # a constraint takes the host-side loop on the runner's engine
    with pytest.raises(ValueError, match="cache holds"):
        generate(b, prompt, DecodeSettings(block_size=16, max_new_tokens=300), runner=runner)


# -- the benchmark and the device script ---------------------------------------------------------------------------
def test_hf_generate_plan_times_its_first_token_within_the_same_run(tiny_bundle):
    from wamdiff_ros.bench.gpu import hf_plan, make_prompt

    for _ in range(3):  # decode time = the run's total - its first token: never negative, whatever the noise
        t = hf_plan(tiny_bundle, make_prompt(tiny_bundle), 6)
        assert t.vision_prefill_s > 0 and t.decode_s > 0 and t.forwards == t.decoded == 5 and len(t.tokens) == 6


def test_gpu_bench_tiny_cpu_end_to_end(tmp_path):
    from wamdiff_ros.bench.__main__ import main

    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    assert main(["gpu", "--tiny", "--device", "cpu", "--runs", "1", "--new-tokens", "8", "--block-sizes", "4",
                 "--json", str(out), "--md", str(md)]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and not result["failed"]
    assert set(result["contenders"]) == {"ar-eager", "ar-graph", "block-eager-b4", "block-sdpa-graph-b4"}
    checks = result["correctness"]["checks"]
    assert set(checks) == {"ar-graph", "block-sdpa-graph-b4"} and all(c["passed"] for c in checks.values())
    step = checks["block-sdpa-graph-b4"]["after_commit"]
    assert step["max_abs_logprob_diff"] < 1e-4 and step["tolerance"] == 0.02 and step["top1_agreement"] == 1.0
    assert "cpu" in result["skipped"]["block-flashinfer-graph"] and not result["graphs"]["enabled"]
    s = result["contenders"]["block-eager-b4"]
    assert s["forwards"] == 4 and s["tokens_per_forward"] == 2.0 and s["x_ar_eager"] > 0  # B=4, 3/step -> 2 steps
    assert result["ar_agreement"] == {"tokens": 8, "first_difference": None}
    assert "| block-sdpa-graph-b4 | 4 |" in md.read_text()


def test_flashinfer_probe_reports_why_it_cannot_run_on_cpu(capsys):
    from wamdiff_ros.bench.gpu import main

    assert main(["--probe-flashinfer", "--device", "cpu"]) == 3
    assert "needs CUDA" in json.loads(capsys.readouterr().out)["reason"]


def test_device_script_parses_and_names_its_fallback():
    script = ROOT / "tools" / "gpu_bundle" / "device_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "set -o pipefail" in text or "set -u -o pipefail" in text
    assert "PYTHONUNBUFFERED=1" in text and "gpu_bench.json" in text and "gpu_bench.md" in text
    assert "--attention sdpa" in text and "fall" in text.lower()  # SDPA + CUDA Graph when FlashInfer cannot load
    assert "build/gpu_carry" in text
    assert "wamdiff_ros.bench plan --model random-2b --device cuda --dtype bfloat16" in text  # Planner.plan, 2B


# -- GPU only --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_bundle():
    from wamdiff_ros.model import tiny_random

    return tiny_random(device="cuda", dtype=torch.bfloat16)


def _graph_vs_eager(bundle, image, attention):
    prompt = _prompt(bundle, image)
    settings = DecodeSettings(block_size=8, steps=3, schedule="static", max_new_tokens=24)
    capacity = _capacity(prompt, settings, 64)
    runner = GraphRunner(DecoderEngine(bundle.model, capacity, attention, strict=True), bundle.mask_token_id)
    runner.capture((8,), ("static",), ar=attention == "sdpa")
    reference = DecoderEngine(bundle.model, capacity)
    reference.prefill(prompt, bundle.meta.prompt_block_size)
    masks = torch.full((8,), bundle.mask_token_id, device="cuda")
    with torch.inference_mode():
        load_state(runner.engine, reference)
        fast = step_logits(runner, 8)
        want = reference.forward(masks, commit=False)
        clean = want.argmax(-1)
        load_state(runner.engine, reference)
        fast_fused = step_logits(runner, 8, clean)
        want_fused = reference.commit_and_step(clean, masks)
    for got, ref in ((fast, want), (fast_fused, want_fused)):
        diff = (got.float().log_softmax(-1) - ref.float().log_softmax(-1)).abs().max().item()
        assert diff < 0.05, diff  # bf16, 4 layers: kernel-order rounding only
    return runner


@needs_cuda
def test_sdpa_graphs_match_eager_on_gpu(cuda_bundle, road_image):
    runner = _graph_vs_eager(cuda_bundle, road_image, "sdpa")
    assert ("ar",) in runner.captured and (8, 8, "static", False) in runner.captured


@needs_cuda
@pytest.mark.skipif(not _flashinfer_importable(), reason="flashinfer is not importable here (pip install .[gpu])")
def test_flashinfer_graphs_match_eager_on_gpu(cuda_bundle, road_image):
    runner = _graph_vs_eager(cuda_bundle, road_image, "flashinfer")
    assert runner.engine.attention.name == "flashinfer"


@needs_cuda
def test_graphed_decode_matches_eager_tokens_on_gpu(road_image):
    from wamdiff_ros.model import tiny_random

    b = tiny_random(device="cuda", dtype=torch.float32)
    prompt = _prompt(b, road_image)
    settings = DecodeSettings(block_size=8, steps=3, schedule="static", max_new_tokens=28)  # a short last block
    capacity = _capacity(prompt, settings, 64)
    runner = GraphRunner(DecoderEngine(b.model, capacity), b.mask_token_id)
    runner.capture((8,), ("static",), ar=True)
    reference = DecoderEngine(b.model, capacity)
    reference.prefill(prompt, b.meta.prompt_block_size)
    want = decode_blocks_host(CachedBackend(reference), settings, b.mask_token_id, b.eos_token_id, ignore_eos=True)
    runner.engine.prefill(prompt, b.meta.prompt_block_size)
    got = decode_blocks(runner, settings, b.eos_token_id, ignore_eos=True)
    assert got.tokens == want.tokens and got.forward_calls == want.forward_calls
    with pytest.raises(RuntimeError, match="before the prefill"):
        runner.capture((4,))


def test_bf16_check_measures_a_floor_and_passes_the_graph_safe_path():
    """The benchmark's correctness check on a bf16 tiny model (CPU): the fp32 oracle is a copy of the weights, the
    floor is the bf16 reference's own distance from it, and the graph-safe SDPA path passes within it."""
    from wamdiff_ros.bench.gpu import make_prompt
    from wamdiff_ros.bench.gpu_check import check
    from wamdiff_ros.model import tiny_random

    b = tiny_random(dtype=torch.bfloat16)
    prompt = make_prompt(b)
    capacity = 64 * math.ceil((prompt.length + 16) / 64)
    runner = GraphRunner(DecoderEngine(b.model, capacity), b.mask_token_id)
    with torch.inference_mode():
        checks = check(b, prompt, capacity, {"ar-graph": runner, "block-sdpa-graph": runner}, (4, 8))
    assert set(checks) == {"block-sdpa-graph-b4", "block-sdpa-graph-b8", "ar-graph"}
    assert all(c["passed"] for c in checks.values())
    step = checks["block-sdpa-graph-b8"]["after_commit"]
    assert 0 < step["bf16_floor"] < 0.05 and step["max_abs_logprob_diff"] <= step["tolerance"]
    assert b.model.dtype == torch.bfloat16  # the oracle was a copy
