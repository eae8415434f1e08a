"""``wamdiff-train results {evaluate,render}``: training/RESULTS.md generated from logged JSON, never typed.

``evaluate`` runs the evaluations of the tiny hierarchy's checkpoints (``wamdiff-train eval`` and ``wamdiff-eval
closed-loop``, in process) and writes compact JSON logs into ``--out`` (training/results/, committed): runs.json,
open_loop.json, ablation.json, divergence.json, overlap.json, closed_loop.json. Every piece is resumable: an entry
already in its JSON, evaluated with the same settings on the same checkpoint, is kept (``--force`` redoes it); a run
folder that does not exist (yet) is logged as "not run" with the reason and retried next time, unless its entry is
done: that one was trained and evaluated on another machine and is kept as logged. ``render`` turns the
JSON into RESULTS.md (tables, bootstrap CIs, where we disagree with the paper) and l2_curve.png.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from wamdiff_training.evaluate_runs import evaluate_all
from wamdiff_training.paper import disagreements, render_disagreements
from wamdiff_training.render import (LOWSPEED, render_closed_loop, render_figure, render_fixed, render_lowspeed,
                                     render_open_loop, render_overlap, render_runs, write_figure)
from wamdiff_training.runs import (ABLATION, DEFAULT_THRESHOLD, DIVERGENCE, FIGURE, HEADER, PIECES, REDO_KEYS,
                                   ResultsError, load_pieces, read_json)

log = logging.getLogger("wamdiff_training")


def render(results: Path, out: Path, figure: Path | None = None) -> str:
    pieces = load_pieces(results)
    figure = figure or results / FIGURE
    written = write_figure(pieces["open_loop"], figure)
    link = os.path.relpath(written, out.parent) if written else None
    intro = "Tiny hierarchy on this package's own synthetic world (see training/README.md); B=32 at threshold " \
            f"{DEFAULT_THRESHOLD}, held-out test split."
    lines = ["# Results of the tiny hierarchy", "", HEADER, "", intro, ""]
    lines += render_open_loop(pieces["open_loop"])
    lines += render_fixed(pieces["ablation"], "ablation", "(b) Ablation (open loop, B=32)", ABLATION,
                          "From AR straight to B=32, then adding the curriculum, block distillation (Stage II) and "
                          "model distillation (Stage III); and Stage III from the AR teacher instead.")
    lines += render_fixed(pieces["divergence"], "divergence",
                          "(c) Stage III divergence: JSD vs forward KL vs reverse KL",
                          DIVERGENCE, "The same Stage III run with each divergence (teacher: teacher/distill).")
    lines += render_overlap(pieces["overlap"])
    lines += render_figure(pieces["open_loop"], link)
    lines += render_closed_loop(pieces["closed_loop"])
    lines += render_lowspeed(read_json(results / LOWSPEED))
    lines += render_runs(pieces["runs"])
    lines += render_disagreements(disagreements(pieces))
    text = "\n".join(lines).rstrip("\n") + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-train results", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("evaluate", help="evaluate the hierarchy's checkpoints into compact JSON (resumable, long)")
    e.add_argument("--root", default="out/tiny_hierarchy", help="the hierarchy's root folder (read only)")
    e.add_argument("--out", default="training/results", help="folder of the JSON logs (committed)")
    e.add_argument("--work", default="out/results", help="scratch: closed-loop reports, videos, the test subset")
    e.add_argument("--episodes", type=int, default=25, help="closed loop: held-out seeds per scenario (default 25: "
                   "100 episodes per planner and mode on the 4 frozen scenarios)")
    e.add_argument("--seed", type=int, default=1_000_000, help="closed loop: first seed (default: the test split)")
    e.add_argument("--workers", type=int, default=2, help="closed loop: worker processes")
    e.add_argument("--scenarios", default="all", help="closed loop: scenario names or all")
    e.add_argument("--scenario-file", default=None, help="closed loop: a scenario YAML instead of the frozen set")
    e.add_argument("--plan-hz", type=float, default=2.0,
                   help="closed loop: plan requests per second, every planner (default 2: the AR model's 100 "
                        "episodes x 2 modes fit a CPU session; wamdiff-eval's own default is 5)")
    e.add_argument("--blend-tau", type=float, default=0.0,
                   help="closed loop: the follower's plan blending (s), every planner (default 0: off, as the "
                        "committed logs; the gains file's default is for the product)")
    e.add_argument("--with-teacher", action="store_true", help="closed loop: also drive teacher/ar")
    e.add_argument("--max-samples", type=int, default=60, help="open loop: records per task (evenly spaced)")
    e.add_argument("--plan", default=None, help="the hierarchy plan behind --root: the runs' planned step counts, "
                   "and which run is each model's final AR model (its last DAgger round, if the plan has any); "
                   "without it the AR rows are <who>/ar")
    e.add_argument("--only", default=None, metavar="NAME,...", help=f"pieces to run, of {','.join(PIECES)}")
    e.add_argument("--force", action="store_true", help="evaluate again what the JSON already holds")
    e.add_argument("--redo", default=None, metavar="KEY,...",
                   help="closed loop: drive these planners again though their entries are current (say after a "
                        f"decoder speed-up: real time depends on it), keeping the rest; of {','.join(REDO_KEYS)}")
    r = sub.add_parser("render", help="write RESULTS.md (and the L2 figure) from the JSON logs")
    r.add_argument("--results", default="training/results", help="folder of the JSON logs")
    r.add_argument("--out", default="training/RESULTS.md")
    r.add_argument("--figure", default=None, help=f"the L2 figure (default <results>/{FIGURE})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s wamdiff-train: %(message)s", datefmt="%H:%M:%S")
    if args.command == "render":
        results = Path(args.results)
        if not results.is_dir():
            log.warning("results: %s does not exist: every section renders as not run", results)
        render(results, Path(args.out), Path(args.figure) if args.figure else None)
        print(f"wrote {args.out}")
        return 0
    if args.plan is None:
        from wamdiff_training.hierarchy import CONFIGS

        args.plan = str(CONFIGS / "tiny_hierarchy.yaml")
    try:
        done = evaluate_all(args)
    except ResultsError as exc:
        print(f"wamdiff-train results: error: {exc}", file=sys.stderr)
        return 2
    for name, what in done.items():
        print(f"{name:<12} {what}")
    return 0
