"""``wamdiff-train probe lane``: does the model's plan follow its pose in the lane (``wamdiff_training.world.
lane_probe``). ``wamdiff-train probe lead``: does it slow down for slower traffic ahead (``wamdiff_training.world.
lead_probe``). ``wamdiff-train trace``: one closed-loop episode with the expert's plan beside the model's at every plan
time (``wamdiff_training.world.trace``)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from wamdiff_ros.cli import add_decode_settings_args, decode_overrides
from wamdiff_ros.model_names import DEFAULT_MODEL, MODEL_HELP, is_model
from wamdiff_ros.world.closed_loop import MODES, ConstantVelocityPlanner, ExpertPlanner, LoopConfig, ModelPlanner
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, ScenarioError, load_scenarios
from wamdiff_ros.world.sim import World

DEFAULT_SEED = SPLIT_SEED_BASE["test"]  # held-out episodes, as wamdiff-eval closed-loop's


def _load_planner(args):
    """The model at --model with the command line's decode overrides (at most two torch threads), and the overrides."""
    import torch

    from wamdiff_ros.planner import Planner

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    decode = decode_overrides(args)
    return Planner.from_pretrained(args.model, **decode), decode


def _write_report(report: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1))
        print(f"report: {path}")


def _run_probe(args, parser, module, desc: str, **fields) -> tuple[list, dict, dict]:
    """A probe module's cases on the model (progress bar): its rows, summary and report (``fields`` go in after the
    model's name; with ``--vision`` the vision probe too)."""
    if not is_model(args.model):
        parser.error(f"--model: {args.model!r} is not a checkpoint folder")
    if args.vision < 0 or 0 < args.vision < 20:
        parser.error(f"--vision: 0 (off) or at least 20 frames to fit and hold out, got {args.vision}")
    planner, decode = _load_planner(args)
    cases = module.cases()
    with tqdm(total=len(cases), desc=desc, unit="case", disable=args.no_progress, file=sys.stderr) as bar:
        rows = module.probe(ModelPlanner(planner), cases, progress=bar.update)
    summary = module.summarize(rows)
    report = {"model": args.model, **fields, "decode": decode, "summary": summary, "rows": [r.to_json() for r in rows]}
    if args.vision:
        report["vision"] = module.vision_probe(planner.bundle, module.random_cases(args.vision))
    return rows, summary, report


def lane_probe_main(args, parser) -> int:
    from wamdiff_training.world import lane_probe

    rows, summary, report = _run_probe(args, parser, lane_probe, "lane probe", waypoint=lane_probe.WAYPOINT)
    poses = {(r.case.offset_m, r.case.heading_rad) for r in rows}
    print(f"lane probe of {args.model}: sideways waypoint {lane_probe.WAYPOINT} (2 s), m, ego frame (y left); "
          f"model y: mean over {len(rows) // max(1, len(poses))} placements (lanes x shifts along the road)")
    print("| offset (m) | heading (rad) | expert y | model y |\n|---:|---:|---:|---:|")
    for (o, h), group in itertools.groupby(sorted(rows, key=lambda r: (r.case.offset_m, r.case.heading_rad)),
                                           key=lambda r: (r.case.offset_m, r.case.heading_rad)):
        group = list(group)
        ys = [r.planner_y for r in group if r.planner_y is not None]
        model_y = f"{sum(ys) / len(ys):.2f}" if ys else "invalid"
        print(f"| {o:+.2f} | {h:+.2f} | {group[0].expert_y:.2f} | {model_y} |")
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.vision:
        v = report["vision"]
        print(f"vision features -> pose (ridge, {v['held_out']} held-out of {v['frames']} frames): "
              f"offset R2 {v['offset_r2']}, heading R2 {v['heading_r2']}")
    _write_report(report, args.json)
    return 0


def lead_probe_main(args, parser) -> int:
    from wamdiff_training.world import lead_probe

    rows, summary, report = _run_probe(args, parser, lead_probe, "lead probe", waypoint=lead_probe.WAYPOINT,
                                       brake_m=lead_probe.BRAKE_M)

    def key(row):  # the rows by gap (no row last), then ego speed
        return row.case.gap_m is None, row.case.gap_m or 0.0, row.case.ego_speed

    print(f"lead probe of {args.model}: slow-down = speed x {lead_probe.HORIZON_S:g} s - x{lead_probe.WAYPOINT} (m), "
          f"a row of {lead_probe.ROW_SPEED:g} m/s cars across the road; model: mean over {len(lead_probe.LANES)} lanes")
    print("| row ahead (m) | ego speed (m/s) | expert slow-down | model slow-down |\n|---:|---:|---:|---:|")
    for (_, _, speed), group in itertools.groupby(sorted(rows, key=key), key=key):
        group = list(group)
        gap = "none" if group[0].case.gap_m is None else f"{group[0].case.gap_m:g}"
        ps = [r.planner_slowdown for r in group if r.planner_slowdown is not None]
        model = f"{sum(ps) / len(ps):.1f}" if ps else "invalid"
        expert = sum(r.expert_slowdown for r in group) / len(group)
        print(f"| {gap} | {speed:g} | {expert:.1f} | {model} |")
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.vision:
        v = report["vision"]
        print(f"vision features -> row distance (ridge, {v['held_out']} held-out of {v['frames']} frames): "
              f"gap R2 {v['gap_r2']}, 1/gap R2 {v['inverse_gap_r2']}")
    _write_report(report, args.json)
    return 0


def probe_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wamdiff-train probe", description="a model's lane and lead probes")
    sub = parser.add_subparsers(dest="probe", required=True)
    for name, help_text, vision in (
            ("lane", "does the plan follow the ego's offset and heading in its lane",
             "also fit a ridge probe from the vision features to the pose on N random frames (e.g. 600)"),
            ("lead", "does the plan slow down for a row of slower cars ahead",
             "also fit a ridge probe from the vision features to the row's distance on N random frames (e.g. 300)")):
        probe = sub.add_parser(name, help=help_text)
        probe.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
        add_decode_settings_args(probe)
        probe.add_argument("--vision", type=int, default=0, metavar="N", help=vision)
        probe.add_argument("--json", default=None, metavar="OUT", help="write the rows and summary here")
        probe.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    return (lane_probe_main if args.probe == "lane" else lead_probe_main)(args, parser)


def trace_main(argv: list[str] | None = None) -> int:
    from wamdiff_training.world import trace

    parser = argparse.ArgumentParser(prog="wamdiff-train trace",
                                     description="one closed-loop episode: the plan next to the expert's at every "
                                                 "plan time")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"{MODEL_HELP}, or expert / constant_velocity")
    parser.add_argument("--scenario", default="intersection", help="one scenario name")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"the episode's seed (default {DEFAULT_SEED})")
    parser.add_argument("--mode", choices=MODES, default="paused")
    parser.add_argument("--plan-hz", type=float, default=2.0, help="plan requests per second (one in flight)")
    parser.add_argument("--blend-tau", type=float, default=0.0, help="the follower's plan blending (s; 0 = off)")
    add_decode_settings_args(parser)
    parser.add_argument("--route-variants", default=None, metavar="NAMES",
                        help="also plan from each state with another route line, which does not drive: straight "
                             "and / or mirror (comma-separated; a model that reads the route line)")
    parser.add_argument("--scenario-file", default=None, help="a scenario YAML instead of the frozen set")
    parser.add_argument("--out", default="out/trace", help="folder for trace_<scenario>_seed<seed>.json / .png")
    args = parser.parse_args(argv)
    try:
        scenario_set = load_scenarios(args.scenario_file)
        spec = scenario_set.get(args.scenario)
    except (ScenarioError, OSError) as exc:
        parser.error(f"--scenario: {exc}")
    variants = tuple(v for v in (args.route_variants or "").split(",") if v)
    try:
        trace.check_route_variants(variants)
    except ValueError as err:
        parser.error(f"--route-variants: {err}")
    if args.model in ("expert", "constant_velocity"):
        if variants:
            parser.error(f"--route-variants: {args.model} does not read the route line")
        planner, decode = ExpertPlanner() if args.model == "expert" else ConstantVelocityPlanner(), {}
    elif is_model(args.model):
        model, decode = _load_planner(args)
        if variants and not model.bundle.meta.route_points:
            parser.error(f"--route-variants: {args.model} was not trained with the route line (wamdiff.json "
                         "route_points)")
        planner = ModelPlanner(model)
    else:
        parser.error(f"--model: {args.model!r} is neither a checkpoint folder nor expert / constant_velocity")
    try:
        config = LoopConfig(mode=args.mode, plan_hz=args.plan_hz, plan_blend_tau_s=args.blend_tau)
    except ValueError as err:
        parser.error(str(err))
    rows, log = trace.trace(planner, spec, args.seed, config, scenario_set, variants)
    summary = trace.summarize(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{spec.name}_seed{args.seed}"
    png = trace.plot(rows, log, out / f"trace_{name}.png", road=World(spec, args.seed, scenario_set).geometry,
                     title=f"{spec.name} seed {args.seed}, {args.model}: {log.end_reason} at {log.t[-1]:.1f} s")
    report = {"model": args.model, "scenario": spec.name, "seed": args.seed, "decode": decode,
              "mode": args.mode, "plan_hz": args.plan_hz, "blend_tau_s": args.blend_tau,
              "route_variants": list(variants),
              "end_reason": log.end_reason, "end_phase": log.end_phase, "duration_s": round(float(log.t[-1]), 2),
              "summary": summary, "rows": [r.to_json() for r in rows]}
    (out / f"trace_{name}.json").write_text(json.dumps(report, indent=1))
    print(f"trace of {args.model} on {spec.name} seed {args.seed} ({args.mode}, {args.plan_hz:g} Hz): "
          f"{log.end_reason} at {log.t[-1]:.1f} s; plans at 4 s, ego frame (x forward, y left), m")

    def last(points) -> str:
        return "invalid" if points is None else f"({points[-1, 0]:.1f}, {points[-1, 1]:.1f})"

    print("| t (s) | speed (m/s) | command | route points | planner 4 s | expert 4 s | gap |"
          + "".join(f" {v} route 4 s |" for v in variants)
          + "\n|---:|---:|---|---|---|---|---:|" + "---|" * len(variants))
    for r in rows:
        route = "-" if r.route is None else " ".join(f"({x:.1f}, {y:.1f})" for x, y in r.route)
        print(f"| {r.t:.1f} | {r.speed:.1f} | {r.command} | {route} | {last(r.planner)} | {last(r.expert)} | "
              f"{'-' if r.gap_m is None else f'{r.gap_m:.1f}'} |"
              + "".join(f" {last(r.variants[v])} |" for v in variants))
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    print(f"trace: {out / f'trace_{name}.json'}  {png}")
    return 0
