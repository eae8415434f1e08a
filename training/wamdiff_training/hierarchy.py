"""``wamdiff-train hierarchy --plan FILE``: the whole three-stage hierarchy on tiny models, resumable.

Order (anchors §1): world data -> AR pretraining of a teacher and a smaller student -> optional DAgger rounds (each
model drives part of fresh episodes, the expert labels them, AR training goes on over all data) -> Stage I curriculum
(B = 1 -> ... -> 32) for both -> optional DAgger rounds of the B = 32 models (driven by the diffusion model, trained
with Stage I's loss at B = 32) -> Stage II for both (each model's small-block phase teaches its B = 32 phase) ->
Stage III (the teacher's B = 32 model -> the student). Every step is skipped when its run already reached its
steps and resumed from its last checkpoint when it was cut short, so after a kill the same command goes on.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import logging
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import CheckpointError
from wamdiff_training import checkpoint
from wamdiff_training.config import ConfigError, load_config

log = logging.getLogger("wamdiff_training")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass(slots=True)
class ModelPlan:
    hidden: int
    layers: int
    seed: int = 0
    adapt_steps: int | list[int] | None = None  # this model's Stage I steps (one count, or one per phase)
    ar_steps: int | None = None  # this model's AR pretraining steps, when not the plan's
    vision_hidden: int = 64  # the vision tower's width and depth
    vision_depth: int = 2
    # DAgger (both kinds) without driving: train on the other model's round exports (the states that model drives
    # into, every label the expert's) instead of exporting rounds driven by this one; None: drive its own
    dagger_from: str | None = None
    dagger_steps: int | None = None  # this model's steps per DAgger round (both kinds), when not the plan's
    adapt_dagger_rounds: int | None = None  # this model's diffusion DAgger rounds, when not adapt_dagger.rounds
    # continue an earlier model instead of starting from random weights: its AR pretraining starts from this run
    # folder's last checkpoint (or this model folder / checkpoint); hidden, layers and vision sizes are then its own
    init: str | None = None


@dataclass(slots=True)
class DaggerPlan:
    """DAgger rounds after AR pretraining, per model: round r exports ``episodes`` fresh training episodes per
    scenario driven by the model so far (``expert_share`` of the 0.5 s intervals by the expert: one share, or one
    per round), then trains it ``steps`` more AR steps on the plan's data and every round's so far; later stages
    train on that union too."""

    rounds: int = 1
    episodes: int = 60
    expert_share: float | list[float] = 0.5
    steps: int = 2500
    lr: float | None = None  # None: the AR config's
    task_weights: dict[str, float] | None = None  # None: the plan's mix
    seed_offset: int | None = None  # first fresh training episode of round 1; None: after every earlier export's

    def __post_init__(self) -> None:
        shares = self.expert_share if isinstance(self.expert_share, list) else [self.expert_share]
        if self.rounds < 1 or self.episodes < 1 or self.steps < 1 or not all(0 <= v <= 1 for v in shares):
            raise ConfigError("hierarchy", "dagger", "rounds, episodes and steps must be >= 1 and expert_share in "
                                                     f"[0, 1]; got {self}")
        if isinstance(self.expert_share, list) and len(self.expert_share) != self.rounds:
            raise ConfigError("hierarchy", "dagger.expert_share",
                              f"{len(self.expert_share)} shares for {self.rounds} rounds (give one, or one per round)")

    def share(self, r: int) -> float:
        """The expert's share of round ``r`` (1-based)."""
        return float(self.expert_share[r - 1] if isinstance(self.expert_share, list) else self.expert_share)


@dataclass(slots=True)
class PolishPlan(DaggerPlan):
    """On-policy rounds for the final student, after Stage III: round r exports ``episodes`` fresh training
    episodes per scenario driven by the student so far (``expert_share`` of the intervals by the expert; 0: the
    student alone, so the states are the ones it drives into), labelled by the expert, then trains ``steps`` more
    Stage I steps at the curriculum's last B on ``data`` plus every polish round so far. Its last round is the
    final student (``final_run``)."""

    # beside the rounds' own exports: "all" = the student's data so far (the world export, extra_data, the
    # recoveries and every DAgger round's), "world" = the plan's world export and its recoveries only, "rounds" =
    # the recoveries only
    data: str = "all"
    # the model to polish (a model folder, a checkpoint or a run folder) instead of the plan's student/cross_scale:
    # a final student whose runs are not on this machine, e.g. a shipped model exported from them
    init: str | None = None
    # the scenarios the rounds' episodes drive (wamdiff-data --scenarios); None: the plan's
    scenarios: str | None = None
    # after the rounds, one model from two (a PolishMerge; None: the last round is the final student)
    merge: PolishMerge | dict | None = None

    def __post_init__(self) -> None:
        DaggerPlan.__post_init__(self)
        if self.data not in ("all", "world", "rounds"):
            raise ConfigError("hierarchy", "polish.data", f"'all', 'world' or 'rounds', got {self.data!r}")
        if isinstance(self.merge, dict):
            self.merge = _section(PolishMerge, self.merge, "polish.merge", "hierarchy")


def _section(kind: type, raw: dict, key: str, source: str):
    """A plan section (a mapping) as ``kind``; an unknown key is refused with the keys ``kind`` knows."""
    names = [f.name for f in fields(kind)]
    unknown = set(raw) - set(names)
    if unknown:
        raise ConfigError(source, f"{key}.{sorted(unknown)[0]}", f"unknown key; known: {', '.join(names)}")
    return kind(**raw)


@dataclass(slots=True)
class PolishMerge:
    """The polish's last step (``student/polish/merge``): Stage III's loss at the curriculum's last B from the model
    the polish started from, which is also the teacher of every record but those of ``scenarios``; their teacher is
    the last round's model (``cross_scale.route_teacher``). So the student keeps what it drove well and takes the
    round's driving where the round drove better. It trains on the last round's data, with ``ce_weight`` ×
    cross-entropy to the labels beside the divergence."""

    scenarios: list[str] = field(default_factory=list)
    steps: int = 800
    lr: float | None = None  # None: the cross-scale config's
    ce_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.scenarios or not all(isinstance(v, str) and v for v in self.scenarios):
            raise ConfigError("hierarchy", "polish.merge.scenarios",
                              f"name the scenarios the last round teaches, got {self.scenarios!r}")
        if self.steps < 1 or self.ce_weight < 0:
            raise ConfigError("hierarchy", "polish.merge", f"steps must be >= 1 and ce_weight >= 0; got {self}")


@dataclass(slots=True)
class RecoveryPlan:
    """Lane recoveries (``wamdiff-data recoveries``) exported once beside the world data and trained on by every
    run, as the mix group ``plan/recovery`` with ``weight``."""

    samples: int = 1000  # recovery worlds per scenario
    scenarios: str = "highway"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.samples < 1 or self.weight < 0:
            raise ConfigError("hierarchy", "recoveries", f"samples must be >= 1 and weight >= 0; got {self}")


@dataclass(slots=True)
class ReusePlan:
    """Runs taken over from an earlier plan's root instead of trained again: a step whose name matches one of
    ``runs`` (globs) and that is done under ``root`` is linked into this plan's root before the steps run (its
    files, one symlink each, so a run's DAgger export beside it links on its own), and is then done here too. With
    ``plan`` (the earlier plan file; ``root`` is then its root) those of its steps run first, so a fresh machine
    trains them there before they are linked."""

    root: str = ""  # default: the root of ``plan``
    runs: list[str] = field(default_factory=list)
    plan: str | None = None  # the plan file that trains them: its matching steps run first (none when done)


@dataclass(slots=True)
class HierarchyPlan:
    root: str
    scenarios: str = "all"
    episodes: int = 20  # per scenario and split (train / val / test)
    eval_episodes: int | None = None  # per scenario for val and test, when not ``episodes``
    task_weights: dict[str, float] | None = None  # the training mix (data.task_weights); None: the configs' own
    workers: int = 1
    teacher: ModelPlan = field(default_factory=lambda: ModelPlan(128, 4, 0))
    student: ModelPlan = field(default_factory=lambda: ModelPlan(64, 2, 1))
    batch_size: int = 8
    checkpoint_every: int = 100  # a killed step resumes from its last one
    ar_steps: int = 600
    curriculum: list[int] = field(default_factory=lambda: [1, 4, 8, 16, 32])
    adapt_steps: int | list[int] = 200  # per curriculum phase (one count, or one per phase)
    distill_teacher_block: int = 8
    distill_steps: int = 200
    cross_scale_steps: int = 200
    # Stage III's cross_scale.ce_weight (student/cross_scale and its three ablations): + λ × cross-entropy to the
    # ground truth beside the divergence to the teacher; 0 is the paper's pure distillation
    cross_scale_ce_weight: float = 0.0
    # Stage III's cross_scale.block_teacher_share (the same four runs): the target mixed with this share of the
    # student's own B = distill_teacher_block model (its Stage II block teacher); 0: the teacher alone (the paper)
    cross_scale_block_share: float = 0.0
    dagger: DaggerPlan | None = None
    adapt_dagger: DaggerPlan | None = None  # rounds driven by each model's B = 32 model, after its Stage I
    polish: PolishPlan | None = None  # on-policy rounds for the final student, after Stage III
    ablations: bool = True  # the student's ablation runs after the main chain (see plan_steps)
    ar_in_place_weight: float = 0.0  # ar.in_place_weight of every AR run (pretraining and DAgger rounds)
    ar_lr: float | None = None  # the AR pretraining runs' learning rate; None: the AR config's
    data: str | None = None  # the world export every run trains on (and exports into when missing); None: root/data
    extra_data: list[str] = field(default_factory=list)  # more conversation JSON for every run (earlier exports)
    recoveries: RecoveryPlan | None = None
    reuse: ReusePlan | None = None
    # the training exports (the world's train split and every DAgger round's) also label each junction approach
    # frame under the other commands (wamdiff-data generate --counterfactual-commands); held-out splits never do
    counterfactual_commands: bool = False
    # every export (the world's splits, DAgger rounds, recoveries) writes the plan prompts' optional route line
    # (wamdiff-data --route-points) and its plan answers in this waypoint format (--format-version; 3: y as bins);
    # route_format: the route line's numbers (--route-format; 3: each y as a bin, as version 3's answers)
    route_points: bool = False
    format_version: int = 2
    route_format: int = 2

    @property
    def data_dir(self) -> Path:
        return Path(self.root) / "data" if self.data is None else Path(self.data)


@dataclass(slots=True)
class Step:
    name: str  # e.g. "student/adapt/b08"
    stage: str  # the wamdiff-train stage, or "dagger-data" (an export driven by the model; steps 0)
    base: str  # the tiny config file it starts from
    out_dir: Path
    steps: int
    overrides: list[str]


def load_plan(path: str | Path) -> HierarchyPlan:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "", f"expected a mapping of plan keys, got a {type(raw).__name__}")
    known = set(HierarchyPlan.__slots__)
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(str(path), sorted(unknown)[0], f"unknown key; known: {', '.join(sorted(known))}")
    if "root" not in raw:
        raise ConfigError(str(path), "root", "missing: the folder every run of the hierarchy writes into")
    for key, kind in (("teacher", ModelPlan), ("student", ModelPlan), ("dagger", DaggerPlan),
                      ("adapt_dagger", DaggerPlan), ("polish", PolishPlan), ("recoveries", RecoveryPlan),
                      ("reuse", ReusePlan)):
        if raw.get(key) is not None:
            raw[key] = _section(kind, raw[key], key, str(path))
    plan = HierarchyPlan(**raw)
    for name, upper in (("cross_scale_ce_weight", math.inf), ("cross_scale_block_share", 1.0)):
        value = getattr(plan, name)
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value <= upper
                                           and math.isfinite(value)):
            raise ConfigError(str(path), name, f"must be a finite number in [0, {upper:g}], got {value!r}")
    if plan.format_version not in (2, 3) or isinstance(plan.format_version, bool):
        raise ConfigError(str(path), "format_version", f"the exports write 2 or 3, got {plan.format_version!r}")
    if not isinstance(plan.route_points, bool):
        raise ConfigError(str(path), "route_points", f"true or false, got {plan.route_points!r}")
    if plan.route_format not in fmt.ROUTE_FORMATS or isinstance(plan.route_format, bool):
        raise ConfigError(str(path), "route_format", f"one of {fmt.ROUTE_FORMATS}, got {plan.route_format!r}")
    if plan.route_format != 2 and not plan.route_points:
        raise ConfigError(str(path), "route_format", "needs route_points: true (the exports write no route line)")
    if plan.reuse is not None:
        earlier = None if plan.reuse.plan is None else load_plan(plan.reuse.plan).root
        if earlier is None and not plan.reuse.root:
            raise ConfigError(str(path), "reuse", "name the earlier plan (reuse.plan) or its root (reuse.root)")
        if earlier is not None and plan.reuse.root and Path(plan.reuse.root) != Path(earlier):
            raise ConfigError(str(path), "reuse.root", f"{plan.reuse.root} is not reuse.plan's root {earlier}")
        plan.reuse.root = plan.reuse.root or earlier
    for who, other in (("teacher", "student"), ("student", "teacher")):
        lender = getattr(plan, who).dagger_from
        if lender is not None and lender != other:
            raise ConfigError(str(path), f"{who}.dagger_from", f"{lender!r}: the only other model is {other!r}")
        if lender is not None and getattr(plan, other).dagger_from is not None:
            raise ConfigError(str(path), f"{who}.dagger_from", f"{other!r} borrows its DAgger data too: one must drive")
    if plan.adapt_dagger is not None:
        for who, other in (("teacher", "student"), ("student", "teacher")):
            m, rounds = getattr(plan, who), adapt_dagger_rounds(plan, who)
            shares = plan.adapt_dagger.expert_share
            if rounds < 1 or (isinstance(shares, list) and rounds > len(shares)):
                raise ConfigError(str(path), f"{who}.adapt_dagger_rounds",
                                  f"must be >= 1 and have an adapt_dagger.expert_share each, got {rounds}")
            driven = adapt_dagger_rounds(plan, other)
            if m.dagger_from is not None and rounds > driven:
                raise ConfigError(str(path), f"{who}.adapt_dagger_rounds",
                                  f"{rounds} rounds, but {other!r}, whose exports it trains on, drives only {driven}")
    return plan


def _latest(out_dir: Path) -> Path | None:
    try:
        return checkpoint.resolve(checkpoint.LATEST, out_dir)
    except CheckpointError:  # no run yet: start fresh
        return None


def _done_steps(out_dir: Path) -> int:
    latest = _latest(out_dir)
    return int(latest.name.split("-")[-1]) if latest is not None else 0


def plan_steps(plan: HierarchyPlan) -> list[Step]:
    """Every training run, in order. ``model.init`` / teacher paths point at the predecessor's run folder and are
    resolved to its latest checkpoint when the step starts (``@run:<dir>``)."""
    root = Path(plan.root)
    weights = dict(plan.task_weights or {})
    data = [plan.data_dir / "train.json", *(Path(f) for f in plan.extra_data)]
    if plan.recoveries is not None:
        data.append(recovery_data(plan))
        weights["plan/recovery"] = plan.recoveries.weight
    base = [f"train.batch_size={plan.batch_size}", f"out.checkpoint_every={plan.checkpoint_every}", "out.keep=2",
            *(f"data.task_weights.{task}={w}" for task, w in weights.items())]
    steps: list[Step] = []
    commons: dict[str, list[str]] = {}  # each model's training data (with any DAgger rounds') for the later stages
    datasets: dict[str, list[Path]] = {}  # the same data as files (a polish round with data: all trains on it)
    # a model that trains on the other's DAgger exports comes after it, so its rounds find their data exported
    order = ("student", "teacher") if plan.teacher.dagger_from == "student" else ("teacher", "student")
    for who in order:
        common = commons[who] = [_union(data), *base]
        m: ModelPlan = getattr(plan, who)
        ar_dir = root / who / "ar"
        ar_steps = m.ar_steps if m.ar_steps is not None else plan.ar_steps
        init = [] if m.init is None else [
            f"model.init=@run:{m.init}" if (Path(m.init) / "checkpoints").is_dir() else f"model.init={m.init}"]
        steps.append(Step(f"{who}/ar", "ar", "tiny_ar", ar_dir, ar_steps, [
            *common, f"ar.in_place_weight={plan.ar_in_place_weight}", f"model.tiny.hidden={m.hidden}",
            f"model.tiny.layers={m.layers}", f"model.tiny.seed={m.seed}",
            f"model.tiny.vision_hidden={m.vision_hidden}", f"model.tiny.vision_depth={m.vision_depth}", *init,
            *([] if plan.ar_lr is None else [f"train.lr={plan.ar_lr}"])]))
        previous = ar_dir
        files = list(data)
        if plan.dagger is not None:
            previous, files = _dagger_steps(plan, who, previous, base, steps, files, "dagger")
            common = commons[who] = [_union(files), *base]
        for b, phase_steps in zip(plan.curriculum, adapt_schedule(plan, m)):
            out = root / who / "adapt" / f"b{b:02d}"
            steps.append(Step(f"{who}/adapt/b{b:02d}", "adapt", "tiny_adapt", out, phase_steps, [
                *common, f"model.init=@run:{previous}", f"adapt.block_size={b}"]))
            previous = out
        if plan.adapt_dagger is not None:
            previous, files = _dagger_steps(plan, who, previous, base, steps, files, "adapt_dagger")
            common = commons[who] = [_union(files), *base]
        datasets[who] = files
        small = root / who / "adapt" / f"b{plan.distill_teacher_block:02d}"
        steps.append(Step(f"{who}/distill", "distill", "tiny_distill", root / who / "distill", plan.distill_steps, [
            *common, f"model.init=@run:{previous}", f"distill.teacher=@run:{small}",
            f"distill.teacher_block_size={plan.distill_teacher_block}", f"distill.block_size={plan.curriculum[-1]}"]))
    common = commons["student"]
    steps.append(Step("student/cross_scale", "cross-scale", "tiny_cross_scale", root / "student" / "cross_scale",
                      plan.cross_scale_steps, [
                          *common, f"model.init=@run:{root / 'student' / 'distill'}",
                          f"cross_scale.teacher=@run:{root / 'teacher' / 'distill'}",
                          "cross_scale.teacher_kind=diffusion", f"cross_scale.block_size={plan.curriculum[-1]}",
                          *_ce_weight(plan), *_block_share(plan)]))
    if plan.polish is not None:
        p = plan.polish
        files = datasets["student"] if p.data == "all" else [
            *([plan.data_dir / "train.json"] if p.data == "world" else []),
            *([recovery_data(plan)] if plan.recoveries is not None else [])]
        start = root / "student" / "cross_scale" if p.init is None else Path(p.init)
        _dagger_steps(plan, "student", start, base, steps, files, "polish")
    if plan.ablations:
        steps += ablation_steps(plan, common)
    return steps


def adapt_dagger_rounds(plan: HierarchyPlan, who: str) -> int:
    """``who``'s diffusion DAgger rounds: its own ``adapt_dagger_rounds``, else the plan's (0 without any)."""
    if plan.adapt_dagger is None:
        return 0
    own = getattr(plan, who).adapt_dagger_rounds
    return plan.adapt_dagger.rounds if own is None else own


def final_run(plan: HierarchyPlan) -> Path:
    """The student the hierarchy ends with (the one to ship): its polish's merge, else its last polish round, else
    Stage III's run."""
    root = Path(plan.root) / "student"
    if plan.polish is None:
        return root / "cross_scale"
    return root / "polish" / ("merge" if plan.polish.merge is not None else f"r{plan.polish.rounds:02d}")


def ar_run(plan: HierarchyPlan, who: str) -> Path:
    """``who``'s final AR model: its last DAgger round, or its AR pretraining run when the plan has none."""
    root = Path(plan.root) / who
    return root / "ar" if plan.dagger is None else root / "dagger" / f"r{plan.dagger.rounds:02d}"


def _ce_weight(plan: HierarchyPlan) -> list[str]:
    """Stage III's ground-truth anchor as an override; none at 0 (the config default), so earlier plans' runs keep
    their settings."""
    return [f"cross_scale.ce_weight={plan.cross_scale_ce_weight}"] if plan.cross_scale_ce_weight else []


def _block_share(plan: HierarchyPlan) -> list[str]:
    """Stage III's mixed target as overrides (the student's Stage II block teacher and its share); none at 0."""
    if not plan.cross_scale_block_share:
        return []
    b = plan.distill_teacher_block
    small = Path(plan.root) / "student" / "adapt" / f"b{b:02d}"
    return [f"cross_scale.block_teacher=@run:{small}", f"cross_scale.block_teacher_block_size={b}",
            f"cross_scale.block_teacher_share={plan.cross_scale_block_share}"]


def _union(files: list[Path]) -> str:
    return f"data.train=[{','.join(str(f) for f in files)}]"


def _dagger_steps(plan: HierarchyPlan, who: str, previous: Path, base: list[str], steps: list[Step],
                  files: list[Path], kind: str) -> tuple[Path, list[Path]]:
    """Appends ``who``'s DAgger rounds of ``kind`` to ``steps``: ``plan.dagger``'s AR rounds, ``plan.adapt_dagger``'s
    (driven by the B = 32 model, trained with Stage I's loss at that B) or ``plan.polish``'s (the same, after Stage
    III, the student only); returns the last round's run and the data files (``files`` plus every round's) the rest
    of ``who``'s chain trains on. A model with ``dagger_from`` exports nothing in the first two: its round r trains
    on the lender's exports of rounds 1..r. ``previous`` is a run folder (``@run:``, resolved when the step starts)
    or, for a polish ``init``, a model folder or checkpoint taken as it is."""
    d, root = getattr(plan, kind), Path(plan.root)
    model: ModelPlan = getattr(plan, who)
    round_steps = model.dagger_steps if model.dagger_steps is not None and kind != "polish" else d.steps
    lender = None if kind == "polish" else model.dagger_from
    # fresh training seeds: after the plan's episodes and every earlier round's (AR rounds, then B = 32 rounds)
    earlier = [plan.dagger.rounds * plan.dagger.episodes if plan.dagger and kind != "dagger" else 0,
               adapt_dagger_rounds(plan, who) * plan.adapt_dagger.episodes if kind == "polish" and plan.adapt_dagger
               else 0]
    first = d.seed_offset if d.seed_offset is not None else plan.episodes + sum(earlier)
    weights = [f"data.task_weights.{task}={w}" for task, w in (d.task_weights or {}).items()]
    lr = [] if d.lr is None else [f"train.lr={d.lr}"]
    stage = ("ar", "tiny_ar", [f"ar.in_place_weight={plan.ar_in_place_weight}"]) if kind == "dagger" else \
        ("adapt", "tiny_adapt", [f"adapt.block_size={plan.curriculum[-1]}"])
    given = kind == "polish" and d.init is not None and not (previous / "checkpoints").is_dir()
    start = str(previous) if given else f"@run:{previous}"
    scenarios = [f"scenarios={d.scenarios}"] if kind == "polish" and d.scenarios is not None else []
    files = list(files)
    for r in range(1, (adapt_dagger_rounds(plan, who) if kind == "adapt_dagger" else d.rounds) + 1):
        run_dir = root / who / kind / f"r{r:02d}"
        source = start if r == 1 else f"@run:{previous}"
        if lender is None:
            steps.append(Step(f"{who}/{kind}/r{r:02d}/data", "dagger-data", "", run_dir / "data", 0, [
                f"driver={source}", f"seed_offset={first + (r - 1) * d.episodes}", f"episodes={d.episodes}",
                f"expert_share={d.share(r)}", *scenarios]))
        files.append((root / lender / kind / f"r{r:02d}" if lender else run_dir) / "data" / "train.json")
        steps.append(Step(f"{who}/{kind}/r{r:02d}", stage[0], stage[1], run_dir, round_steps, [
            _union(files), *base, *weights, *lr, f"model.init={source}", *stage[2]]))
        previous = run_dir
    merge = d.merge if kind == "polish" else None
    if merge is not None:
        run_dir = root / who / kind / "merge"
        steps.append(Step(f"{who}/{kind}/merge", "cross-scale", "tiny_cross_scale", run_dir, merge.steps, [
            _union(files), *base, *([] if merge.lr is None else [f"train.lr={merge.lr}"]), f"model.init={start}",
            f"cross_scale.teacher={start}", "cross_scale.teacher_kind=diffusion",
            f"cross_scale.block_size={plan.curriculum[-1]}", f"cross_scale.ce_weight={merge.ce_weight}",
            f"cross_scale.route_teacher=@run:{previous}",
            f"cross_scale.route_scenarios=[{','.join(merge.scenarios)}]"]))
        previous = run_dir
    return previous, files


def _export_format(plan: HierarchyPlan) -> list[str]:
    """The export flags every export of ``plan`` shares: its answers' format version and the route line."""
    route = ["--route-points", "--route-format", str(plan.route_format)] if plan.route_points else []
    return ["--format-version", str(plan.format_version), *route]


def export_dagger(plan: HierarchyPlan, step: Step, driver: str, progress: bool) -> None:
    """A DAgger round's data: the round's ``episodes`` fresh training episodes per scenario driven partly by
    ``driver`` (``step.out_dir`` / train.json; written last, so an export cut short runs again)."""
    from wamdiff_ros.world.dataset import main as export

    setting = dict(o.split("=", 1) for o in step.overrides)
    offset, share = setting["seed_offset"], setting["expert_share"]
    args = ["generate", "--scenarios", setting.get("scenarios", plan.scenarios), "--episodes", setting["episodes"],
            "--split", "train", "--seed-offset", offset, "--noise-fraction", "0", "--driver", driver, "--expert-share",
            share, "--workers", str(plan.workers), "--out", str(step.out_dir), "--overwrite",
            *(["--counterfactual-commands"] if plan.counterfactual_commands else []), *_export_format(plan)]
    if export(args + ([] if progress else ["--no-progress"])) != 0:
        raise RuntimeError(f"the DAgger export into {step.out_dir} failed")


def adapt_schedule(plan: HierarchyPlan, model: ModelPlan) -> list[int]:
    """Stage I steps per curriculum phase: the model's own ``adapt_steps`` if set, else the plan's; one count
    serves every phase, a list gives one per phase."""
    steps = model.adapt_steps if model.adapt_steps is not None else plan.adapt_steps
    if isinstance(steps, int):
        return [steps] * len(plan.curriculum)
    if len(steps) != len(plan.curriculum):
        raise ConfigError("hierarchy", "adapt_steps", f"{len(steps)} counts for {len(plan.curriculum)} phases")
    return list(steps)


def ablation_steps(plan: HierarchyPlan, common: list[str]) -> list[Step]:
    """The student's ablations, each against one run of the main chain (``student/ablation/<name>``):

    - ``direct``: AR -> B = 32 in one phase with the whole curriculum's step budget (no curriculum);
    - ``ar_teacher``: Stage III from the AR teacher instead of the teacher's B = 32 diffusion model;
    - ``fkl`` / ``rkl``: Stage III with forward / reverse KL instead of the symmetric JSD.

    "AR" is each model's final AR run (``ar_run``: after any DAgger rounds).
    """
    root = Path(plan.root)
    student, teacher, ablation = root / "student", root / "teacher", root / "student" / "ablation"
    big = plan.curriculum[-1]
    cross = [*common, f"model.init=@run:{student / 'distill'}", f"cross_scale.block_size={big}", *_ce_weight(plan),
             *_block_share(plan)]
    return [
        Step("student/ablation/direct", "adapt", "tiny_adapt", ablation / "direct",
             sum(adapt_schedule(plan, plan.student)),
             [*common, f"model.init=@run:{ar_run(plan, 'student')}", f"adapt.block_size={big}"]),
        Step("student/ablation/ar_teacher", "cross-scale", "tiny_cross_scale", ablation / "ar_teacher",
             plan.cross_scale_steps,
             [*cross, f"cross_scale.teacher=@run:{ar_run(plan, 'teacher')}", "cross_scale.teacher_kind=ar"]),
        *(Step(f"student/ablation/{div}", "cross-scale", "tiny_cross_scale", ablation / div, plan.cross_scale_steps,
               [*cross, f"cross_scale.teacher=@run:{teacher / 'distill'}", "cross_scale.teacher_kind=diffusion",
                f"cross_scale.divergence={div}"])
          for div in ("fkl", "rkl")),
    ]


def _missing_input(step: Step, planned: dict[Path, int]) -> ConfigError | None:
    """Why ``step`` cannot start yet, or None: a DAgger export it trains on (maybe another model's) is not
    there, or a run it starts from (or, for an export, drives with) has not reached its planned steps."""
    for override in step.overrides:
        if override.startswith("data.train="):
            missing = [f for f in override.partition("=")[2].strip("[]").split(",") if not Path(f).is_file()]
            if missing:
                return ConfigError("hierarchy", step.name, f"its training data {missing[0]} is not exported yet")
        try:
            _resolve(override, planned)
        except ConfigError as exc:
            return exc
    return None


def _await_inputs(step: Step, planned: dict[Path, int], wait: float) -> None:
    """Returns once ``step`` can start; raises what it lacks, or with ``wait`` > 0 polls every ``wait`` seconds
    (logging each new thing it waits for) while another process makes it."""
    missing, said = _missing_input(step, planned), None
    while missing is not None:
        if wait <= 0:
            raise missing
        if str(missing) != said:
            log.info("%s; waiting (checking every %g s)", missing, wait)
            said = str(missing)
        time.sleep(wait)
        missing = _missing_input(step, planned)


def _resolve(override: str, planned: dict[Path, int]) -> str:
    """``key=@run:<dir>`` -> ``key=<dir's last checkpoint>``; refused while that run has not reached its planned
    steps (another process may still be training it: starting from its half-way checkpoint would be silent)."""
    key, _, value = override.partition("=")
    if not value.startswith("@run:"):
        return override
    run_dir = Path(value[len("@run:"):])
    latest = _latest(run_dir)
    if latest is None:
        raise ConfigError("hierarchy", key, f"its predecessor {run_dir} has no checkpoint yet")
    done, needed = _done_steps(run_dir), planned.get(run_dir, 0)
    if done < needed:
        raise ConfigError("hierarchy", key, f"its predecessor {run_dir} is at step {done} of {needed}; finish it first")
    return f"{key}={latest}"


def recovery_data(plan: HierarchyPlan) -> Path:
    return Path(plan.root) / "recoveries" / "train.json"


def ensure_recoveries(plan: HierarchyPlan, progress: bool) -> None:
    """The plan's recovery frames (written last by the export, so one cut short runs again)."""
    from wamdiff_ros.world.dataset import main as export

    if plan.recoveries is None or recovery_data(plan).is_file():
        return
    r = plan.recoveries
    args = ["recoveries", "--scenarios", r.scenarios, "--samples", str(r.samples), "--split", "train",
            "--workers", str(plan.workers), "--out", str(recovery_data(plan).parent), "--overwrite",
            *_export_format(plan)]
    if export(args + ([] if progress else ["--no-progress"])) != 0:
        raise RuntimeError(f"the recovery export into {recovery_data(plan).parent} failed")


def _is_done(step: Step, out_dir: Path) -> bool:
    return (out_dir / "train.json").is_file() if step.stage == "dagger-data" else _done_steps(out_dir) >= step.steps


@functools.lru_cache(maxsize=8)
def _step_names(plan_path: str, mtime_ns: int) -> frozenset[str]:
    """The step names of the plan file (read once per version of the file: asked for every step of a later plan)."""
    return frozenset(s.name for s in plan_steps(load_plan(plan_path)))


def _reuse_source(plan: HierarchyPlan, step: Step) -> Path | None:
    """The earlier run folder ``plan.reuse`` would take ``step`` over from, done there or not; None when the plan
    reuses nothing for it, the earlier plan (``reuse.plan``) has no such step (the step is this plan's own, e.g. a
    polish round after the earlier plan's chain) or the step has begun here."""
    if plan.reuse is None or not any(fnmatch.fnmatchcase(step.name, p) for p in plan.reuse.runs):
        return None
    if plan.reuse.plan is not None and step.name not in _step_names(plan.reuse.plan,
                                                                    Path(plan.reuse.plan).stat().st_mtime_ns):
        return None
    begun = step.out_dir if step.stage == "dagger-data" else step.out_dir / "checkpoints"
    if begun.exists() or begun.is_symlink():
        return None
    return Path(plan.reuse.root) / step.out_dir.relative_to(plan.root)


def link_reused(plan: HierarchyPlan, steps: list[Step], dry_run: bool = False) -> dict[str, Path]:
    """The steps ``plan.reuse`` takes over (name -> the earlier run folder): each done there and not begun here is
    linked in file by file (nothing is linked on a dry run)."""
    if plan.reuse is None:
        return {}
    reused = {}
    for step in steps:
        earlier = _reuse_source(plan, step)
        if earlier is None or not _is_done(step, earlier):
            continue
        reused[step.name] = earlier
        if dry_run:
            continue
        step.out_dir.mkdir(parents=True, exist_ok=True)
        for child in earlier.iterdir():
            link = step.out_dir / child.name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(child.resolve(), target_is_directory=child.is_dir())
        log.info("hierarchy: %s reused from %s", step.name, earlier)
    return reused


@contextmanager
def _export_lock(plan: HierarchyPlan):
    """Held while the plan's world data and recoveries are checked and exported: a second process (the other
    model's chain) waits for the first one's export instead of writing into the same folders."""
    import fcntl

    Path(plan.root).mkdir(parents=True, exist_ok=True)
    with open(Path(plan.root) / ".export.lock", "w") as lock:  # closing the file releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_data(plan: HierarchyPlan, progress: bool) -> Path:
    with _export_lock(plan):
        return _ensure_data(plan, progress)


def _ensure_data(plan: HierarchyPlan, progress: bool) -> Path:
    ensure_recoveries(plan, progress)
    out = plan.data_dir
    if (out / "train.json").is_file() and (out / "test.json").is_file():
        return out
    from wamdiff_ros.world.dataset import main as export

    held_out = plan.episodes if plan.eval_episodes is None else plan.eval_episodes
    together = held_out == plan.episodes and not plan.counterfactual_commands
    runs = [("train,val,test", plan.episodes)] if together else [("train", plan.episodes), ("val,test", held_out)]
    for splits, episodes in runs:
        args = ["generate", "--scenarios", plan.scenarios, "--episodes", str(episodes), "--split", splits,
                "--workers", str(plan.workers), "--out", str(out), "--overwrite",
                *(["--counterfactual-commands"] if plan.counterfactual_commands and splits == "train" else []),
                *_export_format(plan)]
        if export(args + ([] if progress else ["--no-progress"])) != 0:
            raise RuntimeError(f"the world's data export into {out} failed")
    return out


def _selected(name: str, *patterns: list[str] | None) -> bool:
    return all(not globs or any(fnmatch.fnmatchcase(name, g) for g in globs) for globs in patterns)


def run(plan: HierarchyPlan, progress: bool = True, dry_run: bool = False,
        only: list[str] | None = None, within: list[str] | None = None,
        wait: float = 0.0) -> list[tuple[str, str, Path | None]]:
    """Runs what is missing; returns (step, what happened, its last checkpoint) per step. ``only``: glob patterns
    of step names (e.g. ``student/*``) to run a part, say the teacher's and the student's chains in two processes;
    a step whose predecessor has not finished or whose DAgger data is not exported yet stops with an error naming
    it, or with ``wait`` > 0 checks again every ``wait`` seconds until it is there (the other process makes it).
    The earlier plan of ``reuse`` runs first, its reused steps only, and of those only the ones ``only`` selects too
    (``within``, passed down)."""
    from wamdiff_training.engine import train
    from wamdiff_training.stages import STAGES

    report = []
    steps = plan_steps(plan)
    if not any(_selected(step.name, only, within) for step in steps):
        return report
    if plan.reuse is not None and plan.reuse.plan is not None and not dry_run:  # the earlier plan's runs first
        run(load_plan(plan.reuse.plan), progress, only=plan.reuse.runs,
            within=(only or []) if within is None else within, wait=wait)  # the caller's selection, all the way down
    if not dry_run:
        ensure_data(plan, progress)
    planned = {step.out_dir: step.steps for step in steps}
    reused = link_reused(plan, steps, dry_run)
    for step in steps:
        if not _selected(step.name, only, within):
            continue
        if step.name in reused:
            here = step.out_dir / "train.json" if step.stage == "dagger-data" else _latest(step.out_dir)
            report.append((step.name, f"reused from {reused[step.name]}", None if dry_run else here))
            continue
        if step.stage == "dagger-data":
            data = step.out_dir / "train.json"
            if data.is_file():
                report.append((step.name, "done (exported)", data))
            elif dry_run:
                report.append((step.name, "to export", None))
            else:
                _await_inputs(step, planned, wait)
                driver = _resolve(next(o for o in step.overrides if o.startswith("driver=")), planned)
                log.info("hierarchy: %s (DAgger export driven by %s)", step.name, driver.partition("=")[2])
                export_dagger(plan, step, driver.partition("=")[2], progress)
                report.append((step.name, "exported", data))
            continue
        done = _done_steps(step.out_dir)
        if done >= step.steps:
            report.append((step.name, f"done ({done} steps)", _latest(step.out_dir)))
            continue
        if dry_run:
            earlier = _reuse_source(plan, step) if plan.reuse is not None and plan.reuse.plan is not None else None
            if earlier is not None:  # the earlier plan trains it first, then this one links it in
                report.append((step.name, f"to run in {earlier} (at step {_done_steps(earlier)}), then reused",
                               None))
            else:
                report.append((step.name, f"to run ({done}/{step.steps} steps)", None))
            continue
        _await_inputs(step, planned, wait)
        overrides = [_resolve(o, planned) for o in step.overrides] + [
            f"train.steps={step.steps}", f"train.warmup={min(20, max(1, step.steps // 10))}", f"out.dir={step.out_dir}"]
        config = load_config(CONFIGS / f"{step.base}.yaml", overrides)
        log.info("hierarchy: %s (%s, %d steps%s)", step.name, step.stage, step.steps,
                 f", resuming at {done}" if done else "")
        result = train(config, STAGES[step.stage], step.stage, resume=checkpoint.LATEST if done else None,
                       progress=progress)
        report.append((step.name, f"trained ({done} -> {result.steps} steps)", result.checkpoint))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-train hierarchy", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default=str(CONFIGS / "tiny_hierarchy.yaml"), help="hierarchy plan YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a plan field, e.g. --set root=out/tiny --set ar_steps=100")
    p.add_argument("--only", default=None, metavar="GLOBS",
                   help="comma-separated step-name patterns to run, e.g. 'teacher/*' (default: every step)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="a step whose predecessor or DAgger data another process is still making waits for it, "
                        "checking every SECONDS (default 0: stop with an error naming it)")
    p.add_argument("--dry-run", action="store_true", help="list the steps and what is done, run nothing")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s wamdiff-train: %(message)s", datefmt="%H:%M:%S")
    try:
        plan = load_plan(args.plan)
        for assignment in args.overrides:
            key, _, value = assignment.partition("=")
            if key not in HierarchyPlan.__slots__ or key in ("teacher", "student"):
                raise ConfigError("--set", key, "not a plain plan field")
            setattr(plan, key, yaml.safe_load(value))
        only = [g.strip() for g in args.only.split(",") if g.strip()] if args.only else None
        if args.wait < 0:
            raise ValueError(f"--wait: seconds >= 0, got {args.wait}")
        report = run(plan, progress=not args.no_progress, dry_run=args.dry_run, only=only, wait=args.wait)
    except (ConfigError, OSError, RuntimeError, ValueError) as exc:
        print(f"wamdiff-train hierarchy: error: {exc}", file=sys.stderr)
        return 2
    if not report:
        print("wamdiff-train hierarchy: no step matches --only", file=sys.stderr)
        return 2
    width = max(len(name) for name, _, _ in report)
    for name, what, ckpt in report:
        print(f"{name:<{width}}  {what:<28}  {ckpt or ''}")
    return 0
