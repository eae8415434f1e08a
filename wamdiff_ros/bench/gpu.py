"""GPU decode benchmark at Qwen3-VL-2B size: AR vs block diffusion, eager vs CUDA Graph, SDPA vs FlashInfer.

Model: Qwen3-VL-2B dimensions (``tiny.two_b_config``: text hidden 2048, 28 layers, 16 heads / 8 KV heads, head_dim
128, FFN 6144, vocab 151,936, tied embeddings, rope_theta 5e6, mrope_section [24, 20, 20]; vision depth 24, width
1024, FFN 4096, 16 heads, patch 16, temporal patch 2, spatial merge 2, out 2048, 48x48 position grid, deepstack
[5, 11, 17]) with random bf16 weights built on the GPU (no download). Prompt: the package's planning prompt and one
448x256 front image (112 image tokens), tokenized by the package's offline tokenizer (1,024 entries, all inside the
151,936-row vocabulary; its text part runs longer than Qwen's own tokenizer would make it).

Contenders, in one run, every plan = vision + prefill + N new tokens (EOS ignored), interleaved rounds after a
warm-up round: ``ar-eager`` (transformers ``generate``, greedy), ``ar-graph`` (the engine, one CUDA Graph replay per
token, static SDPA), and per block size B ``block-eager`` (the engine's eager SDPA path, as on the CPU),
``block-sdpa-graph`` and ``block-flashinfer-graph``; blocks use a static schedule of ``--tokens-per-step`` tokens
(ceil(B / t) steps per block, commits fused into the next block's first step). Reported per contender: ms per
decode forward, ms/token (decode time / tokens made by decode forwards: N - 1 for AR, whose first token comes from
the prefill; N for blocks), tokens/s, vision + prefill (one stage: the prefill runs the vision tower), plan latency
p50 / p99 (nearest rank over the rounds) and the speed-ups over AR eager and AR + graph (median of per-round
ms/token ratios, so drift shared by a round cancels).

Correctness first (``gpu_check.py``): before timing, each fast path's logits at a block's first step and at a
commit-fused first step are compared with the eager SDPA engine's from the identical cache, and the AR graph's first
step with the transformers forward; the tolerance follows the measured bf16 noise floor (the reference's distance
from an fp32 copy of the weights). A failing contender is reported and not timed. ``--tiny --device cpu`` runs the
same code on the tiny model (graphs off, FlashInfer skipped), for CI.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.gpu_check import CRITERION, check, probe_flashinfer
from wamdiff_ros.decoding.ar import decode_ar
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.host import CachedBackend, decode_blocks_host
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import PromptInputs, encode_prompt
from wamdiff_ros.model import DecodeMeta, ModelBundle, ensure_mask_token, tiny_random
from wamdiff_ros.provenance import cpu_name

BLOCK_SIZES = (4, 8, 16, 32)
IMAGE_WH = (448, 256)
TARGETS = {"ms_per_forward": 1.2, "ms_per_token": 0.5, "tokens_per_forward": 2.5, "x_ar_eager": 15.1,
           "x_ar_graph": 2.5, "plan_p99_ms": 50.0}  # the GPU fast path's targets, B=32 at 2B dimensions


@dataclass
class PlanTime:
    vision_prefill_s: float
    decode_s: float
    forwards: int
    decoded: int  # tokens made by decode forwards (AR: the first token comes from the prefill)
    tokens: list[int]


@dataclass
class Contender:
    name: str
    kind: str  # ar-eager | ar-graph | block-eager | block-graph
    block_size: int
    attention: str
    plan: Callable[[], PlanTime]


def _log(msg: str, t0: float = time.perf_counter()) -> None:
    print(f"[gpu-bench {time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


# -- model and prompt ---------------------------------------------------------------------------------------------
def build_bundle(tiny: bool, device: torch.device, seed: int = 0) -> ModelBundle:
    if tiny:
        return tiny_random(seed=seed, device=device, dtype=torch.float32)
    from transformers import Qwen3VLForConditionalGeneration

    from wamdiff_ros.tiny import tiny_image_processor, tiny_tokenizer, two_b_config

    tokenizer = copy.deepcopy(tiny_tokenizer())
    config = two_b_config(tokenizer)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(seed)
            model = Qwen3VLForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    meta = DecodeMeta()
    mask_id = ensure_mask_token(model, tokenizer, meta.mask_token)
    processor = tiny_image_processor(max_pixels=IMAGE_WH[0] * IMAGE_WH[1])
    return ModelBundle(model, tokenizer, processor, meta, mask_id, tokenizer.convert_tokens_to_ids(fmt.CHAT_END),
                       "qwen3-vl-2b-dims-random")


def make_prompt(bundle: ModelBundle) -> PromptInputs:
    from PIL import Image

    path = Path(__file__).resolve().parents[1] / "assets" / "sample_front.png"
    image = np.asarray(Image.open(path).convert("RGB").resize(IMAGE_WH))
    return encode_prompt(bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.2, 0.1), (0.3, -0.2)), image)


def _model_card(bundle: ModelBundle) -> dict:
    cfg = bundle.model.config
    t, v = cfg.text_config, cfg.vision_config
    return {
        "name": bundle.source, "dtype": str(bundle.model.dtype).removeprefix("torch."),
        "params": sum(p.numel() for p in bundle.model.parameters()),
        "text": {k: getattr(t, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size")},
        "vision": {k: getattr(v, k) for k in ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size",
                                              "spatial_merge_size", "out_hidden_size", "deepstack_visual_indexes")},
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", getattr(t, "tie_word_embeddings", False))),
    }


# -- plans --------------------------------------------------------------------------------------------------------
def hf_plan(bundle: ModelBundle, prompt: PromptInputs, n: int) -> PlanTime:
    eos = bundle.eos_token_id
    kwargs = dict(input_ids=prompt.input_ids, attention_mask=torch.ones_like(prompt.input_ids),
                  pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw,
                  mm_token_type_ids=prompt.mm_token_type_ids, do_sample=False, pad_token_id=eos, eos_token_id=eos)
    clock = _FirstTokenClock()  # the first token's time from the same run: two runs' difference can go negative

    def run():
        clock.start = time.perf_counter()
        return bundle.model.generate(**kwargs, max_new_tokens=n, min_new_tokens=n, streamer=clock)

    out, total_s = _timed(bundle.device, run)
    first_s = min(clock.first_s, total_s) if clock.first_s is not None else total_s
    return PlanTime(first_s, total_s - first_s, n - 1, n - 1, out[0, prompt.length:].tolist())


class _FirstTokenClock:
    """A ``generate`` streamer that notes when the first new token comes out (vision + prompt prefill and its
    token), from ``start``. generate() streams the prompt first, then each new token (on the host: synced)."""

    def __init__(self) -> None:
        self.start = 0.0
        self.first_s: float | None = None
        self._puts = 0

    def put(self, value) -> None:
        self._puts += 1
        if self._puts == 2:
            self.first_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def engine_plan(engine: DecoderEngine, prompt: PromptInputs, prompt_block_size: int, decode, ar: bool) -> PlanTime:
    first, prefill_s = _timed(engine.device, lambda: engine.prefill(prompt, prompt_block_size))
    result, decode_s = _timed(engine.device, lambda: decode(first))
    n = len(result.tokens)
    return PlanTime(prefill_s, decode_s, result.forward_calls, n - 1 if ar else n, result.tokens)


def block_settings(block_size: int, tokens_per_step: int, new_tokens: int) -> DecodeSettings:
    return DecodeSettings(block_size=block_size, steps=math.ceil(block_size / tokens_per_step), schedule="static",
                          max_new_tokens=new_tokens)


def make_contenders(bundle: ModelBundle, prompt: PromptInputs, args, sdpa: DecoderEngine,
                    runners: dict[str, GraphRunner]) -> list[Contender]:
    n, eos, mask_id, pbs = args.new_tokens, bundle.eos_token_id, bundle.mask_token_id, bundle.meta.prompt_block_size

    def ar_graphed(r: GraphRunner) -> PlanTime:
        return engine_plan(r.engine, prompt, 1, lambda first: decode_ar(r, first, n, eos, True), ar=True)

    def blocks_eager(s: DecodeSettings) -> PlanTime:
        backend = CachedBackend(sdpa)
        return engine_plan(sdpa, prompt, pbs, lambda _: decode_blocks_host(backend, s, mask_id, eos, None, True), False)

    def blocks_graphed(r: GraphRunner, s: DecodeSettings) -> PlanTime:
        return engine_plan(r.engine, prompt, pbs, lambda _: decode_blocks(r, s, eos, True), ar=False)

    out = [Contender("ar-eager", "ar-eager", 1, "sdpa", partial(hf_plan, bundle, prompt, n))]
    if "ar-graph" in runners:
        out.append(Contender("ar-graph", "ar-graph", 1, "sdpa", partial(ar_graphed, runners["ar-graph"])))
    for b in args.block_sizes:
        s = block_settings(b, args.tokens_per_step, n)
        out.append(Contender(f"block-eager-b{b}", "block-eager", b, "sdpa", partial(blocks_eager, s)))
        for name in ("block-sdpa-graph", "block-flashinfer-graph"):
            if name in runners:
                r = runners[name]
                out.append(Contender(f"{name}-b{b}", "block-graph", b, r.engine.graph_attention.name,
                                     partial(blocks_graphed, r, s)))
    return out


# -- statistics and report ----------------------------------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # nearest rank


def summarize(contenders: list[Contender], times: dict[str, list[PlanTime]]) -> dict:
    def per_token(name):
        return [p.decode_s / p.decoded for p in times[name]]

    stats = {}
    for c in contenders:
        plans = times.get(c.name)
        if not plans:
            continue
        p0 = plans[0]
        decode = statistics.median(p.decode_s for p in plans)
        e2e_ms = [1e3 * (p.vision_prefill_s + p.decode_s) for p in plans]
        mine = per_token(c.name)
        entry = {
            "kind": c.kind, "block_size": c.block_size, "attention": c.attention, "new_tokens": len(p0.tokens),
            "forwards": p0.forwards, "tokens_per_forward": p0.decoded / max(1, p0.forwards),
            "ms_per_forward": 1e3 * decode / max(1, p0.forwards), "ms_per_token": 1e3 * decode / p0.decoded,
            "tokens_per_s": p0.decoded / decode,
            "vision_prefill_ms": 1e3 * statistics.median(p.vision_prefill_s for p in plans),
            "plan_p50_ms": statistics.median(e2e_ms), "plan_p99_ms": _quantile(e2e_ms, 0.99), "runs": len(plans),
        }
        for base in ("ar-eager", "ar-graph"):
            if times.get(base):
                entry[f"x_{base.replace('-', '_')}"] = statistics.median(
                    a / b for a, b in zip(per_token(base), mine))
        stats[c.name] = entry
    return stats


def target_check(result: dict) -> dict | None:
    """The issue's B=32 targets against the fastest B=32 graph contender that passed its check."""
    rows = {k: v for k, v in result["contenders"].items() if v["kind"] == "block-graph" and v["block_size"] == 32}
    if not rows:
        return None
    name, s = min(rows.items(), key=lambda kv: kv[1]["ms_per_token"])
    t = TARGETS
    met = {
        "ms_per_forward": s["ms_per_forward"] <= t["ms_per_forward"],
        "ms_per_token": s["ms_per_token"] <= t["ms_per_token"] and s["tokens_per_forward"] >= t["tokens_per_forward"],
        "x_ar_eager": s.get("x_ar_eager", 0.0) >= t["x_ar_eager"],
        "x_ar_graph": s.get("x_ar_graph", 0.0) >= t["x_ar_graph"],
        "plan_p99_ms": s["plan_p99_ms"] <= t["plan_p99_ms"],
    }
    return {"contender": name, "targets": t, "met": met}


def table(result: dict) -> str:
    m, st = result["model"], result["settings"]
    lines = [
        f"GPU decode benchmark: {m['name']} ({m['params'] / 1e9:.2f} B params, {m['dtype']}) on {result['device']}; "
        f"{result['prompt']['tokens']}-token prompt (448x256 image), {st['new_tokens']} new tokens, "
        f"{st['tokens_per_step']} tokens/step (static), median of {st['runs']} rounds",
        "",
        "| contender | B | tokens/fwd | ms/fwd | ms/token | tokens/s | vision+prefill ms | plan p50 ms | plan p99 ms "
        "| x AR eager | x AR+graph | check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    checks = result["correctness"]["checks"]
    for name, s in result["contenders"].items():
        verdict = checks.get(name, {}).get("passed")
        mark = "reference" if verdict is None else ("pass" if verdict else "FAIL")
        lines.append(
            f"| {name} | {s['block_size']} | {s['tokens_per_forward']:.2f} | {s['ms_per_forward']:.2f} | "
            f"{s['ms_per_token']:.3f} | {s['tokens_per_s']:.0f} | {s['vision_prefill_ms']:.1f} | "
            f"{s['plan_p50_ms']:.1f} | {s['plan_p99_ms']:.1f} | {s.get('x_ar_eager', float('nan')):.2f} | "
            f"{s.get('x_ar_graph', float('nan')):.2f} | {mark} |")
    for name, why in result["skipped"].items():
        lines.append(f"| {name} | | | | | | | | | | | skipped: {why} |")
    for name, why in result["failed"].items():
        lines.append(f"| {name} | | | | | | | | | | | FAILED: {why} |")
    if not result["graphs"]["enabled"]:
        lines.append("graphs off (no CUDA): the *-graph contenders ran their graph-safe step code eagerly")
    note = result["attention"].get("note")
    lines += ["", f"attention: {result['attention']['flashinfer_engine']}" + (f" ({note})" if note else ""),
              f"correctness: {result['correctness']['criterion']}"]
    if result.get("targets"):
        tg = result["targets"]
        lines.append(f"B=32 targets ({tg['contender']}): " + ", ".join(f"{k} {'met' if v else 'missed'}"
                                                                      for k, v in tg["met"].items()))
    return "\n".join(lines)


# -- the run ------------------------------------------------------------------------------------------------------
def _write(result: dict, args) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


@torch.inference_mode()
def run(args) -> dict:
    device = torch.device(args.device)
    _log(f"building {'the tiny model' if args.tiny else 'a Qwen3-VL-2B-dimension model'} on {device}")
    bundle = build_bundle(args.tiny, device, args.seed)
    prompt = make_prompt(bundle)
    block_sizes = tuple(args.block_sizes)
    capacity = 64 * math.ceil((prompt.length + args.new_tokens + max(block_sizes)) / 64)
    import transformers

    result = {
        "benchmark": "gpu", "complete": False, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else cpu_name(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "cuda": torch.version.cuda},
        "model": _model_card(bundle),
        "prompt": {"tokens": prompt.length, "image_tokens": int(prompt.mm_token_type_ids.sum()), "image": IMAGE_WH,
                   "tokenizer": "package offline BPE (1,024 entries) inside the model's vocabulary"},
        "settings": {"new_tokens": args.new_tokens, "runs": args.runs, "tokens_per_step": args.tokens_per_step,
                     "block_sizes": list(block_sizes), "capacity": capacity,
                     "steps_per_block": {str(b): block_settings(b, args.tokens_per_step, 1).steps for b in block_sizes},
                     "prompt_attention": {"ar": "causal", "block": bundle.meta.prompt_attention}},
        "skipped": {}, "failed": {},
    }
    _write(result, args)  # partial results land early: the device script may be cut off by its timeout
    _log(f"prompt {prompt.length} tokens; capacity {capacity}; building engines and capturing graphs")
    sdpa = DecoderEngine(bundle.model, capacity, "sdpa")
    runners: dict[str, GraphRunner] = {}
    graphs_on = device.type == "cuda"
    pool = torch.cuda.graph_pool_handle() if graphs_on else None  # one pool for every captured graph
    try:
        r = GraphRunner(sdpa, bundle.mask_token_id, max_block=max(block_sizes), pool=pool)
        r.capture(block_sizes, ("static",), ar=True)
        runners["ar-graph"] = runners["block-sdpa-graph"] = r
    except Exception as exc:
        result["failed"]["sdpa graphs"] = f"{type(exc).__name__}: {exc}"
    fi = None if args.attention == "sdpa" else DecoderEngine(bundle.model, capacity, args.attention)
    reason = "not requested (--attention sdpa)" if fi is None else fi.attention_reason
    result["attention"] = {"requested": args.attention, "note": args.note, "flashinfer_engine": reason,
                           "flashinfer_runs": fi is not None and fi.attention.name == "flashinfer"}
    if fi is None:
        result["skipped"]["block-flashinfer-graph"] = "--attention sdpa"
    elif fi.attention.name != "flashinfer":
        result["skipped"]["block-flashinfer-graph"] = fi.attention_reason
    else:
        try:
            r = GraphRunner(fi, bundle.mask_token_id, max_block=max(block_sizes), pool=pool)
            r.capture(block_sizes, ("static",))
            runners["block-flashinfer-graph"] = r
        except Exception as exc:
            result["failed"]["block-flashinfer-graph"] = f"capture: {type(exc).__name__}: {exc}"
    result["graphs"] = {"enabled": graphs_on, "captured": {k: len(v.captured) for k, v in runners.items()}}
    _write(result, args)

    _log("correctness checks")
    checks = check(bundle, prompt, capacity, runners, block_sizes)
    result["correctness"] = {"criterion": CRITERION, "checks": checks}
    _write(result, args)
    contenders = []
    for c in make_contenders(bundle, prompt, args, sdpa, runners):
        if checks.get(c.name, {}).get("passed", True):  # the references (ar-eager, block-eager) have no check
            contenders.append(c)
        else:
            result["failed"][c.name] = "correctness check failed (not timed)"
    _log(f"timing {len(contenders)} contenders, {args.runs} rounds after a warm-up round")
    times: dict[str, list[PlanTime]] = {c.name: [] for c in contenders}
    vision: list[float] = []
    tokens0: dict[str, list[int]] = {}
    for round_ in range(args.runs + 1):
        _, v = _timed(device, lambda: bundle.model.model.get_image_features(
            prompt.pixel_values, prompt.image_grid_thw, return_dict=True))
        for c in list(contenders):
            try:
                plan = c.plan()
            except Exception as exc:
                result["failed"][c.name] = f"{type(exc).__name__}: {exc}"
                contenders.remove(c)
                times.pop(c.name, None)
                continue
            if len(plan.tokens) != args.new_tokens:
                raise RuntimeError(f"{c.name} produced {len(plan.tokens)} tokens, expected {args.new_tokens}")
            tokens0.setdefault(c.name, plan.tokens)
            if round_:
                times[c.name].append(plan)
        if round_:
            vision.append(v)
            result["contenders"] = summarize(contenders, times)
            _write(result, args)
        _log(f"round {round_}/{args.runs} done" + (" (warm-up)" if not round_ else ""))
    result["vision_ms"] = 1e3 * statistics.median(vision) if vision else None
    result["contenders"] = summarize(contenders, times)
    result["ar_agreement"] = _agreement(tokens0.get("ar-eager"), tokens0.get("ar-graph"))
    result["targets"] = None if args.tiny else target_check(result)
    result["complete"] = True
    return result


def _agreement(a: list[int] | None, b: list[int] | None) -> dict | None:
    """Greedy AR tokens of transformers generate vs the AR graph: index of the first difference (None: identical)."""
    if not a or not b:
        return None
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"tokens": len(a), "first_difference": first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench gpu", description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of the 2B-dimension one")
    p.add_argument("--device", default="cuda")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=8, help="timed rounds after one warm-up round (>= 1)")
    p.add_argument("--tokens-per-step", type=int, default=3, help="static schedule: tokens fixed per step")
    p.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES))
    p.add_argument("--attention", default="auto", choices=("auto", "sdpa", "flashinfer"),
                   help="attention of the FlashInfer contenders (sdpa: skip them); falls back with a reason")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON (also while running)")
    p.add_argument("--md", default=None, metavar="OUT", help="write the markdown table")
    p.add_argument("--note", default=None, help="recorded in the JSON beside the attention choice (device script)")
    p.add_argument("--probe-flashinfer", action="store_true",
                   help="only load FlashInfer's kernel and check it against SDPA (exit 0: usable, 3: not)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.probe_flashinfer:
        probe = probe_flashinfer(torch.device(args.device))
        text = json.dumps(probe, indent=2)
        print(text)
        if args.json:
            Path(args.json).write_text(text + "\n")
        return 0 if probe["ok"] else 3
    if args.runs < 1 or args.new_tokens < 2 or args.tokens_per_step < 1:
        p.error("--runs >= 1, --new-tokens >= 2 and --tokens-per-step >= 1 are required")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no GPU (use --tiny --device cpu for the CPU path)")
    result = run(args)
    _write(result, args)
    text = table(result)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    return 0
