"""``wamdiff-train export``: a trained checkpoint -> the model folder shipped inside ``wamdiff_ros`` (+ model card).

Copies the inference files of one checkpoint (config, safetensors weights, tokenizer, image processor, decode
metadata; not the optimiser state) into ``--out``, checks the copy loads and plans, and writes ``README.md``, the
model card: data, stages, what camera and rate the model expects, measured metrics (from ``training/results``, the
logs behind ``training/RESULTS.md``) and limits. ``make ship-tiny`` exports the tiny hierarchy's final student to
``wamdiff_ros/assets/wamdiff-tiny``, the package's default model.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import yaml

from wamdiff_ros.errors import CheckpointError
from wamdiff_training import checkpoint
from wamdiff_training.config import ConfigError

INFERENCE_FILES = ("config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
                   "tokenizer.json", "tokenizer_config.json", "wamdiff.json")
MAX_MB = 25.0  # what the package may carry


def _run_config(ckpt: Path) -> dict:
    """The resolved config.yaml of the run that wrote ``ckpt`` (``<run>/checkpoints/step-N``), if any."""
    path = ckpt.parent.parent / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def _data_manifest(config: dict) -> dict:
    for train in (config.get("data") or {}).get("train") or []:
        path = Path(train).parent / "manifest.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def copy_checkpoint(source: str | Path, out: Path) -> Path:
    """Resolve ``source`` (a checkpoint folder or a run's out.dir) and copy its inference files into ``out``."""
    ckpt = checkpoint.resolve(checkpoint.LATEST, source) if (Path(source) / "checkpoints").is_dir() else Path(source)
    missing = [name for name in INFERENCE_FILES if not (ckpt / name).is_file()]
    if missing:
        raise CheckpointError(f"{ckpt}: not an exportable checkpoint, missing {', '.join(missing)}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in INFERENCE_FILES:
        shutil.copy2(ckpt / name, tmp / name)
    size_mb = sum(f.stat().st_size for f in tmp.iterdir()) / 2**20
    if size_mb > MAX_MB:
        shutil.rmtree(tmp)
        raise CheckpointError(f"{ckpt}: {size_mb:.1f} MB of inference files exceed the package's {MAX_MB:.0f} MB")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return ckpt


def stages_text(plan_path: str | None) -> str:
    """The card's "Stages" line: the recipe of the hierarchy plan that trained the model (its DAgger rounds and
    step counts when ``plan_path`` is given), else the hierarchy's generic order."""
    if plan_path is None:
        return ("- Stages (`make train-tiny`): AR multi-task pretraining of a teacher (2x wider, 2x deeper) and of "
                "this student -> Stage I progressive block adaptation B = 1 -> 4 -> 8 -> 16 -> 32 (both) -> Stage II "
                "block-wise distillation (each model's B = 8 phase teaches its B = 32 phase, symmetric JSD) -> "
                "Stage III cross-scale distillation from the teacher's B = 32 model into this student.")
    from wamdiff_training.hierarchy import adapt_schedule, load_plan

    plan = load_plan(plan_path)
    s, t = plan.student, plan.teacher
    head = ", the B = 1 in-place head trained beside the next-token one" if plan.ar_in_place_weight > 0 else ""
    parts = [f"AR multi-task pretraining of a teacher ({_ar_text(plan, t)}) and of this student ({_ar_text(plan, s)})"
             f"{head}"]
    if plan.recoveries is not None:
        r = plan.recoveries
        parts[0] += (f", with {r.samples} lane recovery frames per scenario ({r.scenarios}; `wamdiff-train data "
                     "recoveries`) in every run")
    lender = "teacher" if s.dagger_from else "student"
    borrower = " (the other model trains on its exports)" if (s.dagger_from or t.dagger_from) else ""
    if plan.dagger is not None:
        d = plan.dagger
        parts.append(f"{d.rounds} DAgger round{'s' if d.rounds > 1 else ''} (each {d.episodes} fresh episodes per "
                     f"scenario driven by the {lender}{borrower}, the expert labelling every frame; {d.steps} more AR "
                     "steps on all data so far)")
    curriculum = " -> ".join(str(b) for b in plan.curriculum)
    parts.append(f"Stage I progressive block adaptation B = {curriculum} (this student: "
                 f"{'/'.join(str(n) for n in adapt_schedule(plan, s))} steps; the teacher: "
                 f"{'/'.join(str(n) for n in adapt_schedule(plan, t))})")
    if plan.adapt_dagger is not None:
        a = plan.adapt_dagger
        parts.append(f"{a.rounds} DAgger round{'s' if a.rounds > 1 else ''} driven by the {lender}'s B = "
                     f"{plan.curriculum[-1]} model ({a.steps} steps at that B)")
    parts.append(f"Stage II block-wise distillation ({plan.distill_steps} steps; each model's B = "
                 f"{plan.distill_teacher_block} phase teaches its B = {plan.curriculum[-1]} phase, symmetric JSD)")
    anchor = f", plus {plan.cross_scale_ce_weight:g} × cross-entropy to the ground truth" \
        if plan.cross_scale_ce_weight else ""
    parts.append(f"Stage III cross-scale distillation from the teacher's B = {plan.curriculum[-1]} model into this "
                 f"student ({plan.cross_scale_steps} steps{anchor})")
    if plan.lowspeed is not None:
        parts.append(lowspeed_text(plan))
    return f"- Stages (`wamdiff-train hierarchy --plan {plan_path}`): " + " -> ".join(parts) + "."


def lowspeed_text(plan) -> str:
    """The low-speed continuation's recipe (``plan.lowspeed``), for the card's stages."""
    low, d = plan.lowspeed, plan.lowspeed.dagger
    start = (f"from `{low.init}` (the chain's Stage III student, as shipped before this continuation)" if low.init
             else "from Stage III's run")
    lr = f", lr {low.lr:g}" if low.lr else ""
    text = (f"low-speed continuation at B = {plan.curriculum[-1]} {start} on scenario set {low.scenario_file}: "
            f"{low.episodes} expert episodes per scenario of {low.scenarios.replace(',', ', ')} and {low.replay} per "
            f"scenario of the chain's set (replay)")
    if low.variants:
        v = low.variants
        text += (f", {v.episodes} per scenario of {v.scenarios.replace(',', ', ')} from `{v.scenario_file}` "
                 "(training only)")
    text += f", {low.steps} steps{lr}"
    if low.task_weights:
        text += " (sampling weights " + ", ".join(f"{k} {v:g}" for k, v in low.task_weights.items()) + ")"
    if d is not None:
        shares = ", ".join(f"{d.share(r):g}" for r in range(1, d.rounds + 1))
        over = f"scenario of {low.dagger_scenarios.replace(',', ', ')}" if low.dagger_scenarios else "new scenario"
        text += (f"; then {d.rounds} DAgger round{'s' if d.rounds > 1 else ''} ({d.episodes} episodes per {over} "
                 f"driven by the model so far, expert share {shares}; {d.steps} steps each on all its data)")
    return text


def _ar_text(plan, model) -> str:
    steps = model.ar_steps if model.ar_steps is not None else plan.ar_steps
    return f"hidden {model.hidden}, {model.layers} layers; {steps} steps"


def model_card(out: Path, ckpt: Path, results: Path | None, name: str, plan: str | None = None) -> str:
    from wamdiff_ros.world.camera import CameraConfig
    from wamdiff_training.hierarchy import load_plan

    config = _run_config(ckpt)
    manifest = _data_manifest(config)
    model_config = json.loads((out / "config.json").read_text())
    text, vision = model_config["text_config"], model_config["vision_config"]
    meta = json.loads((out / "wamdiff.json").read_text())
    params = _parameters(out / "model.safetensors")
    camera = CameraConfig()
    size_mb = sum(f.stat().st_size for f in out.iterdir() if f.name != "README.md") / 2**20
    lines = [
        f"# {name}: the tiny WAM-Diff2-style student shipped with wamdiff_ros",
        "",
        "**Trained on a synthetic world (highway-env scenarios with a flat-shaded rendered camera). It is not "
        "road-ready and must never drive a real vehicle.** It exists so the package's demo, node and evaluator run "
        "a model that was really trained by the package's own pipeline, end to end, on a laptop CPU.",
        "",
        "## What it is",
        f"- Qwen3-VL architecture, {params / 1e6:.2f} M parameters ({size_mb:.1f} MB of fp32 safetensors): text "
        f"decoder hidden {text['hidden_size']}, {text['num_hidden_layers']} layers, {text['num_attention_heads']} "
        f"heads; vision tower hidden {vision['hidden_size']}, depth {vision['depth']}, patch "
        f"{vision['patch_size']}; the package's offline tokenizer ({text['vocab_size']} tokens).",
        f"- Decoder: block-causal masked diffusion, trained block size B = {meta['trained_block_size']} "
        f"({meta['prediction']} prediction, prompt prefilled as {meta['prompt_attention']}). Decode it at B = 32 "
        "with the threshold schedule (the package's defaults).",
        stages_text(plan),
        f"- Exported from `{ckpt}` (its run's resolved config: `{ckpt.parent.parent / 'config.yaml'}`).",
        "",
        "## Data",
    ]
    version = manifest.get("scenario_set", {}).get("version", "?")
    recipe = load_plan(plan) if plan is not None else None
    low = recipe.lowspeed if recipe is not None else None
    if manifest and (version == 1 or low is not None):
        lines.append("- Exported by `wamdiff-train data generate` from the frozen scenario set v1 (highway "
                     "overtaking, on-ramp merge, roundabout with a commanded exit, unsignalised intersection), "
                     f"training seeds from {manifest.get('split_seed_base', {}).get('train', 0)}; the privileged "
                     "expert's plans, with DAgger-lite perturbed episodes for recoveries; tasks: plan (8 waypoints), "
                     "detect (2D boxes), ask (five templated questions).")
    elif manifest:
        lines.append(f"- Exported by `wamdiff-train data generate` from scenario set v{version}; the privileged "
                     "expert's plans, with DAgger-lite perturbed episodes for recoveries.")
    rounds = [f for f in (config.get("data") or {}).get("train") or []
              if any("dagger" in part for part in Path(f).parts[-4:-1])]
    if low is not None:
        chain = sum(x.rounds for x in (recipe.dagger, recipe.adapt_dagger) if x is not None)
        lines.append(f"- Plus {chain} DAgger round exports of the chain (fresh training seeds, partly driven by the "
                     "model being trained, every frame labelled by the expert).")
        what = (" (`scenarios_v2.yaml`): starts from rest on a clear road and behind a standing queue, a lead that "
                "stops and goes, a stop line at the crossing") if low.scenario_file == "v2" else ""
        lines.append(f"- Then, for the low-speed continuation, scenario set {low.scenario_file}{what} "
                     f"({low.scenarios}), {low.episodes} expert episodes each, a replay of {low.replay} per v1 "
                     f"scenario, and {len(rounds)} DAgger round export{'s' if len(rounds) != 1 else ''} driven by the "
                     "model.")
    elif rounds:
        lines.append(f"- Plus {len(rounds)} DAgger round exports (fresh training seeds, partly driven by the model "
                     "being trained, every frame labelled by the expert).")
    lines += [
        "",
        "## What it expects",
        f"- One front camera, {camera.width}x{camera.height} RGB, {camera.fov_deg:.0f} deg horizontal field of "
        f"view, mounted {camera.mount_forward_m} m ahead of the vehicle centre, {camera.mount_height_m} m high, "
        f"pitched {camera.pitch_deg} deg down (the world's camera; Bench2Drive agent sensors use the same card).",
        "- Ego velocity and acceleration in the ego frame (x forward, y left, m/s, m/s^2) and a navigation "
        "command (left, right, straight, follow).",
        "- A plan request every 0.2-0.5 s; each plan is 8 waypoints, one every 0.5 s, in the ego frame. The "
        "closed-loop figures below used 2 Hz, each plan followed as it comes. At 5 Hz (`wamdiff-eval`'s default, "
        "the CARLA agent's rate) it drives as well, blended (the follower's `highway_env` gains, "
        "`plan_blend_tau_s`) or not; blended, fewer of its routes run out of time.",
        "",
        "## Measured",
    ]
    lines += _metrics(results, lowspeed=low is not None)
    lines += [
        "",
        "## Limits",
        "- Synthetic world only: flat-shaded boxes for vehicles, no pedestrians, lights or signs, four scenario "
        "kinds; it has never seen a real image.",
        "- Tiny capacity: boxes and answers are far from a real VLA's; driving skill is what the closed-loop table "
        "says and no more.",
        "- Junctions are the weakest part: at the intersection most failed routes end inside the junction (the "
        "package README's Limitations). A model trained with route points (`route_points` in wamdiff.json) needs "
        "the route: without it it plans from a prompt it was not trained on.",
        "- Every figure above comes from `training/results/*.json` (regenerate `training/RESULTS.md` with "
        "`make results`).",
        "",
    ]
    return "\n".join(lines)


def _parameters(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _metrics(results: Path | None, lowspeed: bool = False) -> list[str]:
    if results is None or not results.is_dir():
        return ["- No results logged yet: run `make results-eval`."]
    try:
        from wamdiff_training.render import card_metrics
    except ImportError:
        return ["- See training/RESULTS.md."]
    return card_metrics(results, lowspeed=lowspeed)


def eval_summary(results: Path | None, lowspeed: bool = False) -> dict | None:
    """The exported model's paused-mode closed-loop score (what ``wamdiff-demo`` quotes): for the low-speed
    continuation (``lowspeed``) over every scenario of its comparison (``lowspeed.json``, the model it names "new"),
    else the chain's student's from ``closed_loop.json``."""
    if results is None:
        return None
    from wamdiff_training.render import LOWSPEED

    low = results / LOWSPEED
    if lowspeed and low.is_file():
        piece = json.loads(low.read_text())
        row = next((r for r in piece["rows"] if r["scenario"] == "all" and r["mode"] == "paused"), None)
        if row is not None:
            version = piece["runs"]["new"].get("scenario_version", "?")
            return {"driving_score": row["new_ds"], "ci90": [row["new_ds_lo"], row["new_ds_hi"]],
                    "episodes": row["episodes"], "mode": "paused",
                    "source": f"training/RESULTS.md (g), scenario set v{version}"}
    path = results / "closed_loop.json"
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get("entries", {}).get("student", {})
    for group in entry.get("groups", []):
        if group.get("mode") == "paused" and group.get("ds") is not None:
            return {"driving_score": group["ds"], "ci90": [group["ds_lo"], group["ds_hi"]],
                    "episodes": group["episodes"], "mode": "paused", "source": "training/RESULTS.md"}
    return None


def _smoke(out: Path) -> None:
    """The exported folder loads through the package's own loader and plans one held-out-like frame."""
    import numpy as np

    from wamdiff_ros.planner import EgoState, Planner

    planner = Planner.from_pretrained(str(out))
    image = np.zeros((128, 256, 3), dtype=np.uint8)
    planner.plan(image, EgoState((8.0, 0.0), (0.0, 0.0)), "follow")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-train export", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None,
                   help="a checkpoint folder or a run's out.dir (its latest); default: --plan's final student "
                        "(student/cross_scale)")
    p.add_argument("--out", required=True, help="the model folder to (re)write")
    p.add_argument("--results", default="training/results", help="logged results for the card's metrics")
    p.add_argument("--name", default="wamdiff-tiny")
    p.add_argument("--plan", default=None, help="the hierarchy plan that trained it (the card's stages and steps)")
    args = p.parse_args(argv)
    if args.checkpoint is None and args.plan is None:
        p.error("give --checkpoint, or --plan to export its final student")
    out = Path(args.out)
    try:
        from wamdiff_training.hierarchy import final_run, load_plan

        recipe = load_plan(args.plan) if args.plan is not None else None
        if args.checkpoint is None:
            args.checkpoint = str(final_run(recipe))
        ckpt = copy_checkpoint(args.checkpoint, out)
        _smoke(out)
        (out / "README.md").write_text(model_card(out, ckpt, Path(args.results), args.name, args.plan))
        summary = eval_summary(Path(args.results), lowspeed=recipe is not None and recipe.lowspeed is not None)
        if summary is not None:
            (out / "eval_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    except (CheckpointError, ConfigError, OSError, ValueError) as exc:
        print(f"wamdiff-train export: error: {exc}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"exported {ckpt} -> {out} ({size:.1f} MB)")
    return 0
