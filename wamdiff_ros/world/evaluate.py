"""``wamdiff-eval closed-loop``: the model and the baselines (expert, constant velocity) on the frozen scenarios, in
parallel worker processes (one torch thread each), scored as Bench2Drive does; writes a JSON report, a markdown
table, bird's-eye plots and front-camera videos. ``wamdiff-eval compare``: the paired driving-score difference
between two closed-loop reports, per scenario."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tqdm import tqdm

from wamdiff_ros.cli import add_decode_settings_args, decode_overrides
from wamdiff_ros.model_names import DEFAULT_MODEL, MODEL_HELP, is_model
from wamdiff_ros.provenance import host_info
from wamdiff_ros.world.closed_loop import (ANSWERS, MODES, ConstantVelocityPlanner, EpisodeResult, ExpertPlanner, LoopConfig,
                                           ModelPlanner, run_episode)
from wamdiff_ros.world.metrics import EpisodeLog, score_episode
from wamdiff_ros.world.perturb import NAMES as PERTURBATIONS
from wamdiff_ros.world.perturb import label as perturb_label
from wamdiff_ros.world.perturb import parse_perturbations
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


def _init_worker(model: str | None, decode: dict, scenario_file: str | None, deadline: dict | None = None) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    _WORKER.update(model=model, decode=decode, scenarios=load_scenarios(scenario_file), planner=None, planners={},
                   deadline=deadline or {})


def _planner(name: str):
    """A baseline, the model, or the model under a deadline ("model_anytime" / "model_stop": ``--deadline-ms``),
    all model variants on one loaded ``Planner``."""
    if name == "expert":
        return ExpertPlanner()
    if name == "constant_velocity":
        return ConstantVelocityPlanner()
    if _WORKER["planner"] is None:
        from wamdiff_ros.planner import Planner

        _WORKER["planner"] = Planner.from_pretrained(_WORKER["model"], **_WORKER["decode"])
    if name not in _WORKER["planners"]:
        on_deadline = name.removeprefix("model_") if name != "model" else "anytime"
        _WORKER["planners"][name] = ModelPlanner(_WORKER["planner"], name, on_deadline=on_deadline,
                                                 **(_WORKER["deadline"] if name != "model" else {}))
    return _WORKER["planners"][name]


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


def _deadline_line(logs: list[EpisodeLog], planner: str, mode: str) -> str:
    mine = [lg for lg in logs if lg.planner == planner and lg.mode == mode]
    plans = sum(len(lg.plan_latency_s) for lg in mine)
    cut, anytime = sum(lg.plans_cut for lg in mine), sum(lg.anytime_plans for lg in mine)
    return (f"- {planner}/{mode}: {cut} of {plans} plans cut at the deadline ({100 * cut / max(plans, 1):.0f} %), "
            f"{anytime} of them drove the best-so-far plan, {cut - anytime} the fallback stop")


def _write_report(report: dict, path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1))
        print(f"report: {path}")


def _report_episodes(path: str, planner: str, parser) -> tuple[list, dict]:
    """The scored episodes of ``planner`` in a ``wamdiff-eval closed-loop`` report (its JSON, or its folder), and
    the report's ``run`` record (its command, model, scenario set and settings; empty when it has none)."""
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
    return chosen, report.get("run") or {}


def compare_main(args, parser) -> int:
    from wamdiff_ros.world.summary import compare, starts_text

    new, new_run = _report_episodes(args.new, args.planner, parser)
    ref, ref_run = _report_episodes(args.ref, args.ref_planner or args.planner, parser)
    groups = {}
    for spec in args.group or []:
        name, _, members = spec.partition("=")
        if not name or not members or name == "all":
            parser.error(f"--group: expected NAME=SCENARIO,SCENARIO,... (NAME not 'all'), got {spec!r}")
        groups[name] = [m for m in members.split(",") if m]
    result = compare(new, ref, groups=groups)
    if not result["rows"]:
        parser.error(f"{args.new} and {args.ref} share no episode (same mode, scenario and seed)")
    pct = round(100 * result["level"])
    print(f"paired driving score, new ({args.new}) - ref ({args.ref}), {result['episodes']} episodes")
    print(f"| mode | scenario | episodes | new DS | ref DS | new - ref [{pct} % CI] | collisions / ep (new, ref) "
          "| completed (new, ref) | starts from rest ok (new, ref) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['mode']} | {r['scenario']} | {r['episodes']} | {r['new_ds']:.1f} | {r['ref_ds']:.1f} | "
              f"{r['ds_diff']:+.1f} [{r['ds_diff_lo']:+.1f}, {r['ds_diff_hi']:+.1f}] | "
              f"{r['new_collisions_per_ep']:.2f}, {r['ref_collisions_per_ep']:.2f} | "
              f"{r['new_completed']}, {r['ref_completed']} | "
              f"{'-' if not r['rest_starts'] else starts_text(r, 'new') + ', ' + starts_text(r, 'ref')} |")
    if result["only_new"] or result["only_ref"]:
        print(f"left out (no partner): {result['only_new']} episodes only in new, {result['only_ref']} only in ref")
    quality = {name: plan_quality(episodes) for name, episodes in (("new", new), ("ref", ref))}
    if any(q["plans"] for q in quality.values()):
        print("plans (all episodes of each report): | report | mode | plans | valid | stepped back (% of valid) | "
              "repaired / 100 | implausible / 100 | median forward calls | median ms |\n|---|---|---:|---:|---:|---:|"
              "---:|---:|---:|")
        for name in ("new", "ref"):
            for mode, q in plan_quality_by_mode(new if name == "new" else ref).items():
                print(f"| {name} | {mode} | {q['plans']} | {q['valid']} | {q['stepped_back']} "
                      f"({q['stepped_back_pct']:.2f} %) | {q['edited_per_100']:.1f} | {q['implausible_per_100']:.1f} "
                      f"| {q['median_forward_calls']:g} | {q['median_ms']:.1f} |")
    result["plan_quality"] = {name: plan_quality_by_mode(new if name == "new" else ref) for name in ("new", "ref")}
    result["runs"] = {"new": {"report": args.new, "planner": args.planner, **new_run},
                      "ref": {"report": args.ref, "planner": args.ref_planner or args.planner, **ref_run}}
    _write_report(result, args.json)
    return 0


def plan_quality(episodes: list) -> dict:
    """The plans of ``episodes`` (EpisodeScore.plan_quality) pooled: counts, the share of valid plans that step back,
    repaired and implausible plans per 100, median forward calls and wall ms per plan."""
    keys = ("plans", "valid", "stepped_back", "edited", "implausible")
    total = {k: sum(int(e.plan_quality.get(k, 0)) for e in episodes) for k in keys}
    calls = [c for e in episodes for c in e.plan_quality.get("forward_calls", [])]
    ms = [m for e in episodes for m in e.plan_quality.get("ms", [])]
    plans = max(total["plans"], 1)
    return {**total, "stepped_back_pct": 100.0 * total["stepped_back"] / max(total["valid"], 1),
            "edited_per_100": 100.0 * total["edited"] / plans, "implausible_per_100": 100.0 * total["implausible"] / plans,
            "median_forward_calls": float(np.median(calls)) if calls else float("nan"),
            "median_ms": float(np.median(ms)) if ms else float("nan")}


def plan_quality_by_mode(episodes: list) -> dict:
    return {mode: plan_quality([e for e in episodes if e.mode == mode]) for mode in sorted({e.mode for e in episodes})}


def _checked_run_args(args, modes: list[str], parser) -> tuple[list[str], list[str], str | None]:
    """closed-loop's and robustness's shared checks: (modes, baselines, model or None); a bad one exits 2."""
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
    return modes, baselines, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wamdiff-eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="paired driving-score difference between two closed-loop reports")
    c.add_argument("new", help="a wamdiff-eval closed-loop report.json (or its folder)")
    c.add_argument("ref", help="the report to compare against (episodes paired by mode, scenario and seed)")
    c.add_argument("--planner", default="model", help="the planner compared (default: model)")
    c.add_argument("--ref-planner", default=None, help="the reference report's planner (default: --planner)")
    c.add_argument("--group", action="append", metavar="NAME=SCENARIO,...",
                   help="also pool these scenarios into one row called NAME (repeatable; e.g. "
                        "v1=highway,merge,roundabout,intersection on a v2 run)")
    c.add_argument("--json", default=None, metavar="OUT", help="write the rows here")
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
    p.add_argument("--perturb", default=None, metavar="NAME[=SEVERITY],...",
                   help=f"deployment perturbations after Bench2Drive-Robust, composable: {', '.join(PERTURBATIONS)}; "
                        "severity 1 (its default, the default here) or 2 (see wamdiff_ros/world/perturb.py)")
    p.add_argument("--answers", default="none", metavar="NAME,...|all|none",
                   help=f"the node's answers to the perturbations: {', '.join(ANSWERS)} (default none)")
    p.add_argument("--deadline-ms", type=float, default=None,
                   help="give each model plan this long (wall clock) and run the model twice, as model_anytime (a plan "
                        "cut at the deadline drives its best so far when valid) and model_stop (the fallback stop)")
    p.add_argument("--anytime-margin-ms", type=float, default=5.0,
                   help="with --deadline-ms: decoding stops refining this long before the deadline (the fill forward)")
    add_decode_settings_args(p)
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--scenario-file", default=None, help="a scenario YAML, or v1 / v2 for a frozen set (default v1)")
    p.add_argument("--out", default="out/eval", help="report folder")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the JSON report here")
    p.add_argument("--videos", type=int, default=1, help="front-camera videos of the first seed of the first N "
                   "scenarios (the model, else the expert; paused mode)")
    p.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("robustness", help="closed-loop driving under each deployment perturbation and severity, "
                       "next to clean, paired by seed, the node's answers off and on (wamdiff_ros/world/robustness.py)")
    r.add_argument("--model", default=DEFAULT_MODEL, help=f"{MODEL_HELP}, or none for the baselines only")
    r.add_argument("--scenarios", default="all", help="comma-separated names or all")
    r.add_argument("--episodes", type=int, default=10, help="episodes per scenario per cell (seeds S, S+1, ...)")
    r.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"first seed (default {DEFAULT_SEED}: held out)")
    r.add_argument("--modes", default="paused", help="paused, realtime or both (comma-separated)")
    r.add_argument("--baselines", default=",".join(BASELINES), help="baselines to run beside the model, or none")
    r.add_argument("--perturbations", default=",".join(PERTURBATIONS),
                   help="the perturbations, each alone at severities 1 and 2, beside clean")
    r.add_argument("--answers", default="both", choices=("off", "on", "both"),
                   help=f"the node's answers ({', '.join(ANSWERS)}): off, on, or both (paired)")
    add_decode_settings_args(r)
    r.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    r.add_argument("--scenario-file", default=None, help="a scenario YAML, or v1 / v2 for a frozen set (default v1)")
    r.add_argument("--out", default="out/robustness", help="report folder (episodes.jsonl there is resumed)")
    r.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare_main(args, parser)
    if args.command == "robustness":
        return robustness_main(args, parser)

    try:
        scenario_set = load_scenarios(args.scenario_file)
        specs = scenario_set.select(args.scenarios)
    except (ScenarioError, OSError) as exc:
        parser.error(str(exc))
    modes = args.modes.split(",") if args.modes else ["paused", "realtime"] if args.realtime else ["paused"]
    modes, baselines, model = _checked_run_args(args, modes, parser)
    config = {"plan_hz": args.plan_hz, "hardware_factor": args.hardware_factor, "plan_blend_tau_s": args.blend_tau}
    try:  # LoopConfig's own checks, as argument errors before any episode runs
        config["perturb"] = parse_perturbations(args.perturb)
        config["answers"] = tuple(ANSWERS) if args.answers == "all" else () if args.answers in ("", "none") else \
            tuple(a.strip() for a in args.answers.split(","))
        LoopConfig(**config)
    except ValueError as err:
        parser.error(str(err))
    deadline = None
    if args.deadline_ms is not None:
        if model is None:
            parser.error("--deadline-ms needs a --model")
        deadline = {"deadline_s": args.deadline_ms / 1e3, "margin_s": args.anytime_margin_ms / 1e3}
        if not deadline["deadline_s"] > deadline["margin_s"] >= 0:
            parser.error("--deadline-ms must exceed --anytime-margin-ms >= 0")
    models = ["model"] if deadline is None else ["model_anytime", "model_stop"]
    planners = (models if model else []) + baselines
    if not planners:
        parser.error("nothing to run: give --model or --baselines")
    decode = decode_overrides(args)
    jobs = [Job(s.name, args.seed + i, planner, mode) for i in range(args.episodes) for s in specs
            for planner in planners for mode in modes]

    start = time.perf_counter()
    logs, steps, wall = [], {}, {}
    init = (model, decode, args.scenario_file, deadline)
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
    report["run"] = {"argv": sys.argv[1:] if argv is None else argv, "model": model,
                     "scenario_set": scenario_set.source,
                     "scenario_version": scenario_set.version, "modes": modes, "planners": planners,
                     "episodes_per_scenario": args.episodes, "first_seed": args.seed, "workers": args.workers,
                     "wall_s": round(time.perf_counter() - start, 1), "throughput": throughput,
                     **{**config, "perturb": perturb_label(config["perturb"]), "answers": list(config["answers"])},
                     "deadline_ms": args.deadline_ms, "anytime_margin_ms": args.anytime_margin_ms if deadline else None,
                     "host": host_info()}
    paths.json.write_text(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    md = paths.markdown.read_text() + "\n## Throughput (sim steps/s, camera rendering + planning + world)\n\n" + \
        "\n".join(f"- {k}: {v['sim_steps_per_s']} steps/s ({v['sim_steps']} steps in {v['wall_s']} s)"
                  for k, v in sorted(throughput.items())) + "\n"
    if deadline is not None:
        md += (f"\n## Deadline {args.deadline_ms:g} ms (decoding stops {args.anytime_margin_ms:g} ms before it)\n\n"
               + "\n".join(_deadline_line(episode_logs, name, mode) for name in models for mode in modes) + "\n")
    paths.markdown.write_text(md)
    videos = []
    if args.videos > 0:
        _init_worker(*init)
        who = models[0] if model else "expert"
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


def robustness_main(args, parser) -> int:
    from wamdiff_ros.world import robustness as rb

    try:
        scenario_set = load_scenarios(args.scenario_file)
        specs = scenario_set.select(args.scenarios)
        names = [n.strip() for n in args.perturbations.split(",") if n.strip()]
        cells = rb.default_cells(names)
    except (ScenarioError, OSError, ValueError) as exc:
        parser.error(str(exc))
    modes, baselines, model = _checked_run_args(args, args.modes.split(","), parser)
    planners = (["model"] if model else []) + baselines
    if not planners:
        parser.error("nothing to run: give --model or --baselines")
    answers = {"off": (False,), "on": (True,), "both": (False, True)}[args.answers]
    out = Path(args.out)
    store = rb.EpisodeStore(out / "episodes.jsonl")
    work = []
    for cell in cells:
        for on in answers:
            config = {"plan_hz": 5.0, "hardware_factor": 1.0, "plan_blend_tau_s": None, "perturb": cell,
                      "answers": tuple(ANSWERS) if on else ()}
            for i in range(args.episodes):
                for spec in specs:
                    for planner in planners:
                        for mode in modes:
                            key = rb.Key(perturb_label(cell), on, planner, mode, spec.name, args.seed + i)
                            if key not in store:
                                work.append((Job(spec.name, args.seed + i, planner, mode), config))
    total = len(cells) * len(answers) * args.episodes * len(specs) * len(planners) * len(modes)
    print(f"{total} episodes in {len(cells)} cells x answers {args.answers}; {total - len(work)} already in "
          f"{store.path}", flush=True)
    init = (model, decode_overrides(args), args.scenario_file, None)
    bar = tqdm(total=len(work), desc="episodes", unit="ep", disable=args.no_progress, file=sys.stderr)
    for _, log, _, _ in _results(work, init, args.workers):
        perturbation = log.get("perturbation") or {}
        store.add(perturbation.get("label", "clean"), bool(perturbation.get("answers")), log)
        bar.update()
    bar.close()
    summary = rb.summarize(store.scores(), [perturb_label(c) for c in cells])
    summary["run"] = {"argv": sys.argv[1:], "model": model, "scenarios": [s.name for s in specs], "modes": modes,
                      "planners": planners, "episodes_per_scenario": args.episodes, "first_seed": args.seed,
                      "answers": args.answers, "host": host_info()}
    (out / "robustness.json").write_text(json.dumps(summary, indent=1))
    md = rb.markdown(summary)
    (out / "robustness.md").write_text(md)
    png = rb.plot(summary, out / "robustness.png")
    print(md)
    print(f"report: {out / 'robustness.md'}  {out / 'robustness.json'}  {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
