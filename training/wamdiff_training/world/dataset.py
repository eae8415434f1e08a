"""``wamdiff-train data generate``: the CPU driving world's expert demonstrations as WAM-Diff2 / LLaVA conversation
JSON.

Layout of ``DIR``: ``<split>.json`` (a list of ``{"id", "image", "conversations", "task", "meta"}``; one image serves
a plan, a detect and a few ask samples), ``images/<split>/<scenario>_<seed>_<frame>.png``, ``manifest.json`` and
``preview.png``. Prompts and answers come from ``wamdiff_ros.format`` only, built exactly as ``Planner`` builds them:
``meta`` keeps the raw ego floats given to ``EgoState``, so the prompt can be rebuilt byte for byte. The manifest
states what training reads from it: ``format_version`` (the plan answers' waypoint format) and ``route_points``
(whether the plan prompts carry the route line). The rollouts are ``wamdiff_training.world.demonstrations``; the
questions ``wamdiff_training.world.questions``. ``--driver MODEL`` makes DAgger data: a trained model drives part of
each episode (``--expert-share``) and the expert labels every frame. ``wamdiff-train data recoveries`` writes single
plan frames with the ego placed off its lane centre (``wamdiff_training.world.recoveries``) in the same layout; their
``meta.recovery`` holds the placement. ``--route-points`` (either action; off by default) writes the optional route
line (``fmt.route_line`` of ``World.route_points``: not in the paper's prompt) into every plan prompt, a
counterfactual record's from its own command's route, and keeps the floats in ``meta.route_points``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from wamdiff_ros import format as fmt
from wamdiff_ros.draw import draw_plan
from wamdiff_ros.world.camera import CameraConfig
from wamdiff_ros.world.closed_loop import ModelPlanner
from wamdiff_ros.world.scenarios import (
    SEEDS_PER_SPLIT, SPLIT_SEED_BASE, ScenarioError, ScenarioSet, ScenarioSpec, load_scenarios)
from wamdiff_training.world import questions
from wamdiff_training.world.demonstrations import (
    REPLAN_HZ, DatasetError, Frame, NoiseConfig, RolloutConfig, rollout, sample_steps)
from wamdiff_training.world.recoveries import (
    MAX_HEADING_RAD, MAX_OFFSET_M, RecoveryConfig, recovery_frame, recovery_seed)

DATASET_VERSION = 1
PREVIEW_COLUMNS = 4
PREVIEW_SCALE = 2  # tiles are scaled up whole so the label text stays legible


# ------------------------------------------------------------------------------------------------------------ export
def image_path(split: str, frame: Frame) -> str:
    return f"images/{split}/{frame.scenario}_{frame.seed}_{frame.index:04d}.png"


def records(frame: Frame, split: str, kind: str, perturbed_episode: bool,
            format_version: int = fmt.FORMAT_VERSION) -> list[dict]:
    """The samples of one frame: plan, detect, then its questions; all share the image. Plan answers are written in
    ``format_version`` (``wamdiff_ros.format``)."""
    p = frame.perturbation
    meta = {
        "scenario": frame.scenario, "kind": kind, "seed": frame.seed, "frame": frame.index, "t": frame.t,
        "command": frame.command.value, "velocity": list(frame.velocity), "acceleration": list(frame.acceleration),
        "speed": frame.speed, "perturbed": p is not None, "episode_perturbed": perturbed_episode,
        "perturbation": None if p is None else {"steer_rad": p.steer_rad, "accel_mps2": p.accel_mps2},
        "expert": frame.expert_reason, "infractions": frame.infractions, "vehicles_labelled": len(frame.boxes),
        "driver": frame.driver,
    }
    image, stem = image_path(split, frame), f"{split}_{frame.scenario}_{frame.seed}_{frame.index:04d}"

    def sample(task: str, user: str, answer: str, suffix: str = "", **extra) -> dict:
        return {"id": f"{stem}_{task}{suffix}", "image": image,
                "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}],
                "task": task, "meta": {**meta, **extra}}

    def route(command: fmt.Command) -> dict:
        """The route points of ``command``'s route, when the frame has them: the prompt's route line, and in the
        meta the raw floats it was written from."""
        points = frame.route_points.get(command)
        return {} if points is None else {"route_points": np.asarray(points, dtype=np.float64).tolist()}

    def plan_prompt(command: fmt.Command) -> str:
        return fmt.plan_prompt(command, frame.velocity, frame.acceleration, frame.route_points.get(command))

    def answer(waypoints: np.ndarray) -> str:
        return fmt.format_waypoints(waypoints, format_version)

    out = [sample("plan", plan_prompt(frame.command), answer(frame.waypoints), **route(frame.command)),
           sample("detect", fmt.detect_prompt(), fmt.format_boxes([lb.box for lb in frame.boxes]))]
    out += [sample("plan", plan_prompt(command), answer(wp), f"_cf_{command.value}",
                   command=command.value, expert=reason, counterfactual=True, **route(command))
            for command, wp, reason in frame.counterfactuals]
    out += [sample("ask", fmt.ask_prompt(q), a, f"_{key}", question=key) for key, q, a in frame.questions]
    return out


@dataclass(frozen=True, slots=True)
class _Job:
    """One episode to roll out (``RolloutConfig``) or one recovery frame to place (``RecoveryConfig``)."""

    spec: ScenarioSpec
    seed: int
    split: str
    config: RolloutConfig | RecoveryConfig
    scenarios: ScenarioSet
    out: str
    driver: str | None = None  # model folder for DAgger rollouts
    route_points: bool = False  # recovery frames: the prompt's route line (rollouts: RolloutConfig.route_points)
    format_version: int = fmt.FORMAT_VERSION  # the plan answers' waypoint format


_DRIVERS: dict[str, ModelPlanner] = {}  # one loaded model per process


def _driver(model: str | None) -> ModelPlanner | None:
    """The DAgger driver of the model folder ``model`` (None: the expert drives alone)."""
    if model is None:
        return None
    if model not in _DRIVERS:
        from wamdiff_ros.planner import Planner  # torch only when a model drives

        _DRIVERS[model] = ModelPlanner(Planner.from_pretrained(model))
    return _DRIVERS[model]


def _export_episode(job: _Job) -> tuple[list[dict], dict]:
    """Roll out, write the images, return the samples and the episode's manifest entry."""
    ep = rollout(job.spec, job.seed, job.config, job.scenarios, _driver(job.driver))
    out = []
    for frame in ep.frames:
        path = Path(job.out) / image_path(job.split, frame)
        Image.fromarray(frame.image, "RGB").save(path, format="PNG")
        out += records(frame, job.split, job.spec.kind, ep.perturbed, job.format_version)
    entry = {"scenario": ep.scenario, "seed": ep.seed, "frames": len(ep.frames), "sim_s": ep.sim_s,
             "end_reason": ep.end_reason, "perturbed": ep.perturbed,
             "model_driven_frames": sum(f.driver == "model" for f in ep.frames),
             "perturbations": [asdict(p) for p in ep.perturbations]}
    return out, entry


@contextmanager
def _single_threaded_children():
    """Worker processes inherit the environment at start: one BLAS / OpenMP thread each."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update({n: "1" for n in names})
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def generate_split(out: Path, specs: list[ScenarioSpec], episodes: int, split: str, config: RolloutConfig,
                   scenarios: ScenarioSet, seed_offset: int = 0, workers: int = 1,
                   progress: bool = True, driver: str | None = None,
                   format_version: int = fmt.FORMAT_VERSION) -> tuple[list[dict], list[dict]]:
    """Episodes ``seed_offset .. seed_offset + episodes - 1`` of ``split`` for every scenario: writes the images and
    returns (samples, episode entries), ordered by scenario, seed, frame, task whatever the worker count."""
    if split not in SPLIT_SEED_BASE:
        raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_SEED_BASE)}")
    if seed_offset < 0 or episodes < 1 or seed_offset + episodes > SEEDS_PER_SPLIT:
        raise DatasetError(f"seed offset + episodes must lie in [0, {SEEDS_PER_SPLIT}] so splits never share a seed")
    (out / "images" / split).mkdir(parents=True, exist_ok=True)
    base = SPLIT_SEED_BASE[split] + seed_offset
    jobs = [_Job(s, base + i, split, config, scenarios, str(out), driver, format_version=format_version)
            for s in specs for i in range(episodes)]
    results = _run_jobs(_export_episode, jobs, workers, tqdm(total=len(jobs), desc=f"{split} episodes", unit="ep",
                                                             disable=not progress))
    return [s for samples, _ in results for s in samples], [entry for _, entry in results]


def _run_jobs(fn, jobs: list, workers: int, bar: tqdm) -> list:
    """``fn`` of every job, in the jobs' order whatever the worker count (spawned processes, one thread each)."""
    results: list = [None] * len(jobs)
    if workers <= 1:
        for k, job in enumerate(jobs):
            results[k] = fn(job)
            bar.update()
    else:
        with _single_threaded_children(), ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(fn, job): k for k, job in enumerate(jobs)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.update()
    bar.close()
    return results


def _export_recovery(job: _Job) -> dict | None:
    """One recovery frame: writes its image, returns its plan sample (None: no placement kept clear of traffic)."""
    made = recovery_frame(job.spec, job.seed, job.scenarios, job.config, route_points=job.route_points)
    if made is None:
        return None
    frame, placement = made
    Image.fromarray(frame.image, "RGB").save(Path(job.out) / image_path(job.split, frame), format="PNG")
    sample = records(frame, job.split, job.spec.kind, False, job.format_version)[0]
    sample["meta"]["recovery"] = asdict(placement)
    return sample


def generate_recoveries(out: Path, specs: list[ScenarioSpec], samples: int, split: str, config: RecoveryConfig,
                        scenarios: ScenarioSet, seed_offset: int = 0, workers: int = 1,
                        progress: bool = True, route_points: bool = False,
                        format_version: int = fmt.FORMAT_VERSION) -> tuple[list[dict], int]:
    """Recovery worlds ``seed_offset .. seed_offset + samples - 1`` of ``split`` for every scenario: writes the images
    and returns (plan samples ordered by scenario and seed, worlds skipped for want of a clear placement).
    ``route_points``: the plan prompts carry the route line (``World.route_points``)."""
    seeds = [recovery_seed(split, seed_offset, k) for k in (0, samples - 1)]  # checks the whole range
    (out / "images" / split).mkdir(parents=True, exist_ok=True)
    jobs = [_Job(s, seeds[0] + k, split, config, scenarios, str(out), route_points=route_points,
                 format_version=format_version) for s in specs for k in range(samples)]
    results = _run_jobs(_export_recovery, jobs, workers, tqdm(total=len(jobs), desc=f"{split} recoveries",
                                                              unit="frame", disable=not progress))
    return [r for r in results if r is not None], sum(r is None for r in results)


def counts(samples: list[dict]) -> dict:
    return {"samples": len(samples), "images": len({s["image"] for s in samples}),
            "perturbed_samples": sum(s["meta"]["perturbed"] for s in samples),
            "model_driven_samples": sum(s["meta"].get("driver") == "model" for s in samples),
            "counterfactual_samples": sum(bool(s["meta"].get("counterfactual")) for s in samples),
            "task": dict(Counter(s["task"] for s in samples)),
            "scenario": dict(Counter(s["meta"]["scenario"] for s in samples))}


def preview_tiles(out: Path, samples: list[dict], count: int) -> list[Image.Image]:
    """``draw_plan`` tiles of ``count`` plan samples spread evenly over ``samples`` (consecutive frames look alike;
    all of them when there are no more), labelled with scenario, seed, time, command, speed and any perturbation."""
    plans = [s for s in samples if s["task"] == "plan"]
    pick = np.unique(np.linspace(0, len(plans) - 1, min(count, len(plans))).round().astype(int)) if plans else []
    detect = {s["image"]: s for s in samples if s["task"] == "detect"}
    model = CameraConfig().camera_model()
    tiles = []
    for i in pick:
        s, m = plans[i], plans[i]["meta"]
        image = np.asarray(Image.open(out / s["image"]).convert("RGB"))
        boxes = fmt.parse_boxes(detect[s["image"]]["conversations"][1]["value"]).boxes if s["image"] in detect else []
        label = f"{m['scenario']} | seed {m['seed']} | t {m['t']:.1f} s | {m['command']} | {m['speed']:.1f} m/s"
        if m["perturbed"]:
            p = m["perturbation"]
            label += f" | PERTURBED {p['steer_rad']:+.2f} rad {p['accel_mps2']:+.1f} m/s2"
        if m.get("driver") == "model":
            label += " | model drives"
        if m.get("recovery"):
            label += f" | RECOVERY {m['recovery']['offset_m']:+.2f} m {m['recovery']['heading_rad']:+.3f} rad"
        waypoints = fmt.parse_waypoints(s["conversations"][1]["value"]).waypoints
        tile = draw_plan(image, waypoints, boxes, camera=model, text=label)
        tiles.append(tile.resize((tile.width * PREVIEW_SCALE, tile.height * PREVIEW_SCALE), Image.NEAREST))
    return tiles


def write_preview(path: Path, tiles: list[Image.Image], columns: int = PREVIEW_COLUMNS) -> Path | None:
    if not tiles:
        return None
    w, h = tiles[0].size
    cols = min(columns, len(tiles))
    sheet = Image.new("RGB", (cols * w, math.ceil(len(tiles) / cols) * h), (0, 0, 0))
    for k, tile in enumerate(tiles):
        sheet.paste(tile, ((k % cols) * w, (k // cols) * h))
    sheet.save(path, format="PNG")
    return path


# --------------------------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wamdiff-train data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    g = sub.add_parser("generate", help="roll out the expert and export conversation JSON")
    g.add_argument("--scenarios", default="all", help="comma-separated scenario names, or 'all'")
    g.add_argument("--scenario-file", default=None, help="a scenario YAML, or v1 / v2 for a frozen set (default v1)")
    g.add_argument("--episodes", type=int, required=True, help="episodes per scenario and split")
    g.add_argument("--split", default="train", help=f"comma-separated, of {', '.join(SPLIT_SEED_BASE)}")
    g.add_argument("--seed-offset", type=int, default=0, help="first episode index within the split")
    g.add_argument("--sample-period", type=float, default=0.5, help="seconds between samples")
    g.add_argument("--noise-fraction", type=float, default=0.5, help="fraction of perturbed episodes")
    g.add_argument("--driver", default=None, metavar="MODEL",
                   help="DAgger: a model folder or checkpoint that drives part of each episode; labels stay the "
                        "expert's (use --noise-fraction 0 and fresh --seed-offset episodes)")
    g.add_argument("--expert-share", type=float, default=0.5,
                   help="with --driver: probability that a sample interval (--sample-period) is driven by the expert")
    g.add_argument("--questions", type=int, default=2, help="ask samples per image")
    g.add_argument("--counterfactual-commands", action="store_true",
                   help="junction scenarios: also label each approach frame with the expert's plan under every "
                        "other command (extra plan samples on the same image, meta.counterfactual)")
    g.add_argument("--format-version", type=int, default=fmt.FORMAT_VERSION, choices=fmt.FORMAT_VERSIONS,
                   help="the plan answers' waypoint format (wamdiff_ros.format; default: %(default)s, the shipped "
                        "model's; 1: WAM-Diff2's free width)")
    g.add_argument("--route-points", action="store_true",
                   help="write the optional route line (the route lane's centre 10 m and 30 m ahead, ego frame; not "
                        "in the paper's prompt) into every plan prompt, a counterfactual's of its own command's "
                        "route; meta.route_points keeps the floats")
    g.add_argument("--max-seconds", type=float, default=None, help="cut each episode after this sim time")
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--preview", type=int, default=16, help="plan samples in preview.png (0: none)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace these splits' files in a non-empty --out (other splits are kept)")
    g.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("recoveries", help="single plan frames with the ego placed off its lane centre and off the "
                                          "lane direction, in traffic, labelled by the expert")
    c.add_argument("--scenarios", default="highway", help="comma-separated scenario names, or 'all'")
    c.add_argument("--scenario-file", default=None, help="a scenario YAML, or v1 / v2 for a frozen set (default v1)")
    c.add_argument("--samples", type=int, required=True, help="recovery worlds per scenario (a few are skipped)")
    c.add_argument("--split", default="train", help=f"one of {', '.join(SPLIT_SEED_BASE)}")
    c.add_argument("--seed-offset", type=int, default=0, help="first recovery world within the split")
    c.add_argument("--max-offset", type=float, default=MAX_OFFSET_M,
                   help="largest sideways offset from the lane centre, m (default: %(default)s)")
    c.add_argument("--max-heading", type=float, default=MAX_HEADING_RAD,
                   help="largest heading error, rad (default: %(default)s)")
    c.add_argument("--format-version", type=int, default=fmt.FORMAT_VERSION, choices=fmt.FORMAT_VERSIONS,
                   help="the plan answers' waypoint format (wamdiff_ros.format; default: %(default)s, the shipped "
                        "model's; 1: WAM-Diff2's free width)")
    c.add_argument("--route-points", action="store_true",
                   help="write the optional route line into every plan prompt, as `generate --route-points` does")
    c.add_argument("--workers", type=int, default=1)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--preview", type=int, default=16, help="samples in preview.png (0: none)")
    c.add_argument("--overwrite", action="store_true", help="replace this split's files in a non-empty --out")
    c.add_argument("--no-progress", action="store_true")
    return parser


def _check(args: argparse.Namespace, splits: list[str]) -> None:
    bad = [s for s in splits if s not in SPLIT_SEED_BASE]
    if bad or not splits:
        raise DatasetError(f"--split: unknown split(s) {bad or splits}; expected {', '.join(SPLIT_SEED_BASE)}")
    for name, ok in (("--episodes", args.episodes >= 1), ("--workers", args.workers >= 1),
                     ("--preview", args.preview >= 0), ("--questions", args.questions >= 0),
                     ("--sample-period", args.sample_period > 0), ("--noise-fraction", 0 <= args.noise_fraction <= 1),
                     ("--expert-share", 0 <= args.expert_share <= 1),
                     ("--max-seconds", args.max_seconds is None or args.max_seconds > 0),
                     ("--seed-offset", 0 <= args.seed_offset <= SEEDS_PER_SPLIT - args.episodes)):
        if not ok:
            raise DatasetError(f"{name}: out of range: {getattr(args, name[2:].replace('-', '_'))}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())) and not args.overwrite:
        raise DatasetError(f"--out {args.out} exists and is not empty; pass --overwrite to replace its "
                         f"{', '.join(splits)} split(s)")


def _read_manifest(path: Path, format_version: int, route_points: bool, replacing: list[str]) -> dict:
    """The folder's manifest (empty without one). A folder holds one plan format: an export into a folder whose
    other splits have another waypoint format or route line setting is refused."""
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    kept = sorted(set(manifest.get("splits", {})) - set(replacing))
    theirs = (manifest.get("format_version"), manifest.get("route_points"))
    if kept and theirs != (format_version, route_points):
        raise DatasetError(f"{path.parent}: its split(s) {', '.join(kept)} have format version {theirs[0]} and route "
                           f"points {theirs[1]}, not {format_version} and {route_points}; export into another --out")
    return manifest


def generate(args: argparse.Namespace, argv: list[str]) -> None:
    splits = [s.strip() for s in args.split.split(",") if s.strip()]
    scenarios = load_scenarios(args.scenario_file)
    specs = scenarios.select(args.scenarios)
    _check(args, splits)
    config = RolloutConfig(args.sample_period, NoiseConfig(fraction=args.noise_fraction), args.questions,
                           args.max_seconds, expert_share=args.expert_share,
                           counterfactual_commands=args.counterfactual_commands, route_points=args.route_points)
    if args.driver is not None and not Path(args.driver).is_dir():
        raise DatasetError(f"--driver {args.driver}: not a model folder")
    sample_steps(config.sample_period_s, 1.0 / scenarios.sim_hz, "--sample-period")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = _read_manifest(manifest_path, args.format_version, args.route_points, splits)
    manifest.update({
        "generator": "wamdiff_training.world.dataset", "generator_version": DATASET_VERSION,
        "format_version": args.format_version,
        "scenario_set": {"version": scenarios.version, "source": scenarios.source},
        "camera": asdict(config.camera), "split_seed_base": SPLIT_SEED_BASE, "questions": questions.QUESTIONS,
        "noise": asdict(config.noise), "replan_hz": REPLAN_HZ,
        "counterfactual_commands": config.counterfactual_commands, "route_points": config.route_points,
        "dagger": None if args.driver is None else {"driver": str(args.driver), "expert_share": args.expert_share},
    })
    manifest.setdefault("splits", {})
    preview_from = None
    for split in splits:
        (out / f"{split}.json").unlink(missing_ok=True)
        shutil.rmtree(out / "images" / split, ignore_errors=True)
        samples, episodes = generate_split(out, specs, args.episodes, split, config, scenarios, args.seed_offset,
                                           args.workers, not args.no_progress, args.driver, args.format_version)
        (out / f"{split}.json").write_text(json.dumps(samples, indent=1))
        base = SPLIT_SEED_BASE[split] + args.seed_offset
        manifest["splits"][split] = {
            "command_line": ["wamdiff-train", "data", *argv],
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "scenarios": [s.name for s in specs], "seeds": [base, base + args.episodes - 1],
            "counts": counts(samples), "episodes": episodes,
        }
        preview_from = preview_from or (split, samples)
        print(f"{split}: {len(samples)} samples from {len(episodes)} episodes -> {out / f'{split}.json'}")
    manifest_path.write_text(json.dumps(manifest, indent=1))
    (out / "preview.png").unlink(missing_ok=True)
    if args.preview and preview_from is not None:
        path = write_preview(out / "preview.png", preview_tiles(out, preview_from[1], args.preview))
        if path is not None:
            print(f"preview -> {path}")


def recoveries(args: argparse.Namespace, argv: list[str]) -> None:
    scenarios = load_scenarios(args.scenario_file)
    specs = scenarios.select(args.scenarios)
    if args.split not in SPLIT_SEED_BASE:
        raise DatasetError(f"--split: unknown split {args.split!r}; expected one of {', '.join(SPLIT_SEED_BASE)}")
    for name, ok in (("--samples", args.samples >= 1), ("--workers", args.workers >= 1),
                     ("--preview", args.preview >= 0), ("--seed-offset", args.seed_offset >= 0)):
        if not ok:
            raise DatasetError(f"{name}: out of range: {getattr(args, name[2:].replace('-', '_'))}")
    config = RecoveryConfig(max_offset_m=args.max_offset, max_heading_rad=args.max_heading)
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.overwrite:
        raise DatasetError(f"--out {out} exists and is not empty; pass --overwrite to replace its {args.split} split")
    recovery_seed(args.split, args.seed_offset, args.samples - 1)  # the range fits before anything is written
    manifest_path = out / "manifest.json"
    manifest = _read_manifest(manifest_path, args.format_version, args.route_points, [args.split])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.split}.json").unlink(missing_ok=True)
    shutil.rmtree(out / "images" / args.split, ignore_errors=True)
    samples, skipped = generate_recoveries(out, specs, args.samples, args.split, config, scenarios,
                                           args.seed_offset, args.workers, not args.no_progress, args.route_points,
                                           args.format_version)
    (out / f"{args.split}.json").write_text(json.dumps(samples, indent=1))
    manifest.update({"generator": "wamdiff_training.world.dataset", "generator_version": DATASET_VERSION,
                     "format_version": args.format_version,
                     "scenario_set": {"version": scenarios.version, "source": scenarios.source},
                     "camera": asdict(CameraConfig()), "recovery": asdict(config), "route_points": args.route_points})
    first = recovery_seed(args.split, args.seed_offset, 0)
    manifest.setdefault("splits", {})[args.split] = {
        "command_line": ["wamdiff-train", "data", *argv], "scenarios": [s.name for s in specs],
        "seeds": [first, first + args.samples - 1], "skipped": skipped, "counts": counts(samples)}
    manifest_path.write_text(json.dumps(manifest, indent=1))
    print(f"{args.split}: {len(samples)} recovery samples ({skipped} worlds skipped: no clear placement) -> "
          f"{out / f'{args.split}.json'}")
    (out / "preview.png").unlink(missing_ok=True)
    if args.preview and samples:
        path = write_preview(out / "preview.png", preview_tiles(out, samples, args.preview))
        print(f"preview -> {path}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.action == "recoveries":
            recoveries(args, argv)
        else:
            generate(args, argv)
    except (ScenarioError, DatasetError) as exc:
        print(f"wamdiff-train data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
