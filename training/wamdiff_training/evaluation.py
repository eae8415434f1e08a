"""``wamdiff-train eval``: checkpoints on a held-out split (anchors §1: the exposure-bias curve, ρ_k, tokens/s).

Open loop, per checkpoint, each decoding in its own convention (AR or blocks, from ``wamdiff.json``):
plan records -> per-waypoint L2 to the reference, invalid-plan rate, forward calls per token and decode tokens/s per
confidence threshold; detect records -> precision / recall / AP at IoU 0.5; ask records -> exact match. Teacher
forced, on fixed noisy states of every answer: in-place token accuracy (BD3 states at the decode block size; AR
checkpoints: the shifted next-token accuracy) and, with ``--teacher``, top-K overlap ρ_k. ``--closed-loop`` adds
the driving score of ``wamdiff-eval closed-loop``. Writes eval.json, eval.csv and PNGs. Exit status: 0 done, 2 a
bad path or argument, 1 anything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.cli import load_rgb
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.decoding.unmask import SCHEDULES
from wamdiff_ros.errors import CheckpointError, WamDiffError
from wamdiff_ros.model import TINY_RANDOM, ModelBundle, load
from wamdiff_ros.planner import Answer, Detection, EgoState, Plan, Planner
from wamdiff_training.world.questions import read_lead_answer
from wamdiff_training import checkpoint, plots
from wamdiff_training.data import (BEHAVIOURS, TURN_END_M, Record, RecordError, Sample, behaviour_of,
                                  encode_record, load_records, turn_ahead)
from wamdiff_training.detection import detection_metrics
from wamdiff_training.layout import IGNORE, NEXT_TOKEN, NoiseConfig, ar_layout, diffusion_batch, forward_layouts
from wamdiff_training.losses import masked_cross_entropy, token_accuracy
from wamdiff_training.overlap import Overlap, ar_aligned_overlap, as_waypoints, model_overlap, waypoint_l2
from wamdiff_training.stages.common import NoisyState, answer_tokens, prompt_inputs

TASKS = ("plan", "detect", "ask")
_PLAN_TEXT = re.compile(r"navigation information is: (?P<cmd>[a-z ]+)\n.*velocity is: "
                        r"\((?P<vx>[-\d.]+),(?P<vy>[-\d.]+)\) and current accelerate is: "
                        r"\((?P<ax>[-\d.]+),(?P<ay>[-\d.]+)\)", re.S)
_COMMANDS = {c.phrase: c for c in fmt.Command}


class EvalError(WamDiffError, ValueError):
    """A bad path or argument of ``wamdiff-train eval``; the message names it."""


@dataclass(slots=True)
class Subject:
    """One loaded checkpoint and how it decodes."""

    path: str
    label: str
    bundle: ModelBundle
    settings: DecodeSettings

    @property
    def ar(self) -> bool:
        return self.bundle.meta.prediction == NEXT_TOKEN

    @property
    def legend(self) -> str:
        return f"{self.label} · " + ("AR" if self.ar else f"B={self.settings.block_size}")


# -- inputs -----------------------------------------------------------------------------------------------------------


def evenly_spaced(items: list, n: int | None) -> list:
    """At most ``n`` of ``items`` spread evenly over the list (an export is ordered by scenario and seed, so every
    scenario is represented, not just the first episodes); all of them when ``n`` is None."""
    if n is None or n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


def resolve_checkpoint(text: str, flag: str = "--checkpoint") -> str:
    """A checkpoint folder, a run's ``out.dir`` or a ``checkpoints/latest`` pointer (its newest checkpoint), or
    tiny-random."""
    path = Path(text)
    try:
        if text == TINY_RANDOM:
            return text
        if path.is_file() and path.name == checkpoint.LATEST:
            return str(checkpoint.resolve(checkpoint.LATEST, path.parent.parent))
        run_latest = path / "checkpoints" / checkpoint.LATEST
        if path.is_dir() and not (path / "config.json").is_file() and run_latest.is_file():
            return str(checkpoint.resolve(checkpoint.LATEST, path))
    except CheckpointError as exc:
        raise EvalError(f"{flag} {text}: {exc}") from exc
    if not (path / "config.json").is_file():
        raise EvalError(f"{flag} {text}: not a checkpoint folder (no config.json), run folder or checkpoints/latest")
    return text


def labels_of(paths: list[str]) -> list[str]:
    """Short unique names: ``<run>/step-N`` for engine checkpoints, else the folder name."""
    out = []
    for p in paths:
        path = Path(p)
        name = f"{path.parent.parent.name}/{path.name}" if path.parent.name == "checkpoints" else path.name or p
        out.append(name if name not in out else f"{name}#{len(out)}")
    return out


def plan_inputs(record: Record) -> tuple[EgoState, fmt.Command, np.ndarray | None]:
    """Ego state, command and route points (None without a route line) from the planning prompt (2-decimal floats:
    ``plan_prompt`` rebuilds it exactly)."""
    m = _PLAN_TEXT.search(record.user)
    if m is None or m["cmd"] not in _COMMANDS:
        raise RecordError(record.source, "not a planning prompt (no command / velocity / acceleration)", field="user")
    ego = EgoState((float(m["vx"]), float(m["vy"])), (float(m["ax"]), float(m["ay"])))
    return ego, _COMMANDS[m["cmd"]], fmt.parse_route_line(record.user)


def question_of(record: Record) -> str:
    _, sep, question = record.user.partition("Question:")
    return question.strip() if sep else record.user.replace(fmt.IMAGE_PLACEHOLDER, "").strip()


def load_subject(path: str, label: str, args: argparse.Namespace, threshold: float, flag: str = "--checkpoint"
                 ) -> Subject:
    """The checkpoint on ``--device`` (fp32) with its decode settings: AR for next-token checkpoints, else blocks of
    ``--block-size`` (default min(32, trained)); no reflection: the open-loop rows measure the model's own drafts
    (its steps back, calls per token), comparable with every earlier run (``--closed-loop`` drives the planner as
    shipped, reflection on)."""
    try:
        bundle = load(path, device=args.device)
        ar = bundle.meta.prediction == NEXT_TOKEN
        block = 1 if ar else (args.block_size or min(DecodeSettings().block_size, bundle.meta.trained_block_size))
        bundle.meta.check_block_size(block)
        settings = DecodeSettings(block_size=block, steps=args.steps or DecodeSettings().steps, threshold=threshold,
                                  schedule=args.schedule or DecodeSettings().schedule,
                                  max_new_tokens=args.max_new_tokens, reflect=False)
    except WamDiffError as exc:  # CheckpointError / DecodeSettingsError: say which checkpoint
        raise EvalError(f"{flag} {path}: {exc}") from exc
    return Subject(path, label, bundle, settings)


# -- open loop ------------------------------------------------------------------------------------------------------


def _speed(plans: list[Plan] | list[Detection] | list[Answer]) -> dict:
    calls = sum(p.stats.forward_calls for p in plans)
    tokens = sum(p.stats.new_tokens for p in plans)
    decode_s = sum(p.stats.decode_s for p in plans)
    return {"forward_calls": calls, "new_tokens": tokens, "decode_s": decode_s,
            "forward_calls_per_token": calls / tokens if tokens else math.nan,
            "tokens_per_s": tokens / decode_s if decode_s > 0 else math.nan,
            "latency_ms": 1e3 * sum(p.stats.vision_s + p.stats.prefill_s + p.stats.decode_s for p in plans)
            / max(len(plans), 1)}


def constant_velocity_plan(ego: EgoState) -> np.ndarray:
    """The constant-velocity baseline's waypoints (``ConstantVelocityPlanner``) for an ego state."""
    t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
    return t * np.asarray(ego.velocity, dtype=np.float64)[None]


TURN_MIN_LATERAL_M = 1.0  # a reference plan whose last waypoint is this far to one side turns


def turn_shortfall(predicted: list, references: list[np.ndarray]) -> tuple[int, float | None]:
    """How far short of the reference's turn the valid predictions end, sideways, at the last waypoint: over the
    references that turn (|y8| >= TURN_MIN_LATERAL_M, y to the left), the mean of |y8| - sign(y8) * predicted y8.
    Positive: the plans under-turn (cut the turn short or go straight); 0: as far as the expert; negative: over.
    Returns (turning references with a valid prediction, the mean or None when there are none)."""
    gaps = []
    for prediction, truth in zip(predicted, references):
        waypoints, y = as_waypoints(prediction), float(np.asarray(truth)[-1, 1])  # as waypoint_l2 reads them
        if waypoints is not None and abs(y) >= TURN_MIN_LATERAL_M:
            gaps.append(abs(y) - math.copysign(1.0, y) * float(waypoints[-1, 1]))
    return len(gaps), (float(np.mean(gaps)) if gaps else None)


def turn_starts(predicted: list, references: list[np.ndarray], starts: list[bool]) -> dict:
    """Over the references that begin a turn (``starts``: junction records whose reference ``turn_ahead`` flags: it
    ends >= TURN_END_M to one side while its 1 s waypoint is still straight ahead), how many valid predictions end at
    least TURN_END_M to that side (``begun``), and the median of how far they end to it (m; negative: the other)."""
    sideways = []
    for prediction, truth, start in zip(predicted, references, starts):
        waypoints = as_waypoints(prediction)
        if start and waypoints is not None:
            sideways.append(math.copysign(1.0, float(np.asarray(truth)[-1, 1])) * float(waypoints[-1, 1]))
    return {"references": sum(starts), "valid": len(sideways), "begun": sum(y >= TURN_END_M for y in sideways),
            "median_sideways_m": float(np.median(sideways)) if sideways else None}


STEP_BACK_M = 1.0  # a waypoint whose x lies this far behind the one before it steps back


def steps_back(predicted: list, references: list[np.ndarray]) -> dict:
    """How many valid plans step back: some waypoint's x lies more than STEP_BACK_M behind the one before it (the
    references' count beside it). Block decoding fixes a number's digits in any order, and a tiny student writes
    some tens digits wrong (``…,039.13,…,059.13,…,050.13``); the follower drops such
    waypoints (``control.follower.forward_path``)."""
    def back(waypoints) -> bool:
        return waypoints is not None and bool((np.diff(np.asarray(waypoints)[:, 0]) < -STEP_BACK_M).any())

    valid = [as_waypoints(p) for p in predicted]
    return {"valid": sum(w is not None for w in valid), "plans": sum(back(w) for w in valid),
            "references": sum(back(r) for r in references)}


def counterfactual_frames(records: list[Record]) -> list[Path | None]:
    """Per plan record, its image when a ``wamdiff-train data generate --counterfactual-commands`` export labels that
    frame under several commands (some record of it is ``meta.counterfactual``), else None."""
    counterfactual = {r.image_path for r in records if r.meta.get("counterfactual")}
    return [r.image_path if r.image_path in counterfactual else None for r in records]


def frame_groups(frames: list) -> list[list[int]]:
    """Indices of the records of each frame (not None) that carries more than one record."""
    by_frame: dict = {}
    for i, frame in enumerate(frames):
        if frame is not None:
            by_frame.setdefault(frame, []).append(i)
    return [idx for idx in by_frame.values() if len(idx) > 1]


def command_response(predicted: list, references: list[np.ndarray], frames: list[str | None]) -> dict | None:
    """Whether plans follow the command: over the frames labelled under several commands (``frames``: the image
    of a plan record from a ``wamdiff-train data generate --counterfactual-commands`` export, None for the other
    records; records of one frame differ only in the command and the answer), the median spread of the last waypoint's
    sideways offset across a frame's commands, the model's next to the references', and of the references that
    turn there (|y8| >= TURN_END_M) how many plans end at least TURN_END_M to that side. None without such
    frames. A model that ignores the command plans alike under every command: spread 0."""
    groups = frame_groups(frames)
    if not groups:
        return None
    spread, ref_spread, turns, followed = [], [], 0, 0
    for idx in groups:
        ys = [as_waypoints(predicted[i]) for i in idx]
        if all(w is not None for w in ys):
            spread.append(float(np.ptp([w[-1, 1] for w in ys])))
        ref_spread.append(float(np.ptp([np.asarray(references[i])[-1, 1] for i in idx])))
        for i, w in zip(idx, ys):
            y = float(np.asarray(references[i])[-1, 1])
            if abs(y) >= TURN_END_M:
                turns += 1
                followed += w is not None and math.copysign(1.0, y) * float(w[-1, 1]) >= TURN_END_M
    return {"frames": len(groups), "plan_spread_m": float(np.median(spread)) if spread else None,
            "reference_spread_m": float(np.median(ref_spread)), "turns": turns, "followed": int(followed)}


@torch.no_grad()
def command_likelihood(subject: Subject, records: list[Record], samples: list[Sample]) -> dict | None:
    """Whether the model reads the command, whatever its decoding makes of it: over the frames labelled under
    several commands (as :func:`command_response`), each turning reference's (|y8| >= TURN_END_M) log-likelihood
    under its own command's prompt minus the mean under the frame's other prompts, in nats (AR: next token after the
    clean prefix; diffusion: every answer block masked at once after the clean reference, as Stage I trains), and
    how many references their own prompt makes likeliest. ``samples``: the plan ``records`` encoded, in order. A
    model blind to the command scores 0 and ties; greedy digits can hide a reader. None without such frames."""
    groups = frame_groups(counterfactual_frames(records))
    if not groups:
        return None
    bundle = subject.bundle
    block, pbs = subject.settings.block_size, bundle.meta.prompt_block_size
    gains, likeliest = [], 0
    for idx in groups:
        group = [samples[i] for i in idx]
        for j, i in enumerate(idx):
            sample = samples[i]
            if abs(float(fmt.parse_waypoints(records[i].answer).waypoints[-1, 1])) < TURN_END_M:
                continue
            if subject.ar:
                layouts = [ar_layout(prompt_inputs(s), sample.answer_ids, pbs) for s in group]
            else:
                answer = answer_tokens(sample, block, bundle.eos_token_id)
                layouts = [NoisyState(prompt_inputs(s), answer, torch.full_like(answer, bundle.mask_token_id),
                                      bundle.mask_token_id).layout(block, pbs) for s in group]
            out = forward_layouts(bundle.model, layouts, pad_id=bundle.eos_token_id)
            scored = out.labels != IGNORE
            token_ll = torch.log_softmax(out.logits.float(), -1).gather(-1, out.labels.clamp(min=0)[:, None])[:, 0]
            ll = [float(t[m].sum()) for t, m in zip(token_ll.split(out.lengths), scored.split(out.lengths))]
            gains.append(ll[j] - float(np.mean(ll[:j] + ll[j + 1:])))
            likeliest += ll[j] > max(ll[:j] + ll[j + 1:])
    return {"frames": len(groups), "references": len(gains),
            "gain_mean_nats": float(np.mean(gains)) if gains else None,
            "gain_median_nats": float(np.median(gains)) if gains else None, "own_likeliest": int(likeliest)}


def by_behaviour(predicted: list, references: list[np.ndarray], baselines: list[np.ndarray], groups: list[str]
                 ) -> dict:
    """Mean plan L2 per expert behaviour, next to constant velocity's on the same records: whether a model uses
    the command and the camera (a model that ignores both is no better than constant velocity at junctions); and
    the turn shortfall (:func:`turn_shortfall`) on the group's turning references."""
    out = {}
    for name in (*BEHAVIOURS, None):
        idx = [i for i, g in enumerate(groups) if g == name]
        if not idx:
            continue
        model = waypoint_l2([predicted[i] for i in idx], [references[i] for i in idx])
        cv = waypoint_l2([baselines[i] for i in idx], [references[i] for i in idx])
        turns, shortfall = turn_shortfall([predicted[i] for i in idx], [references[i] for i in idx])
        out[name or "other"] = {"plans": len(idx), "valid": model.valid, "l2_mean": model.mean,
                                "constant_velocity_l2_mean": cv.mean, "turns": turns, "turn_shortfall_m": shortfall}
    return out


def plan_row(planner: Planner, records: list[Record], images: dict, bar, threshold: float | None) -> dict:
    """Decode every plan record; per-waypoint L2 against the reference answer (the exposure-bias curve), and mean
    L2 per expert behaviour next to constant velocity's."""
    plans, references, baselines, groups, starts = [], [], [], [], []
    for r in records:
        reference = fmt.parse_waypoints(r.answer)
        if not reference.valid:
            raise RecordError(r.source, f"the plan answer does not parse ({reference.reason})", field="answer")
        ego, command, route = plan_inputs(r)  # the prompt as trained: with its route line where the record has one
        plans.append(planner.plan(images[r.image_path], ego, command, route))
        references.append(reference.waypoints)
        baselines.append(constant_velocity_plan(ego))
        groups.append(behaviour_of(r.meta))
        starts.append(groups[-1] == "junction" and turn_ahead(r.answer))
        bar.update()
    predicted = [p.waypoints if p.valid else p.text for p in plans]
    errors = waypoint_l2(predicted, references)
    return {"threshold": threshold, "plans": len(plans), "valid": errors.valid, "invalid": errors.invalid,
            "invalid_rate": errors.invalid / len(plans) if plans else math.nan,
            "l2_per_waypoint": errors.per_waypoint.tolist(), "l2_mean": errors.mean,
            "by_behaviour": by_behaviour(predicted, references, baselines, groups),
            "turn_starts": turn_starts(predicted, references, starts),
            "steps_back": steps_back(predicted, references),
            "command_response": command_response(predicted, references, counterfactual_frames(records)),
            **_speed(plans)}


def ask_breakdown(pairs: list[tuple[Answer, Record]]) -> dict:
    """Exact match per question (meta.question, else the question text) and, for the lead-vehicle question, how well
    the distance is read off the image: mean absolute error and Pearson r against the reference, next to the error
    of always answering the reference mean (what a model blind to the image can do at best)."""
    groups: dict[str, list[tuple[Answer, Record]]] = {}
    for p, r in pairs:
        groups.setdefault(str(r.meta.get("question") or question_of(r)), []).append((p, r))
    out = {"per_question": {k: {"records": len(v), "exact_match": float(np.mean([p.text.strip() == r.answer.strip()
                                                                                  for p, r in v]))}
                            for k, v in sorted(groups.items())}}
    read = [(read_lead_answer(p.text), read_lead_answer(r.answer)) for p, r in groups.get("lead", [])]
    read = [(a, b) for a, b in read if a is not None and b is not None]
    if len(read) >= 2:
        got, ref = np.array(read).T
        r = float(np.corrcoef(got, ref)[0, 1]) if got.std() > 0 and ref.std() > 0 else math.nan
        out["lead_distance"] = {"records": len(read), "mae_m": float(np.abs(got - ref).mean()), "pearson_r": r,
                                "blind_mae_m": float(np.abs(ref - ref.mean()).mean())}
    return out


def _normalise(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".")


def open_loop(subject: Subject, by_task: dict[str, list[Record]], thresholds: list[float], progress: bool) -> dict:
    from tqdm import tqdm

    images = {r.image_path: load_rgb(r.image_path) for rs in by_task.values() for r in rs}
    sweep = [thresholds[0]] if subject.ar else thresholds  # a threshold does not change AR decoding
    total = len(by_task["plan"]) * len(sweep) + len(by_task["detect"]) + len(by_task["ask"])
    with tqdm(total=total, desc=f"decode {subject.label}", unit="rec", disable=not progress, file=sys.stderr) as bar:
        rows = [plan_row(Planner(subject.bundle, dataclasses.replace(subject.settings, threshold=t)), by_task["plan"],
                         images, bar, None if subject.ar else t) for t in sweep]
        planner = Planner(subject.bundle, subject.settings)
        detected = []
        for r in by_task["detect"]:
            detected.append(planner.detect(images[r.image_path]))
            bar.update()
        asked = []
        for r in by_task["ask"]:
            asked.append(planner.ask(images[r.image_path], question_of(r)))
            bar.update()
    detection = {"records": len(detected), "invalid": sum(not p.valid for p in detected), **_speed(detected),
                 **detection_metrics([p.boxes if p.valid else [] for p in detected],  # a bad answer: no boxes
                                     [fmt.parse_boxes(r.answer).boxes for r in by_task["detect"]])}
    pairs = list(zip(asked, by_task["ask"]))
    ask = {"records": len(pairs), **_speed(asked),
           "exact_match": float(np.mean([p.text.strip() == r.answer.strip() for p, r in pairs])) if pairs else math.nan,
           "normalised_match": float(np.mean([_normalise(p.text) == _normalise(r.answer) for p, r in pairs]))
           if pairs else math.nan, **ask_breakdown(pairs)}
    return {"plan": {"primary_threshold": rows[0]["threshold"], "sweep": rows}, "detection": detection, "ask": ask}


# -- teacher forced -------------------------------------------------------------------------------------------------


def _diffusion_states(subject: Subject, prompts: list, chunk: list, generator: torch.Generator) -> list:
    """BD3 noisy states at the subject's decode block size: per-block mask rate stratified over [0, 1)."""
    b, bundle = subject.settings.block_size, subject.bundle
    answers = [answer_tokens(s, b, bundle.eos_token_id) for s in chunk]
    return diffusion_batch(prompts, answers, b, bundle.mask_token_id, bundle.meta.prompt_block_size, NoiseConfig(),
                           generator)


def _overlap(student: Subject, teacher: Subject, layouts: list, prompts: list, chunk: list, k: int,
             generator: torch.Generator) -> Overlap:
    s, t = student.bundle, teacher.bundle
    if student.ar == teacher.ar:  # same convention: both logits at the same rows of the same layouts
        return model_overlap(t.model, s.model, layouts, k)
    if teacher.ar:  # the AR logit at i-1 given the clean prefix vs the student's in-place logit at masked i
        return ar_aligned_overlap(t.model, s.model, layouts, k, t.meta.prompt_block_size)
    # an AR student under a diffusion teacher: the teacher's own noisy states, the student aligned to them
    return ar_aligned_overlap(s.model, t.model, _diffusion_states(teacher, prompts, chunk, generator), k,
                              s.meta.prompt_block_size)


@torch.no_grad()
def teacher_forced(subject: Subject, samples: dict[str, list], teacher: Subject | None, k: int, batch_size: int,
                   seed: int) -> tuple[dict, dict | None]:
    """Token accuracy and cross-entropy on fixed noisy states (same seed, same batches for every checkpoint), and
    ρ_k against the teacher on the same states."""
    bundle = subject.bundle
    generator, teacher_generator = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    per_task, parts = {}, []
    correct = positions = nll = 0.0
    for task, task_samples in samples.items():
        hit = count = 0.0
        for i in range(0, len(task_samples), batch_size):
            chunk = task_samples[i:i + batch_size]
            prompts = [prompt_inputs(s) for s in chunk]
            layouts = ([ar_layout(p, s.answer_ids, bundle.meta.prompt_block_size) for p, s in zip(prompts, chunk)]
                       if subject.ar else _diffusion_states(subject, prompts, chunk, generator))
            out = forward_layouts(bundle.model, layouts)
            n = int((out.labels != IGNORE).sum())
            hit += token_accuracy(out.logits, out.labels) * n
            nll += float(masked_cross_entropy(out.logits, out.labels)) * n
            count += n
            if teacher is not None:
                parts.append(_overlap(subject, teacher, layouts, prompts, chunk, k, teacher_generator))
        per_task[task] = hit / count if count else math.nan
        correct, positions = correct + hit, positions + count
    states = "next-token (shifted), clean prefix" if subject.ar else \
        f"BD3 noisy states, B={subject.settings.block_size}, mask rate stratified U[0,1), seed {seed}"
    accuracy = {"states": states, "positions": int(positions), "per_task": per_task,
                "token_accuracy": correct / positions if positions else math.nan,
                "cross_entropy": nll / positions if positions else math.nan}
    if teacher is None:
        return accuracy, None
    rho = Overlap.combine(parts) if parts else Overlap(math.nan, 0, k)
    how = ("AR-aligned (i-1 vs masked i)" if subject.ar != teacher.ar else
           "next-token logits" if subject.ar else "in-place logits at masked positions")
    return accuracy, {"k": k, "teacher": teacher.path, "value": rho.rho, "positions": rho.positions, "alignment": how}


def check_teacher(teacher: Subject, subject: Subject) -> None:
    t, s = teacher.bundle, subject.bundle
    if (len(t.tokenizer), t.mask_token_id, t.eos_token_id) != (len(s.tokenizer), s.mask_token_id, s.eos_token_id):
        raise EvalError(f"--teacher {teacher.path}: its tokenizer differs from {subject.path}'s (vocabulary size, "
                        "[MASK] or EOS id): top-K overlap needs one vocabulary")


# -- closed loop ----------------------------------------------------------------------------------------------------


def closed_loop(model: str, baselines: str, out: Path, args: argparse.Namespace, decode: Subject | None) -> dict:
    """``wamdiff-eval closed-loop`` in process (decoding as the open loop's first threshold does); its report's
    totals per planner (paused mode)."""
    from wamdiff_ros.world import evaluate

    argv = ["closed-loop", "--model", model, "--baselines", baselines, "--scenarios", args.scenarios,
            "--episodes", str(args.episodes), "--workers", str(args.workers), "--videos", "0", "--out", str(out),
            *(["--scenario-file", args.scenario_file] if args.scenario_file else []),
            *(["--threshold", str(decode.settings.threshold), "--block-size", str(decode.settings.block_size)]
              if decode is not None and not decode.ar else []),
            *(["--no-progress"] if args.no_progress else [])]
    try:
        code = evaluate.main(argv)
    except SystemExit as exc:  # argparse's error exit
        code = exc.code
    if code != 0:
        raise EvalError(f"closed loop of {model}: wamdiff-eval {' '.join(argv)} exited with {code}")
    summary = json.loads((out / "report.json").read_text())["summary"]
    planners = {g["planner"]: {key: g[key] for key in ("episodes", "ds", "ds_lo", "ds_hi", "sr", "rc", "penalty",
                                                        "collisions_per_ep", "forward_calls_per_token")}
                for g in summary["groups"] if g["mode"] == "paused"}
    model_row = planners.pop("model", None)
    return {"command_line": ["wamdiff-eval", *argv], "report": str(out / "report.json"),
            **({"driving_score": model_row["ds"], "driving_score_ci": [model_row["ds_lo"], model_row["ds_hi"]],
                "success_rate": model_row["sr"], "route_completion": model_row["rc"], "model": model_row}
               if model_row else {}), **({"baselines": planners} if planners else {})}


def _check_closed_loop(args: argparse.Namespace) -> None:
    from wamdiff_ros.world.scenarios import ScenarioError, load_scenarios

    if args.episodes < 1 or args.workers < 1:
        raise EvalError(f"--episodes {args.episodes} and --workers {args.workers} must be >= 1")
    try:
        load_scenarios(args.scenario_file).select(args.scenarios)
    except (ScenarioError, OSError) as exc:
        raise EvalError(f"--scenarios / --scenario-file: {exc}") from exc


# -- the run --------------------------------------------------------------------------------------------------------


def evaluate(args: argparse.Namespace, argv: list[str]) -> dict:
    """Every checkpoint on the split; returns what eval.json holds (paths are checked before any model loads)."""
    began = time.perf_counter()
    thresholds = parse_thresholds(args.thresholds)
    paths = [resolve_checkpoint(p) for p in args.checkpoint]
    teacher_path = resolve_checkpoint(args.teacher, "--teacher") if args.teacher else None
    if args.k < 1 or args.batch_size < 1 or (args.max_samples is not None and args.max_samples < 1):
        raise EvalError(f"--k {args.k}, --batch-size {args.batch_size} and --max-samples {args.max_samples} must "
                        "be >= 1")
    if args.closed_loop:
        _check_closed_loop(args)
    records = load_records(args.data, args.root)
    by_task = {t: evenly_spaced([r for r in records if r.task == t], args.max_samples) for t in TASKS}
    if not any(by_task.values()):
        raise EvalError(f"--data {args.data}: no {', '.join(TASKS)} records")
    teacher = load_subject(teacher_path, "teacher", args, thresholds[0], "--teacher") if teacher_path else None
    out = Path(args.out)
    entries = []
    for path, label in zip(paths, labels_of(paths)):
        subject = load_subject(path, label, args, thresholds[0])
        if teacher is not None:
            check_teacher(teacher, subject)
        meta = subject.bundle.meta
        entry = {"path": path, "label": label, "legend": subject.legend,
                 "decode": {"mode": "ar" if subject.ar else "block", "prediction": meta.prediction,
                            "trained_block_size": meta.trained_block_size, "prompt_attention": meta.prompt_attention,
                            **dataclasses.asdict(subject.settings)}}
        entry.update(open_loop(subject, by_task, thresholds, not args.no_progress))
        samples = {t: [encode_record(subject.bundle, r) for r in rs] for t, rs in by_task.items() if rs}
        entry["teacher_forced"], entry["rho"] = teacher_forced(subject, samples, teacher, args.k, args.batch_size,
                                                               args.seed)
        entry["command_likelihood"] = command_likelihood(subject, by_task["plan"], samples.get("plan", []))
        if args.closed_loop:
            slug = re.sub(r"[^\w.-]+", "_", label)
            entry["closed_loop"] = closed_loop(path, "none", out / "closed_loop" / slug, args, subject)
        found = plots.find_metrics(path) if path != TINY_RANDOM else None
        entry["metrics_csv"] = str(found) if found else None
        entries.append(entry)
        del subject, samples  # one model in memory at a time (plus the teacher)
    result = {"command_line": ["wamdiff-train", "eval", *argv], "data": str(args.data),
              "records": {t: len(rs) for t, rs in by_task.items()}, "thresholds": thresholds, "k": args.k,
              "teacher": teacher_path, "seed": args.seed, "checkpoints": entries,
              "exposure_bias": exposure_bias(entries)}
    if args.closed_loop and args.baselines != "none":
        result["closed_loop_baselines"] = closed_loop("none", args.baselines, out / "closed_loop" / "baselines", args,
                                                      None)
    result["wall_s"] = time.perf_counter() - began
    return result


def exposure_bias(entries: list[dict]) -> dict | None:
    """Per-waypoint L2 of every checkpoint minus the first's (the paper's gap grows from wp 1 to wp 8)."""
    if len(entries) < 2:
        return None
    ref = np.array(entries[0]["plan"]["sweep"][0]["l2_per_waypoint"], dtype=float)
    out = {"reference": entries[0]["label"], "gap_per_waypoint": {}, "mean_change_pct": {}}
    for e in entries[1:]:
        own = np.array(e["plan"]["sweep"][0]["l2_per_waypoint"], dtype=float)
        out["gap_per_waypoint"][e["label"]] = (own - ref).tolist()
        out["mean_change_pct"][e["label"]] = float(100 * (own.mean() - ref.mean()) / ref.mean())
    return out


def parse_thresholds(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(0.0 < v <= 1.0 for v in values):
        raise EvalError(f"--thresholds {text!r}: expected comma-separated confidences in (0, 1], e.g. 0.9,0.7,0.5")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-train eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", required=True, metavar="CKPT",
                   help="checkpoint folder, run folder (its latest), checkpoints/latest, or tiny-random (repeatable)")
    p.add_argument("--data", required=True, help="held-out records, e.g. out/data/tiny/test.json")
    p.add_argument("--root", default=None, help="image root (default: the data file's folder)")
    p.add_argument("--teacher", default=None, metavar="CKPT", help="teacher checkpoint for the top-K overlap rho_k")
    p.add_argument("--k", type=int, default=5, help="K of rho_k (default 5)")
    p.add_argument("--max-samples", type=int, default=None, metavar="N",
                   help="at most N records per task, evenly spaced over the file")
    p.add_argument("--thresholds", default=f"{DecodeSettings().threshold:g}", help="confidence thresholds to sweep, "
                   "e.g. 0.9,0.7,0.5 (the first also decodes detect / ask and drives the closed loop; default: the "
                   "decoder's default)")
    p.add_argument("--block-size", type=int, default=None, help="decode block size of diffusion checkpoints "
                   "(default: min(32, trained))")
    p.add_argument("--steps", type=int, default=None, help="denoising steps per block at most (default 32)")
    p.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help=f"unmask schedule of diffusion checkpoints (default {DecodeSettings().schedule})")
    p.add_argument("--max-new-tokens", type=int, default=DecodeSettings().max_new_tokens)
    p.add_argument("--batch-size", type=int, default=8, help="layouts per teacher-forced forward")
    p.add_argument("--seed", type=int, default=0, help="seed of the noisy states")
    p.add_argument("--device", default="cpu")
    p.add_argument("--closed-loop", action="store_true", help="also run wamdiff-eval closed-loop per checkpoint")
    p.add_argument("--episodes", type=int, default=10, help="closed loop: episodes per scenario")
    p.add_argument("--scenarios", default="all", help="closed loop: comma-separated scenario names or all")
    p.add_argument("--scenario-file", default=None, help="closed loop: a scenario YAML instead of the frozen set")
    p.add_argument("--baselines", default="none", help="closed loop: baselines run once beside the checkpoints "
                   "(expert,constant_velocity or none)")
    p.add_argument("--workers", type=int, default=1, help="closed loop: worker processes")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        result = evaluate(args, argv)
    except WamDiffError as exc:  # EvalError, RecordError, CheckpointError, ...: each names its input
        print(f"wamdiff-train eval: error: {exc}", file=sys.stderr)
        return 2
    written = plots.write_outputs(result, Path(args.out))
    for e in result["checkpoints"]:
        row = e["plan"]["sweep"][0]
        rho = "" if e["rho"] is None else f", rho{args.k} {e['rho']['value']:.3f}"
        lead = e["ask"].get("lead_distance")
        lead = "" if lead is None else (f", lead distance MAE {lead['mae_m']:.1f} m (blind {lead['blind_mae_m']:.1f}) "
                                        f"r {lead['pearson_r']:.2f}")
        junction = (row.get("by_behaviour") or {}).get("junction") or {}
        turns = "" if junction.get("turn_shortfall_m") is None else (
            f", junction turns {junction['turn_shortfall_m']:.2f} m short at wp8 ({junction['turns']} turns)")
        starts = row.get("turn_starts") or {}
        if starts.get("valid"):
            turns += (f", turns begun {starts['begun']}/{starts['references']} (median "
                      f"{starts['median_sideways_m']:.2f} m to the side)")
        response = row.get("command_response")
        if response and response["plan_spread_m"] is not None:
            turns += (f", command response: y8 spread {response['plan_spread_m']:.2f} m (reference "
                      f"{response['reference_spread_m']:.2f} m) over {response['frames']} frames, "
                      f"{response['followed']}/{response['turns']} turns followed")
        reading = e.get("command_likelihood") or {}
        if reading.get("references"):
            turns += (f", command likelihood {reading['gain_mean_nats']:+.2f} nats (median "
                      f"{reading['gain_median_nats']:.2f}; own command likeliest for {reading['own_likeliest']}/"
                      f"{reading['references']} turning references)")
        print(f"{e['legend']}: plan L2 {row['l2_mean']:.3f} m (wp8 {row['l2_per_waypoint'][-1]:.3f}), invalid "
              f"{row['invalid']}/{row['plans']}, {row['forward_calls_per_token']:.3f} forwards/token, "
              f"{row['tokens_per_s']:.0f} tokens/s, token acc {e['teacher_forced']['token_accuracy']:.3f}{rho}, "
              f"question exact match {e['ask']['exact_match']:.3f}{lead}{turns}")
    print("wrote " + " ".join(str(p) for p in written))
    return 0
