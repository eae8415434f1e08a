"""Decode benchmark: AR vs block diffusion on the same model and prompt, in one run.

Every contender produces exactly N new tokens (EOS ignored) from the same prompt; contenders run in interleaved
rounds after a warm-up round. The table reports the median decode tokens/s, forward calls per token, and the
ratio to AR as the median of per-round ratios (each round's contenders ran back to back, so a shared machine's
drift cancels). The vocabulary constraint's cost is measured the same way: B=32 static with vs without, and the x
ordering rule's on top of it (constrained B=32 static with vs without the rule); and so is
the engine's lean layer loop: B=32 static through it vs through the transformers modules (``reference.py``), and
within it the CPU's stacked projections: B=32 static with vs without them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.reference import modules_in_engine, unstacked_engines
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.generate import generate
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import load
from wamdiff_ros.provenance import host_info

BLOCK_SIZES = (4, 8, 16, 32)


@dataclass
class Contender:
    name: str
    mode: str
    settings: DecodeSettings
    constrained: bool = False
    module_layers: bool = False  # the engine runs the transformers modules' layers (the reference arithmetic)
    unstacked: bool = False  # the lean loop with every projection its own matmul

    def context(self):
        if self.module_layers:
            return modules_in_engine()
        return unstacked_engines() if self.unstacked else contextlib.nullcontext()


def contenders(new_tokens: int, static_steps: int) -> list[Contender]:
    out = [Contender("ar", "ar", DecodeSettings(block_size=1, max_new_tokens=new_tokens))]
    for b in BLOCK_SIZES:
        out.append(Contender(f"block{b}", "block", DecodeSettings(
            block_size=b, steps=static_steps, schedule="static", max_new_tokens=new_tokens)))
        out.append(Contender(f"block{b}-threshold", "block", DecodeSettings(
            block_size=b, steps=b, schedule="threshold", max_new_tokens=new_tokens)))
    out.append(Contender("block32-constrained", "block", DecodeSettings(
        block_size=32, steps=static_steps, schedule="static", max_new_tokens=new_tokens), constrained=True))
    out.append(Contender("block32-modules", "block", DecodeSettings(
        block_size=32, steps=static_steps, schedule="static", max_new_tokens=new_tokens), module_layers=True))
    out.append(Contender("block32-unstacked", "block", DecodeSettings(
        block_size=32, steps=static_steps, schedule="static", max_new_tokens=new_tokens), unstacked=True))
    return out


def run(model: str, new_tokens: int, runs: int, static_steps: int, device: str, seed: int = 0) -> dict:
    bundle = load(model, device=device)
    image = np.random.default_rng(seed).integers(0, 256, (256, 512, 3), dtype=np.uint8)
    prompt = encode_prompt(bundle, fmt.plan_prompt(fmt.Command.FOLLOW, (8.0, 0.0), (0.0, 0.0)), image)
    vocab = bundle.model.get_output_embeddings().weight.shape[0]
    constraint = WaypointConstraint(bundle.tokenizer, bundle.eos_token_id, new_tokens, vocab,
                                    bundle.meta.format_version)
    entries = contenders(new_tokens, static_steps)
    times: dict[str, list[float]] = {c.name: [] for c in entries}
    calls: dict[str, int] = {}
    for round_ in tqdm(range(runs + 1), desc="decode bench", unit="round", file=sys.stderr):
        for c in entries:
            with c.context():
                g = generate(bundle, prompt, c.settings, constraint if c.constrained else None, mode=c.mode,
                             ignore_eos=True)
            if g.result.new_tokens != new_tokens:
                raise RuntimeError(f"{c.name} produced {g.result.new_tokens} tokens, expected {new_tokens}")
            calls[c.name] = g.result.forward_calls
            if round_ > 0:  # round 0 is the warm-up
                times[c.name].append(g.decode_s)
    stats = {}
    for c in entries:
        median = statistics.median(times[c.name])
        stats[c.name] = {
            "tokens_per_s": new_tokens / median,
            "forward_calls_per_token": calls[c.name] / new_tokens,
            "median_decode_s": median,
            "ratio_to_ar": _paired_ratio(times["ar"], times[c.name]),
        }
    cost = 1.0 - _paired_ratio(times["block32"], times["block32-constrained"])
    lean_speedup = _paired_ratio(times["block32-modules"], times["block32"])
    stacking_speedup = _paired_ratio(times["block32-unstacked"], times["block32"])
    return {
        "model": bundle.source,
        "device": device,
        "host": host_info(),
        "torch_threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "runs": runs,
        "static_steps_per_block": static_steps,
        "threshold": DecodeSettings().threshold,
        "prompt_tokens": prompt.length,
        "ar": stats["ar"],
        "block": {str(b): stats[f"block{b}"] for b in BLOCK_SIZES},
        "block_threshold": {str(b): stats[f"block{b}-threshold"] for b in BLOCK_SIZES},
        "constraint": {
            "unconstrained_tokens_per_s": stats["block32"]["tokens_per_s"],
            "constrained_tokens_per_s": stats["block32-constrained"]["tokens_per_s"],
            "cost": cost,
        },
        "layers": {
            "modules_tokens_per_s": stats["block32-modules"]["tokens_per_s"],
            "lean_tokens_per_s": stats["block32"]["tokens_per_s"],
            "speedup": lean_speedup,
            "unstacked_tokens_per_s": stats["block32-unstacked"]["tokens_per_s"],
            "stacking_speedup": stacking_speedup,
        },
    }


def _paired_ratio(base: list[float], other: list[float]) -> float:
    """Median over rounds of other's speed relative to base's (time ratio base / other)."""
    return statistics.median(b / o for b, o in zip(base, other))


def table(result: dict) -> str:
    rows = [("AR (next-token, KV cache)", result["ar"])]
    for b, s in result["block"].items():
        rows.append((f"B={b} static {result['static_steps_per_block']} steps/block", s))
    for b, s in result["block_threshold"].items():
        rows.append((f"B={b} threshold {result['threshold']:g}, T=B", s))
    lines = [
        f"decode benchmark: {result['model']} on {result['device']} ({result['torch_threads']} threads), "
        f"{result['prompt_tokens']}-token prompt, {result['new_tokens']} new tokens, median of {result['runs']} runs",
        f"| {'contender':<34} | {'tokens/s':>9} | {'fwd calls/token':>15} | {'x AR':>6} |",
        f"|{'-' * 36}|{'-' * 11}|{'-' * 17}|{'-' * 8}|",
    ]
    for name, s in rows:
        lines.append(f"| {name:<34} | {s['tokens_per_s']:9.1f} | {s['forward_calls_per_token']:15.3f} | "
                     f"{s['ratio_to_ar']:6.2f} |")
    c = result["constraint"]
    lines.append(f"vocabulary constraint (B=32 static): {c['unconstrained_tokens_per_s']:.1f} -> "
                 f"{c['constrained_tokens_per_s']:.1f} tokens/s (medians); paired cost {100 * c['cost']:.1f} %")
    layers = result["layers"]
    lines.append(f"engine layer loop (B=32 static): transformers modules {layers['modules_tokens_per_s']:.1f} -> lean "
                 f"{layers['lean_tokens_per_s']:.1f} tokens/s (medians); paired speed-up {layers['speedup']:.2f}x")
    lines.append(f"  of which stacked projections (B=32 static): one matmul each "
                 f"{layers['unstacked_tokens_per_s']:.1f} -> stacked {layers['lean_tokens_per_s']:.1f} tokens/s "
                 f"(medians); paired speed-up {layers['stacking_speedup']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="cpu")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=15, help="timed rounds after one warm-up (>= 5)")
    p.add_argument("--steps", type=int, default=4, help="static schedule: denoising steps per block")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON")
    args = p.parse_args(argv)
    if args.runs < 5:
        p.error("--runs must be >= 5")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args.model, args.new_tokens, args.runs, args.steps, args.device)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
