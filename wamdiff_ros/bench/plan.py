"""``wamdiff-bench plan``: ``Planner.plan`` end to end (vision, prefill, decode, parse) on the same weights decoded
autoregressively and as blocks, in one run; p50 / p99 per plan, forward calls per answer token, the ratio.

Both contenders are ``Planner`` objects over one loaded checkpoint and take the same path the node takes (the decode
engine and its graph runner: CUDA Graphs and FlashInfer on a GPU, eager SDPA on the CPU; the plan grammar on). The
AR contender decodes the same weights next-token (``decode_mode = "ar"``): the paper's baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
try:
    from tqdm import tqdm
except ImportError:  # the GPU machine's bare Python
    def tqdm(iterable, **_):
        return iterable

from wamdiff_ros.cli import load_rgb, sample_image_path
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.model import load, torch_dtype
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_ros.provenance import host_info


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


RANDOM_2B = "random-2b"  # ``gpu.build_bundle``: Qwen3-VL-2B dimensions, random bf16 weights, built in memory


def run(model: str, runs: int, device: str, dtype: torch.dtype | None = None) -> dict:
    if model == RANDOM_2B:
        from wamdiff_ros.bench.gpu import build_bundle

        bundle = build_bundle(False, torch.device(device))
    else:
        bundle = load(model, device=device, dtype=dtype)
    block = DecodeSettings(block_size=min(DecodeSettings().block_size, bundle.meta.trained_block_size))
    ar = Planner(bundle, DecodeSettings(block_size=1))
    ar.decode_mode = "ar"
    contenders = {"ar": ar, "block": Planner(bundle, block)}
    image, ego = load_rgb(sample_image_path()), EgoState((6.0, 0.0))
    route = np.array([[10.0, 0.0], [30.0, 0.0]])
    times: dict[str, list[float]] = {name: [] for name in contenders}
    calls: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in tqdm(range(runs + 1), desc="plan bench", unit="round", file=sys.stderr):
        for name, planner in contenders.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            plan = planner.plan(image, ego, "follow", route=route)
            elapsed = time.perf_counter() - t0
            if round_ > 0:  # round 0 warms up (and on a GPU captures nothing new)
                times[name].append(elapsed)
                calls[name].append(plan.stats.forward_calls / max(plan.stats.new_tokens, 1))
    out = {"model": bundle.source, "device": device, "dtype": str(bundle.model.dtype), "runs": runs,
           "host": host_info(), "torch_threads": torch.get_num_threads()}
    for name, planner in contenders.items():
        out[name] = {"p50_ms": 1e3 * _percentile(times[name], 50), "p99_ms": 1e3 * _percentile(times[name], 99),
                     "forward_calls_per_token": statistics.mean(calls[name]), "decode_path": planner.backend,
                     "block_size": planner.settings.block_size}
    out["ratio_p50"] = out["ar"]["p50_ms"] / out["block"]["p50_ms"]
    return out


def table(result: dict) -> str:
    lines = [f"plan benchmark: {result['model']} on {result['device']} ({result['dtype']}), Planner.plan end to end "
             f"(vision, prefill, decode, parse), {result['runs']} plans each",
             f"| {'contender':<26} | {'p50 ms':>8} | {'p99 ms':>8} | {'fwd calls/token':>15} |",
             f"|{'-' * 28}|{'-' * 10}|{'-' * 10}|{'-' * 17}|"]
    for name, label in (("ar", "AR (next-token)"), ("block", f"block B={result['block']['block_size']}")):
        r = result[name]
        lines.append(f"| {label:<26} | {r['p50_ms']:8.1f} | {r['p99_ms']:8.1f} | "
                     f"{r['forward_calls_per_token']:15.3f} |")
    lines.append(f"decode path: {result['block']['decode_path']}")
    lines.append(f"block vs AR, p50 per plan: {result['ratio_p50']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench plan", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"a model (as wamdiff-plan takes), or {RANDOM_2B}: "
                   "Qwen3-VL-2B's dimensions with random bf16 weights, built in memory (the GPU check)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args.model, args.runs, args.device, torch_dtype(args.dtype))
    print(table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
