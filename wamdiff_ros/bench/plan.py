"""``wamdiff-bench plan``: ``Planner.plan`` end to end on the same weights decoded autoregressively, as blocks through
the planner's runner and as blocks through the host loop, interleaved plan by plan; per contender p50 / p99 per plan,
forward calls per token, minor page faults per plan, decode ms per forward, and the preprocessing, vision and prefill
times beside them.

The contenders (``plan_contenders.py``) take the path the node takes: ``Planner`` objects over one loaded checkpoint
(the decode engine and its ``GraphRunner``: CUDA Graphs and FlashInfer on a GPU, the same step eagerly with SDPA on
the CPU). ``ar`` decodes the same weights next-token (the paper's baseline); ``block`` is the planner's own block
decode; ``host`` is the same plan through the host loop (``decode_blocks_host`` on the planner's engine), the
fallback the runner must beat (on the CPU by default; ``--contenders`` elsewhere). The plan grammar is on where it
runs inside the runner's step (fixed width); a free-width checkpoint (WAM-Diff2's) would send the block planner to
the host loop, so there the contenders decode unconstrained (``--grammar``; the table says which).

Any folder or name (``--model``), or ``--fixture wam_diff2-small``: the WAM-Diff2-layout folder with Qwen's real
151,936-row vocabulary at a tiny width (``wamdiff-bench fixture --layout wam_diff2 --size small``, written once into
``out/fixtures/``): the real-vocabulary case, where a step's (block x vocabulary) work dominates. Minor page faults
are ``getrusage`` deltas around each plan in the process that ran it. The prefill runs the prompt through the full
model and computes logits for its last position only (``logits_to_keep=1``, ``DecoderEngine.prefill``).

``--baseline-worktree DIR`` times another checkout of the package in the same run (say ``git worktree add
/tmp/old <commit>``): this tree and that one each run the contenders in a worker process of their own
(``plan_contenders.py`` with ``wamdiff_ros`` imported from the tree), and every contender's plan alternates between
them (which side goes first alternates by round), so both see the same machine at the same time; the table adds
the baseline's rows, the speed-ups and whether both answered the same text.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

try:
    from tqdm import tqdm
except ImportError:  # the GPU machine's bare Python
    def tqdm(iterable, **_):
        return iterable

import wamdiff_ros
from wamdiff_ros.bench import plan_contenders
from wamdiff_ros.bench.plan_contenders import CONTENDERS, GRAMMAR_CHOICES, RANDOM_2B, Contenders
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES
from wamdiff_ros.provenance import host_info

FIXTURES = {"wam_diff2-small": ("wam_diff2", "small")}  # name -> wamdiff-bench fixture's (layout, size)
FIXTURE_ROOT = Path("out") / "fixtures"
LABELS = {"ar": "AR (next-token)", "block": "block B={B}, runner", "host": "block B={B}, host loop"}
THIS_TREE = Path(wamdiff_ros.__file__).resolve().parents[1]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def fixture_folder(name: str, root: Path | None = None) -> Path:
    """The folder of fixture ``name`` under ``root`` (default ``FIXTURE_ROOT``), written on first use (about 30 MB;
    seeded, so the same weights each time)."""
    if name not in FIXTURES:
        raise ValueError(f"fixture {name!r} is not one of {sorted(FIXTURES)}")
    folder = Path(FIXTURE_ROOT if root is None else root) / name
    if not (folder / "config.json").is_file():
        from wamdiff_ros.bench.fixture import write_fixture

        layout, size = FIXTURES[name]
        print(f"writing the {name} fixture to {folder}", file=sys.stderr)
        write_fixture(folder, layout, size)
    return folder.resolve()


class _Local:
    """The contenders in this process."""

    def __init__(self, args: dict) -> None:
        self._contenders = Contenders(**args)
        self.info = {**self._contenders.info, "tree": str(THIS_TREE), "process": "this one"}

    def plan(self, name: str) -> dict:
        return self._contenders.plan(name)

    def close(self) -> None:
        self._contenders.close()


class _Worker:
    """The contenders in a worker process with ``wamdiff_ros`` imported from the checkout ``tree``."""

    def __init__(self, tree: Path, args: dict, log: Path) -> None:
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)  # the tree comes first on sys.path, nothing else of ours
        with open(log, "w") as err:
            self._proc = subprocess.Popen([sys.executable, plan_contenders.__file__, str(tree)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        info = self._ask({"op": "setup", "args": args})["info"]
        if Path(info["package"]).resolve().parents[1] != Path(tree).resolve():
            raise RuntimeError(f"the worker for {tree} imported wamdiff_ros from {info['package']}")
        self.info = {**info, "process": "a worker", "commit": _commit(tree)}

    def _ask(self, request: dict) -> dict:
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        answer = json.loads(line) if line else {"ok": False, "error": "the worker exited"}
        if not answer["ok"]:
            tail = "\n".join(self.log.read_text().splitlines()[-15:])
            raise RuntimeError(f"plan worker ({self.log}): {answer['error']}\n{tail}")
        return answer

    def plan(self, name: str) -> dict:
        return self._ask({"op": "plan", "name": name})["plan"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def _commit(tree: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _summary(samples: list[dict], name: str, block_size: int, decode_path: str) -> dict:
    ms = [s["ms"] for s in samples]
    per_forward = [s["decode_ms"] / s["forward_calls"] for s in samples if s["forward_calls"]]
    return {
        "p50_ms": _percentile(ms, 50), "p99_ms": _percentile(ms, 99),
        "forward_calls_per_token": statistics.mean(s["forward_calls"] / max(s["new_tokens"], 1) for s in samples),
        "minor_faults_per_plan": statistics.mean(s["minor_faults"] for s in samples),
        "minor_faults_max": max(s["minor_faults"] for s in samples),
        "decode_ms_per_forward": statistics.median(per_forward) if per_forward else 0.0,
        **{f"{k}_p50": _percentile([s[k] for s in samples], 50)
           for k in ("preprocess_ms", "vision_ms", "prefill_ms", "decode_ms")},
        "new_tokens": statistics.mean(s["new_tokens"] for s in samples),
        "texts": sorted({s["text"] for s in samples}),
        "decode_path": decode_path, "block_size": 1 if name == "ar" else block_size,
    }


def run(model: str, runs: int, device: str = "cpu", dtype: str = "auto", contenders: tuple[str, ...] | None = None,
        grammar: str = "auto", threads: int = 0, baseline: str | None = None) -> dict:
    """``runs`` measured rounds after one warm-up round; each round plans once per contender (per side, with a
    ``baseline`` checkout: this tree and that one alternating, each in its own worker process)."""
    names = contenders or (CONTENDERS if device == "cpu" else ("ar", "block"))
    if Path(model).exists():  # a folder: the same one for a worker wherever it runs
        model = str(Path(model).resolve())
    args = {"model": model, "device": device, "dtype": dtype, "names": tuple(names), "grammar": grammar,
            "threads": threads}
    sides: dict[str, object] = {}
    logs = Path(tempfile.mkdtemp(prefix="wamdiff-bench-plan-"))
    try:
        if baseline is None:
            sides["this"] = _Local(args)
        else:
            sides["this"] = _Worker(THIS_TREE, args, logs / "this.log")
            sides["baseline"] = _Worker(Path(baseline).resolve(), args, logs / "baseline.log")
        samples = {side: {name: [] for name in names} for side in sides}
        order = list(sides)
        for round_ in tqdm(range(runs + 1), desc="plan bench", unit="round", file=sys.stderr):
            for name in names:
                for side in (order if round_ % 2 == 0 else order[::-1]):
                    measured = sides[side].plan(name)
                    if round_ > 0:  # round 0 warms up (on a GPU it captures nothing new)
                        samples[side][name].append(measured)
    finally:
        for side in sides.values():
            side.close()
    info = sides["this"].info
    out = {"model": info["model"], "device": device, "dtype": info["dtype"], "runs": runs, "grammar": info["grammar"],
           "vocab": info["vocab"], "host": host_info(), "torch_threads": info["torch_threads"],
           "contenders": list(names), "tree": info["tree"]}
    for side, per_name in samples.items():
        side_info = sides[side].info
        results = {name: _summary(per_name[name], name, side_info["block_size"], side_info["decode_path"][name])
                   for name in names}
        if side == "this":
            out.update(results)
        else:
            out["baseline"] = {"tree": side_info["tree"], "commit": side_info.get("commit"), **results}
    if "ar" in names and "block" in names:
        out["ratio_p50"] = out["ar"]["p50_ms"] / out["block"]["p50_ms"]
    if "host" in names and "block" in names:
        out["host_vs_block_p50"] = out["host"]["p50_ms"] / out["block"]["p50_ms"]
    if baseline is not None:
        base = out["baseline"]
        out["vs_baseline"] = {name: {
            "p50_speedup": base[name]["p50_ms"] / out[name]["p50_ms"],
            "faults_ratio": (out[name]["minor_faults_per_plan"] / base[name]["minor_faults_per_plan"]
                             if base[name]["minor_faults_per_plan"] else None),
            "same_text": out[name]["texts"] == base[name]["texts"],
        } for name in names}
    return out


def table(result: dict) -> str:
    b = result.get("block", result.get("host", {})).get("block_size", 32)
    lines = [f"plan benchmark: {result['model']} on {result['device']} ({result['dtype']}, V = {result['vocab']}, "
             f"{result['torch_threads']} torch threads), Planner.plan end to end, {result['runs']} plans per contender"
             f" interleaved; grammar {result['grammar']}",
             f"| {'contender':<42} | {'p50 ms':>8} | {'p99 ms':>8} | {'fwd/token':>9} | {'faults/plan':>11} | "
             f"{'ms/forward':>10} | {'prep ms':>7} | {'vision ms':>9} | {'prefill ms':>10} |",
             f"|{'-' * 44}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 13}|{'-' * 12}|{'-' * 9}|{'-' * 11}|{'-' * 12}|"]
    sides = [("", result)]
    if "baseline" in result:
        sides.append((f" [baseline {result['baseline'].get('commit') or result['baseline']['tree']}]",
                      result["baseline"]))
    for name in result["contenders"]:
        for suffix, side in sides:
            r = side[name]
            label = LABELS[name].format(B=b) + suffix
            lines.append(f"| {label:<42} | {r['p50_ms']:8.1f} | {r['p99_ms']:8.1f} | "
                         f"{r['forward_calls_per_token']:9.3f} | {r['minor_faults_per_plan']:11.0f} | "
                         f"{r['decode_ms_per_forward']:10.2f} | {r['preprocess_ms_p50']:7.1f} | "
                         f"{r['vision_ms_p50']:9.1f} | {r['prefill_ms_p50']:10.1f} |")
    if "block" in result:
        lines.append(f"decode path: {result['block']['decode_path']}")
    lines.append("prep: the prompt and image preprocessing (encode_prompt); prefill: the prompt through the full "
                 "model, logits for its last position only; faults: minor page faults per plan (getrusage); "
                 "ms/forward: decode time per forward call (p50)")
    if "ratio_p50" in result:
        lines.append(f"block vs AR, p50 per plan: {result['ratio_p50']:.2f}x")
    if "host_vs_block_p50" in result:
        lines.append(f"block through the runner vs the host loop, p50 per plan: {result['host_vs_block_p50']:.2f}x")
    for name, v in result.get("vs_baseline", {}).items():
        faults = "n/a (baseline 0)" if v["faults_ratio"] is None else f"{100 * v['faults_ratio']:.1f} %"
        lines.append(f"{LABELS[name].format(B=b)} vs the baseline: {v['p50_speedup']:.2f}x at p50, faults "
                     f"{faults} of the baseline's, same text: {'yes' if v['same_text'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench plan", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help=f"a model (as wamdiff-plan takes: a folder or a name; default "
                   f"{DEFAULT_MODEL}), or {RANDOM_2B}: Qwen3-VL-2B's dimensions with random bf16 weights, built in "
                   "memory (the GPU check)")
    p.add_argument("--fixture", choices=sorted(FIXTURES), default=None,
                   help=f"a checkpoint folder in a real layout instead of --model (written once into {FIXTURE_ROOT})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--contenders", default=None,
                   help=f"comma-separated, of {','.join(CONTENDERS)} (default: all on the CPU, ar,block elsewhere)")
    p.add_argument("--grammar", choices=GRAMMAR_CHOICES, default="auto",
                   help="the plan grammar: auto = on where it runs in the runner's step, else off")
    p.add_argument("--baseline-worktree", default=None, metavar="DIR",
                   help="also time the package checked out in DIR (e.g. a git worktree of an older commit), "
                   "interleaved plan by plan, each side in a worker process")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    args = p.parse_args(argv)
    if args.model and args.fixture:
        p.error("--model and --fixture name the checkpoint twice")
    model = str(fixture_folder(args.fixture)) if args.fixture else args.model or DEFAULT_MODEL
    contenders = tuple(args.contenders.split(",")) if args.contenders else None
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(model, args.runs, args.device, args.dtype, contenders, args.grammar, args.threads,
                 args.baseline_worktree)
    print(table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
