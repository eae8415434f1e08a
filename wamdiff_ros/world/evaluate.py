"""``wamdiff-eval closed-loop``: the model and the baselines (expert, constant velocity) on the frozen scenarios, in
parallel worker processes (one torch thread each), scored as Bench2Drive does; writes a JSON report, a markdown
table, bird's-eye plots and front-camera videos. ``wamdiff-eval lane-probe``: does the model's plan follow its pose
in the lane (``wamdiff_ros.world.lane_probe``). ``wamdiff-eval lead-probe``: does it slow down for slower traffic
ahead (``wamdiff_ros.world.lead_probe``). ``wamdiff-eval compare``: the paired driving-score difference between two
closed-loop reports, per scenario. ``wamdiff-eval trace``: one closed-loop episode with the expert's plan beside the
model's at every plan time (``wamdiff_ros.world.trace``)."""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from wamdiff_ros.cli import add_decode_settings_args, decode_overrides
from wamdiff_ros.model_names import DEFAULT_MODEL, MODEL_HELP, is_model
from wamdiff_ros.provenance import host_info
from wamdiff_ros.world.closed_loop import (MODES, ConstantVelocityPlanner, EpisodeResult, ExpertPlanner, LoopConfig,
                                           ModelPlanner, run_episode)
from wamdiff_ros.world.metrics import EpisodeLog, score_episode
from wamdiff_ros.world.report import write_report
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, ScenarioError, load_scenarios
from wamdiff_ros.world.sim import World

BASELINES = ("expert", "constant_velocity")
DEFAULT_SEED = SPLIT_SEED_BASE["test"]  # held-out episodes: the dataset's training seeds never reach these


@dataclass(frozen=True, slots=True)
class Job:
    scenario: str
    seed: int
    planner: str  # "model" | "expert" | "constant_velocity"
    mode: str


_WORKER: dict = {}


def _init_worker(model: str | None, decode: dict, scenario_file: str | None) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    _WORKER.update(model=model, decode=decode, scenarios=load_scenarios(scenario_file), planner=None)


def _planner(name: str):
    if name == "expert":
        return ExpertPlanner()
    if name == "constant_velocity":
        return ConstantVelocityPlanner()
    if _WORKER["planner"] is None:
        from wamdiff_ros.planner import Planner

        _WORKER["planner"] = ModelPlanner(Planner.from_pretrained(_WORKER["model"], **_WORKER["decode"]))
    return _WORKER["planner"]


def _run_job(job: Job, config: dict) -> tuple[Job, dict, int, float]:
    spec = _WORKER["scenarios"].get(job.scenario)
    result = run_episode(spec, job.seed, _planner(job.planner), LoopConfig(mode=job.mode, **config),
                         _WORKER["scenarios"])
    return job, result.log.to_json(), result.sim_steps, result.wall_s


def _run_star(args: tuple) -> tuple[Job, dict, int, float]:
    return _run_job(*args)


def _results(work: list, init: tuple, workers: int):
    """Episode results as they finish: a pool of spawned workers (one torch thread each), or in this process."""
    if workers > 1:
        with mp.get_context("spawn").Pool(workers, _init_worker, init) as pool:
            yield from pool.imap_unordered(_run_star, work)
            pool.close()  # let the workers exit on their own: terminated, they leak their semaphores (a warning)
            pool.join()
    else:
        _init_worker(*init)
        yield from map(_run_star, work)


def write_video(result: EpisodeResult, path: Path, camera, fps: float) -> Path:
    """The episode's camera frames with each plan drawn (waypoints, boxes, a caption): MP4 through imageio-ffmpeg."""
    import imageio_ffmpeg
    import numpy as np

    from wamdiff_ros.draw import draw_plan

    frames = [np.asarray(draw_plan(img, wp, boxes, text=text, camera=camera.camera_model()))
              for img, wp, boxes, text in result.frames]
    h, w = frames[0].shape[:2]
    h2, w2 = h + h % 2, w + w % 2  # yuv420p needs even sides
    writer = imageio_ffmpeg.write_frames(str(path), (w2, h2), fps=fps, macro_block_size=1, quality=7)
    writer.send(None)
    for f in frames:
        writer.send(np.ascontiguousarray(np.pad(f, ((0, h2 - h), (0, w2 - w), (0, 0)))))
    writer.close()
    return path


def _load_planner(args):
    """The model at --model with the command line's decode overrides (at most two torch threads), and the overrides."""
    import torch

    from wamdiff_ros.planner import Planner

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    decode = decode_overrides(args)
    return Planner.from_pretrained(args.model, **decode), decode


def _probe_planner(args, parser):
    """The model a probe command runs (after checking --model and --vision) and the decode overrides it used."""
    if not is_model(args.model):
        parser.error(f"--model: {args.model!r} is not a checkpoint folder")
    if args.vision < 0 or 0 < args.vision < 20:
        parser.error(f"--vision: 0 (off) or at least 20 frames to fit and hold out, got {args.vision}")
    return _load_planner(args)


def _write_report(report: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1))
        print(f"report: {path}")


def _run_probe(args, parser, module, desc: str, **fields) -> tuple[list, dict, dict]:
    """A probe module's cases on the model (progress bar): its rows, summary and report (``fields`` go in after the
    model's name; with ``--vision`` the vision probe too)."""
    planner, decode = _probe_planner(args, parser)
    cases = module.cases()
    with tqdm(total=len(cases), desc=desc, unit="case", disable=args.no_progress, file=sys.stderr) as bar:
        rows = module.probe(ModelPlanner(planner), cases, progress=bar.update)
    summary = module.summarize(rows)
    report = {"model": args.model, **fields, "decode": decode, "summary": summary, "rows": [r.to_json() for r in rows]}
    if args.vision:
        report["vision"] = module.vision_probe(planner.bundle, module.random_cases(args.vision))
    return rows, summary, report


def lane_probe_main(args, parser) -> int:
    from wamdiff_ros.world import lane_probe

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
    from wamdiff_ros.world import lead_probe

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


def _report_episodes(path: str, planner: str, parser) -> list:
    """The scored episodes of ``planner`` in a ``wamdiff-eval closed-loop`` report (its JSON, or its folder)."""
    from wamdiff_ros.world.metrics import EpisodeScore

    file = Path(path) / "report.json" if Path(path).is_dir() else Path(path)
    try:
        report = json.loads(file.read_text())
        episodes = [EpisodeScore.from_json(e) for e in report["episodes"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        parser.error(f"{file}: not a wamdiff-eval closed-loop report ({type(err).__name__}: {err})")
    chosen = [e for e in episodes if e.planner == planner]
    if not chosen:
        present = ", ".join(sorted({e.planner for e in episodes})) or "none"
        parser.error(f"{file}: no episodes of planner {planner!r} (it holds: {present})")
    return chosen


def compare_main(args, parser) -> int:
    from wamdiff_ros.world.summary import compare

    new = _report_episodes(args.new, args.planner, parser)
    ref = _report_episodes(args.ref, args.ref_planner or args.planner, parser)
    result = compare(new, ref)
    if not result["rows"]:
        parser.error(f"{args.new} and {args.ref} share no episode (same mode, scenario and seed)")
    pct = round(100 * result["level"])
    print(f"paired driving score, new ({args.new}) - ref ({args.ref}), {result['episodes']} episodes")
    print(f"| mode | scenario | episodes | new DS | ref DS | new - ref [{pct} % CI] | collisions / ep (new, ref) "
          "| completed (new, ref) |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['mode']} | {r['scenario']} | {r['episodes']} | {r['new_ds']:.1f} | {r['ref_ds']:.1f} | "
              f"{r['ds_diff']:+.1f} [{r['ds_diff_lo']:+.1f}, {r['ds_diff_hi']:+.1f}] | "
              f"{r['new_collisions_per_ep']:.2f}, {r['ref_collisions_per_ep']:.2f} | "
              f"{r['new_completed']}, {r['ref_completed']} |")
    if result["only_new"] or result["only_ref"]:
        print(f"left out (no partner): {result['only_new']} episodes only in new, {result['only_ref']} only in ref")
    _write_report(result, args.json)
    return 0


def trace_main(args, parser) -> int:
    from wamdiff_ros.world import trace

    try:
        scenario_set = load_scenarios(args.scenario_file)
        spec = scenario_set.get(args.scenario)
    except (ScenarioError, OSError) as exc:
        parser.error(f"--scenario: {exc}")
    if args.model in ("expert", "constant_velocity"):
        planner, decode = _planner(args.model), {}
    elif is_model(args.model):
        model, decode = _load_planner(args)
        planner = ModelPlanner(model)
    else:
        parser.error(f"--model: {args.model!r} is neither a checkpoint folder nor expert / constant_velocity")
    try:
        config = LoopConfig(mode=args.mode, plan_hz=args.plan_hz, plan_blend_tau_s=args.blend_tau)
    except ValueError as err:
        parser.error(str(err))
    variants = tuple(v for v in (args.route_variants or "").split(",") if v)
    try:
        trace.check_route_variants(planner, variants)
    except ValueError as err:
        parser.error(f"--route-variants: {args.model}: {err}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wamdiff-eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, vision in (
            ("lane-probe", "does the plan follow the ego's offset and heading in its lane",
             "also fit a ridge probe from the vision features to the pose on N random frames (e.g. 600)"),
            ("lead-probe", "does the plan slow down for a row of slower cars ahead",
             "also fit a ridge probe from the vision features to the row's distance on N random frames (e.g. 300)")):
        probe = sub.add_parser(name, help=help_text)
        probe.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
        add_decode_settings_args(probe)
        probe.add_argument("--vision", type=int, default=0, metavar="N", help=vision)
        probe.add_argument("--json", default=None, metavar="OUT", help="write the rows and summary here")
        probe.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("compare", help="paired driving-score difference between two closed-loop reports")
    c.add_argument("new", help="a wamdiff-eval closed-loop report.json (or its folder)")
    c.add_argument("ref", help="the report to compare against (episodes paired by mode, scenario and seed)")
    c.add_argument("--planner", default="model", help="the planner compared (default: model)")
    c.add_argument("--ref-planner", default=None, help="the reference report's planner (default: --planner)")
    c.add_argument("--json", default=None, metavar="OUT", help="write the rows here")
    t = sub.add_parser("trace", help="one closed-loop episode: the plan next to the expert's at every plan time")
    t.add_argument("--model", default=DEFAULT_MODEL, help=f"{MODEL_HELP}, or expert / constant_velocity")
    t.add_argument("--scenario", default="intersection", help="one scenario name")
    t.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"the episode's seed (default {DEFAULT_SEED})")
    t.add_argument("--mode", choices=MODES, default="paused")
    t.add_argument("--plan-hz", type=float, default=2.0, help="plan requests per second (one in flight)")
    t.add_argument("--blend-tau", type=float, default=0.0, help="the follower's plan blending (s; 0 = off)")
    add_decode_settings_args(t)
    t.add_argument("--route-variants", default=None, metavar="NAMES",
                   help="also plan from each state with another route line, which does not drive: straight and / or "
                        "mirror (comma-separated; a model that reads the route line)")
    t.add_argument("--scenario-file", default=None, help="a scenario YAML instead of the frozen set")
    t.add_argument("--out", default="out/trace", help="folder for trace_<scenario>_seed<seed>.json / .png")
    p = sub.add_parser("closed-loop", help="closed-loop driving score on the frozen CPU world")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"{MODEL_HELP}, or none for the baselines only")
    p.add_argument("--scenarios", default="all", help="comma-separated names or all")
    p.add_argument("--episodes", type=int, default=10, help="episodes per scenario (seeds S, S+1, ...)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"first seed (default {DEFAULT_SEED}: held out)")
    p.add_argument("--realtime", action="store_true", help="also run the real-time mode (both modes reported)")
    p.add_argument("--modes", default=None, help="explicit modes, e.g. realtime or paused,realtime")
    p.add_argument("--baselines", default=",".join(BASELINES), help="baselines to run beside the model, or none")
    p.add_argument("--hardware-factor", type=float, default=1.0, help="real-time mode: latency multiplier")
    p.add_argument("--plan-hz", type=float, default=5.0, help="plan requests per second (one in flight)")
    p.add_argument("--blend-tau", type=float, default=None,
                   help="the follower's plan blending: weight exp(-age / tau) of earlier plans (s; 0 = off; default: "
                        "the gains file's)")
    add_decode_settings_args(p)
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--scenario-file", default=None, help="a scenario YAML instead of the frozen set")
    p.add_argument("--out", default="out/eval", help="report folder")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the JSON report here")
    p.add_argument("--videos", type=int, default=1, help="front-camera videos of the first seed of the first N "
                   "scenarios (the model, else the expert; paused mode)")
    p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "lane-probe":
        return lane_probe_main(args, parser)
    if args.command == "lead-probe":
        return lead_probe_main(args, parser)
    if args.command == "compare":
        return compare_main(args, parser)
    if args.command == "trace":
        return trace_main(args, parser)

    try:
        scenario_set = load_scenarios(args.scenario_file)
        specs = scenario_set.select(args.scenarios)
    except (ScenarioError, OSError) as exc:
        parser.error(str(exc))
    modes = args.modes.split(",") if args.modes else ["paused", "realtime"] if args.realtime else ["paused"]
    if set(modes) - set(MODES):
        parser.error(f"--modes: expected some of {MODES}, got {args.modes!r}")
    baselines = [] if args.baselines == "none" else args.baselines.split(",")
    if set(baselines) - set(BASELINES):
        parser.error(f"--baselines: expected some of {BASELINES} or none, got {args.baselines!r}")
    model = None if args.model == "none" else args.model
    if model is not None and not is_model(model):
        parser.error(f"--model: {model!r} is not a checkpoint folder")
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    config = {"plan_hz": args.plan_hz, "hardware_factor": args.hardware_factor, "plan_blend_tau_s": args.blend_tau}
    try:  # LoopConfig's own checks, as argument errors before any episode runs
        LoopConfig(**config)
    except ValueError as err:
        parser.error(str(err))
    planners = (["model"] if model else []) + baselines
    if not planners:
        parser.error("nothing to run: give --model or --baselines")
    decode = decode_overrides(args)
    jobs = [Job(s.name, args.seed + i, planner, mode) for i in range(args.episodes) for s in specs
            for planner in planners for mode in modes]

    start = time.perf_counter()
    logs, steps, wall = [], {}, {}
    init = (model, decode, args.scenario_file)
    work = [(job, config) for job in jobs]
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=args.no_progress, file=sys.stderr)
    for job, log, n, w in _results(work, init, args.workers):
        logs.append(log)
        key = (job.planner, job.mode)
        steps[key], wall[key] = steps.get(key, 0) + n, wall.get(key, 0.0) + w
        bar.update()
    bar.close()

    episode_logs = [EpisodeLog.from_json(d) for d in logs]
    episode_logs.sort(key=lambda lg: (lg.planner, lg.mode, lg.scenario, lg.seed))
    scores = [score_episode(lg) for lg in episode_logs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    roads = {s.name: World(s, args.seed, scenario_set).geometry for s in specs}
    paths = write_report(scores, episode_logs, out, roads=roads)
    throughput = {f"{p}/{m}": {"sim_steps": steps[(p, m)], "wall_s": round(wall[(p, m)], 2),
                               "sim_steps_per_s": round(steps[(p, m)] / max(wall[(p, m)], 1e-9), 1)}
                  for p, m in steps}
    report = json.loads(paths.json.read_text())
    report["run"] = {"argv": sys.argv[1:] if argv is None else argv, "model": model, "scenario_set": scenario_set.source,
                     "scenario_version": scenario_set.version, "modes": modes, "planners": planners,
                     "episodes_per_scenario": args.episodes, "first_seed": args.seed, "workers": args.workers,
                     "wall_s": round(time.perf_counter() - start, 1), "throughput": throughput, **config,
                     "host": host_info()}
    paths.json.write_text(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    md = paths.markdown.read_text() + "\n## Throughput (sim steps/s, camera rendering + planning + world)\n\n" + \
        "\n".join(f"- {k}: {v['sim_steps_per_s']} steps/s ({v['sim_steps']} steps in {v['wall_s']} s)"
                  for k, v in sorted(throughput.items())) + "\n"
    paths.markdown.write_text(md)
    videos = []
    if args.videos > 0:
        _init_worker(*init)
        who = "model" if model else "expert"
        for spec in specs[: args.videos]:
            cfg = LoopConfig(mode="paused", keep_frames=True, **config)
            result = run_episode(spec, args.seed, _planner(who), cfg, scenario_set)
            videos.append(write_video(result, out / f"video_{spec.name}_{who}_seed{args.seed}.mp4", cfg.camera,
                                      fps=config["plan_hz"]))
    print(md)
    print(f"report: {paths.json}  {paths.markdown}  {' '.join(str(p) for p in paths.bev)}")
    if videos:
        print("videos: " + " ".join(str(v) for v in videos))
    return 0


if __name__ == "__main__":
    sys.exit(main())
