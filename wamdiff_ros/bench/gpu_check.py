"""Correctness of the fast decode paths before anything is timed (``wamdiff-bench gpu``), and the FlashInfer probe.

A fast path's logits are compared with its reference's from the identical state: a block's first step and a
commit-fused first step against the eager SDPA engine (same cache), the AR graph's first step against the
transformers forward over prompt + that token. The bf16 noise floor is measured, not assumed: the reference's own
distance from an fp32 copy of the same weights run from the same cache (or input). A fast path passes when
max |log_softmax(fast) - log_softmax(reference)| <= max(FLOOR_FACTOR x floor, ABS_TOL): a correct path differs
from the reference by rounding alone, which the floor bounds; a wrong mask, position or page table does not.
"""

from __future__ import annotations

import copy
import time

import torch

from wamdiff_ros.bench.reference import ar_step_logits, load_state, step_logits
from wamdiff_ros.decoding.attention import AttentionUnavailable, SdpaAttention, select_attention
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.inputs import PromptInputs
from wamdiff_ros.model import ModelBundle

ABS_TOL = 0.02  # nats: the tolerance never drops below this, whatever the measured floor
FLOOR_FACTOR = 3.0  # two independent roundings can sit on opposite sides of the exact value
PROBE_TOL = 0.02  # attention outputs are O(0.1-1); bf16 kernels differ by ~1e-3
CRITERION = (f"max |log_softmax(fast) - log_softmax(reference)| over all positions and the vocabulary <= "
             f"max({FLOOR_FACTOR} x bf16 floor, {ABS_TOL}); floor = the reference's distance from an fp32 copy of "
             f"the weights from the same cache; reference = eager SDPA engine (blocks), transformers forward (AR)")


def compare(fast: torch.Tensor, ref: torch.Tensor, oracle: torch.Tensor) -> dict:
    """Max |delta log-softmax| of fast vs reference, the reference's own bf16 floor vs the fp32 oracle, the verdict."""
    lf, lr, lo = (x.float().log_softmax(-1) for x in (fast, ref, oracle))
    err, floor = (lf - lr).abs().max().item(), (lr - lo).abs().max().item()
    tol = max(FLOOR_FACTOR * floor, ABS_TOL)
    return {"max_abs_logprob_diff": err, "bf16_floor": floor, "tolerance": tol,
            "fast_vs_fp32": (lf - lo).abs().max().item(),
            "top1_agreement": (lf.argmax(-1) == lr.argmax(-1)).float().mean().item(), "passed": err <= tol}


def _hf_last_logits(model, prompt: PromptInputs, token: torch.Tensor) -> torch.Tensor:
    """The transformers forward (causal) over prompt + ``token``: logits predicting the token after it."""
    ids = torch.cat([prompt.input_ids, token.view(1, 1)], dim=1)
    types = torch.cat([prompt.mm_token_type_ids, torch.zeros(1, 1, dtype=prompt.mm_token_type_ids.dtype,
                                                              device=ids.device)], dim=1)
    out = model(input_ids=ids, mm_token_type_ids=types, pixel_values=prompt.pixel_values,
                image_grid_thw=prompt.image_grid_thw, logits_to_keep=1)
    return out.logits[0, -1]


def check(bundle: ModelBundle, prompt: PromptInputs, capacity: int, runners: dict[str, GraphRunner],
          block_sizes: tuple[int, ...]) -> dict:
    """Logit checks of every fast path; returns {contender: {step: compare(...)}, ...} plus "passed" per contender."""
    model, mask_id = bundle.model, bundle.mask_token_id
    model32 = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
    base, ref, oracle = (DecoderEngine(m, capacity) for m in (model, model, model32))
    out: dict[str, dict] = {}
    base.prefill(prompt, bundle.meta.prompt_block_size)
    for b in block_sizes:
        masks = torch.full((b,), mask_id, dtype=torch.long, device=base.device)
        load_state(ref, base)
        ref_first = ref.forward(masks, commit=False)
        load_state(oracle, base)
        ora_first = oracle.forward(masks, commit=False)
        clean = ref_first.index_fill(-1, torch.tensor([mask_id], device=base.device), float("-inf")).argmax(-1)
        load_state(ref, base)
        ref_fused = ref.commit_and_step(clean, masks)
        load_state(oracle, base)
        ora_fused = oracle.commit_and_step(clean, masks)
        for name, runner in runners.items():
            if name == "ar-graph":
                continue
            load_state(runner.engine, base)
            first = step_logits(runner, b)
            load_state(runner.engine, base)
            fused = step_logits(runner, b, clean)
            steps = {"first_step": compare(first, ref_first, ora_first),
                     "after_commit": compare(fused, ref_fused, ora_fused)}
            out[f"{name}-b{b}"] = {**steps, "passed": all(s["passed"] for s in steps.values())}
    if "ar-graph" in runners:
        runner = runners["ar-graph"]
        first_logits = base.prefill(prompt, 1)
        token = first_logits.argmax(-1)
        ref_logits = _hf_last_logits(model, prompt, token)
        ora_logits = _hf_last_logits(model32, prompt, token)
        load_state(runner.engine, base)
        step = compare(ar_step_logits(runner, token), ref_logits, ora_logits)
        load_state(ref, base)
        eager = compare(ref.forward(token.view(1), commit=True), ref_logits, ora_logits)
        out["ar-graph"] = {"first_step_vs_transformers": step, "eager_engine_vs_transformers": eager,
                           "passed": step["passed"]}
    del model32, base, ref, oracle
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def probe_flashinfer(device: torch.device) -> dict:
    """Load FlashInfer's kernel for the 2B shapes (JIT-built on first use, then cached for the benchmark) and
    compare one plain and one commit-fused planned attention with SDPA on random bf16 data."""
    heads, kv_heads, dim, capacity = 16, 8, 128, 256
    t0 = time.perf_counter()
    try:
        backend, _, reason = select_attention(
            "flashinfer", scale=dim ** -0.5, capacity=capacity, heads=heads, kv_heads=kv_heads, head_dim=dim,
            dtype=torch.bfloat16, device=device, strict=True)
    except AttentionUnavailable as exc:
        return {"ok": False, "reason": str(exc)}
    gen = torch.Generator(device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

    keys, values = rand(1, kv_heads, capacity, dim), rand(1, kv_heads, capacity, dim)
    reference = SdpaAttention(dim ** -0.5, device)
    cases = {}
    try:
        for prefix, n, clean in ((100, 32, 0), (100, 64, 32), (200, 1, 0)):
            q = rand(1, heads, n, dim)
            backend.plan(prefix, n, clean)
            got = backend.run(q, keys, values)
            reference.plan(prefix, n, clean)
            want = reference.run(q, keys, values)
            cases[f"prefix{prefix}_n{n}_clean{clean}"] = (got.float() - want.float()).abs().max().item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        return {"ok": False, "reason": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
    return {"ok": all(d <= PROBE_TOL for d in cases.values()), "reason": reason, "max_abs_diff": cases,
            "tolerance": PROBE_TOL, "seconds": time.perf_counter() - t0}
