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
    lr: float | None = None  # None: the stage config's

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


def _section(kind: type, raw: dict, key: str, source: str):
    """A plan section (a mapping) as ``kind``; an unknown key is refused with the keys ``kind`` knows."""
    names = [f.name for f in fields(kind)]
    unknown = set(raw) - set(names)
    if unknown:
        raise ConfigError(source, f"{key}.{sorted(unknown)[0]}", f"unknown key; known: {', '.join(names)}")
    return kind(**raw)


@dataclass(slots=True)
class RecoveryPlan:
    """Lane recoveries (``wamdiff-train data recoveries``) exported once beside the world data and trained on by every
    run, as the mix group ``plan/recovery`` with ``weight``."""

    samples: int = 1000  # recovery worlds per scenario
    scenarios: str = "highway"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.samples < 1 or self.weight < 0:
            raise ConfigError("hierarchy", "recoveries", f"samples must be >= 1 and weight >= 0; got {self}")


@dataclass(slots=True)
class VariantsPlan:
    """Training-only expert exports beside the low-speed data (``lowspeed.variants``): ``episodes`` per scenario of
    ``scenarios`` (names or ``all``) from ``scenario_file`` (a file, or a frozen set's name such as ``v1``)."""

    scenario_file: str
    scenarios: str = "all"
    episodes: int = 20

    def __post_init__(self) -> None:
        from wamdiff_ros.world.scenarios import ScenarioError, load_scenarios

        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise ConfigError("hierarchy", "lowspeed.variants.episodes",
                              f"must be an integer >= 1; got {self.episodes}")
        try:
            known = load_scenarios(self.scenario_file)
            if self.scenarios != "all":
                for name in self.scenarios.split(","):
                    known.get(name.strip())
        except ScenarioError as exc:
            raise ConfigError("hierarchy", "lowspeed.variants", str(exc)) from exc


LOWSPEED = "student/lowspeed"
LOWSPEED_SEED_OFFSET = 100_000  # its exports' first training episode: clear of the chain's own and its DAgger rounds'


@dataclass(slots=True)
class LowSpeedPlan:
    """Driving from standstill and at low speed, after the chain: the student continues at the curriculum's last B
    from ``init`` (a checkpoint folder, e.g. the shipped ``wamdiff_ros/assets/wamdiff-tiny``; None: the chain's Stage
    III run) on its own exports -- ``episodes`` expert episodes per scenario of ``scenarios`` from ``scenario_file``
    and ``replay`` per scenario of the plan's own set (what it drove before, so it keeps it) -- for ``steps``
    steps, then ``dagger`` rounds driven by the model so far over ``scenarios``, each trained on the union so far;
    ``task_weights`` are added to (or replace) the plan's own for these steps (e.g. ``plan/rest_start``). Two
    optional widenings: ``variants`` (a ``VariantsPlan``) exports training-only scenarios beside them (e.g. the v1
    roads from rest), and ``dagger_scenarios`` drives the DAgger rounds over other scenarios of ``scenario_file``
    than ``scenarios`` (e.g. ``all``: the v1 ones too, so their own failures are labelled)."""

    scenario_file: str = "v2"
    scenarios: str = "start_clear,start_queue,stop_and_go,give_way_stop"
    episodes: int = 40
    replay: int = 10
    variants: VariantsPlan | dict | None = None
    dagger_scenarios: str | None = None
    steps: int = 1000
    lr: float | None = None
    init: str | None = None
    dagger: DaggerPlan | dict | None = None
    task_weights: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dagger, dict):
            self.dagger = _section(DaggerPlan, self.dagger, "lowspeed.dagger", "hierarchy")
        if isinstance(self.variants, dict):
            self.variants = _section(VariantsPlan, self.variants, "lowspeed.variants", "hierarchy")
        if self.task_weights is not None and (not isinstance(self.task_weights, dict) or not all(
                isinstance(v, (int, float)) and v >= 0 for v in self.task_weights.values())):
            raise ConfigError("hierarchy", "lowspeed.task_weights", f"expected group: weight >= 0, got "
                                                                    f"{self.task_weights!r}")
        if self.episodes < 1 or self.replay < 0 or self.steps < 1 or (self.lr is not None and not self.lr > 0):
            raise ConfigError("hierarchy", "lowspeed", f"episodes and steps must be >= 1, replay >= 0, lr > 0; got "
                                                       f"{self}")
        if self.init is not None and not Path(self.init).is_dir():
            raise ConfigError("hierarchy", "lowspeed.init", f"{self.init}: not a checkpoint folder")


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
    dagger: DaggerPlan | None = None
    adapt_dagger: DaggerPlan | None = None  # rounds driven by each model's B = 32 model, after its Stage I
    ablations: bool = True  # the student's ablation runs after the main chain (see plan_steps)
    ar_in_place_weight: float = 0.0  # ar.in_place_weight of every AR run (pretraining and DAgger rounds)
    ar_lr: float | None = None  # the AR pretraining runs' learning rate; None: the AR config's
    recoveries: RecoveryPlan | None = None
    # the training exports (the world's train split and every DAgger round's) also label each junction approach
    # frame under the other commands (wamdiff-train data generate --counterfactual-commands); held-out splits never do
    counterfactual_commands: bool = False
    # every export (the world's splits, DAgger rounds, recoveries) writes the plan prompts' optional route line
    # (wamdiff-train data --route-points) and its plan answers in this waypoint format (--format-version)
    route_points: bool = False
    format_version: int = fmt.FORMAT_VERSION
    lowspeed: LowSpeedPlan | None = None  # the student's low-speed continuation after Stage III (LOWSPEED steps)

    @property
    def data_dir(self) -> Path:
        return Path(self.root) / "data"


@dataclass(slots=True)
class Step:
    name: str  # e.g. "student/adapt/b08"
    stage: str  # the wamdiff-train stage, or "dagger-data" (an export driven by the model; steps 0)
    base: str  # the tiny config file it starts from
    out_dir: Path
    steps: int
    overrides: list[str]


def _read_plan(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The plan's keys; ``extends: <file>`` (beside it) takes that plan's keys first, this file's replace them."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "", f"expected a mapping of plan keys, got a {type(raw).__name__}")
    if "extends" not in raw:
        return raw
    base = path.parent / str(raw.pop("extends"))
    if base.resolve() in seen:
        raise ConfigError(str(path), "extends", f"{base} extends itself")
    if not base.is_file():
        raise ConfigError(str(path), "extends", f"{base}: no such plan")
    return {**_read_plan(base, (*seen, path.resolve())), **raw}


def load_plan(path: str | Path) -> HierarchyPlan:
    raw = _read_plan(Path(path))
    known = set(HierarchyPlan.__slots__)
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(str(path), sorted(unknown)[0], f"unknown key; known: {', '.join(sorted(known))}")
    if "root" not in raw:
        raise ConfigError(str(path), "root", "missing: the folder every run of the hierarchy writes into")
    for key, kind in (("teacher", ModelPlan), ("student", ModelPlan), ("dagger", DaggerPlan),
                      ("adapt_dagger", DaggerPlan), ("recoveries", RecoveryPlan), ("lowspeed", LowSpeedPlan)):
        if raw.get(key) is not None:
            raw[key] = _section(kind, raw[key], key, str(path))
    plan = HierarchyPlan(**raw)
    value = plan.cross_scale_ce_weight
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value and math.isfinite(value)):
        raise ConfigError(str(path), "cross_scale_ce_weight", f"must be a finite number >= 0, got {value!r}")
    if plan.format_version not in fmt.FORMAT_VERSIONS or isinstance(plan.format_version, bool):
        raise ConfigError(str(path), "format_version",
                          f"the exports write one of {fmt.FORMAT_VERSIONS}, got {plan.format_version!r}")
    if not isinstance(plan.route_points, bool):
        raise ConfigError(str(path), "route_points", f"true or false, got {plan.route_points!r}")
    for who, other in (("teacher", "student"), ("student", "teacher")):
        lender = getattr(plan, who).dagger_from
        if lender is not None and lender != other:
            raise ConfigError(str(path), f"{who}.dagger_from", f"{lender!r}: the only other model is {other!r}")
        if lender is not None and getattr(plan, other).dagger_from is not None:
            raise ConfigError(str(path), f"{who}.dagger_from", f"{other!r} borrows its DAgger data too: one must drive")
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
    data = [plan.data_dir / "train.json"]
    if plan.recoveries is not None:
        data.append(recovery_data(plan))
        weights["plan/recovery"] = plan.recoveries.weight
    base = [f"train.batch_size={plan.batch_size}", f"out.checkpoint_every={plan.checkpoint_every}", "out.keep=2",
            *(f"data.task_weights.{task}={w}" for task, w in weights.items())]
    steps: list[Step] = []
    commons: dict[str, list[str]] = {}  # each model's training data (with any DAgger rounds') for the later stages
    # a model that trains on the other's DAgger exports comes after it, so its rounds find their data exported
    order = ("student", "teacher") if plan.teacher.dagger_from == "student" else ("teacher", "student")
    for who in order:
        common = commons[who] = [_union(data), *base]
        m: ModelPlan = getattr(plan, who)
        ar_dir = root / who / "ar"
        ar_steps = m.ar_steps if m.ar_steps is not None else plan.ar_steps
        steps.append(Step(f"{who}/ar", "ar", "tiny_ar", ar_dir, ar_steps, [
            *common, f"ar.in_place_weight={plan.ar_in_place_weight}", f"model.tiny.hidden={m.hidden}",
            f"model.tiny.layers={m.layers}", f"model.tiny.seed={m.seed}",
            f"model.tiny.vision_hidden={m.vision_hidden}", f"model.tiny.vision_depth={m.vision_depth}",
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
                          *_ce_weight(plan)]))
    if plan.ablations:
        steps += ablation_steps(plan, common)
    if plan.lowspeed is not None:
        steps += lowspeed_steps(plan, base)
    return steps


def lowspeed_steps(plan: HierarchyPlan, base: list[str]) -> list[Step]:
    """``plan.lowspeed``'s exports, its run and its DAgger rounds (``LOWSPEED/...``)."""
    low, root = plan.lowspeed, Path(plan.root) / LOWSPEED
    big = plan.curriculum[-1]
    base = [*base, *(f"data.task_weights.{task}={w}" for task, w in (low.task_weights or {}).items())]
    steps = [Step(f"{LOWSPEED}/data", "world-data", "", root / "data", 0, [
        f"scenario_file={low.scenario_file}", f"scenarios={low.scenarios}", f"episodes={low.episodes}",
        f"seed_offset={LOWSPEED_SEED_OFFSET}"])]
    files = [root / "data" / "train.json"]
    if low.replay:
        steps.append(Step(f"{LOWSPEED}/replay", "world-data", "", root / "replay", 0, [
            "scenario_file=", f"scenarios={plan.scenarios}", f"episodes={low.replay}",
            f"seed_offset={LOWSPEED_SEED_OFFSET}"]))
        files.append(root / "replay" / "train.json")
    if low.variants is not None:
        v = low.variants
        steps.append(Step(f"{LOWSPEED}/variants", "world-data", "", root / "variants", 0, [
            f"scenario_file={v.scenario_file}", f"scenarios={v.scenarios}", f"episodes={v.episodes}",
            f"seed_offset={LOWSPEED_SEED_OFFSET}"]))
        files.append(root / "variants" / "train.json")
    lr = [] if low.lr is None else [f"train.lr={low.lr}"]
    start = low.init if low.init is not None else f"@run:{final_chain_run(plan)}"
    steps.append(Step(LOWSPEED, "adapt", "tiny_adapt", root / "run", low.steps, [
        _union(files), *base, *lr, f"model.init={start}", f"adapt.block_size={big}"]))
    previous = root / "run"
    d = low.dagger
    # the rounds' episodes follow every expert export's (their scenarios may overlap: DAgger over v1's and the replay)
    first = LOWSPEED_SEED_OFFSET + max(low.episodes, low.replay, low.variants.episodes if low.variants else 0)
    for r in range(1, (d.rounds if d is not None else 0) + 1):
        run_dir = root / "dagger" / f"r{r:02d}"
        steps.append(Step(f"{LOWSPEED}/dagger/r{r:02d}/data", "dagger-data", "", run_dir / "data", 0, [
            f"driver=@run:{previous}", f"seed_offset={first + (r - 1) * d.episodes}",
            f"episodes={d.episodes}", f"expert_share={d.share(r)}", f"scenario_file={low.scenario_file}",
            f"scenarios={low.dagger_scenarios or low.scenarios}"]))
        files.append(run_dir / "data" / "train.json")
        round_lr = [f"train.lr={d.lr}"] if d.lr is not None else lr
        steps.append(Step(f"{LOWSPEED}/dagger/r{r:02d}", "adapt", "tiny_adapt", run_dir, d.steps, [
            _union(files), *base, *round_lr, f"model.init=@run:{previous}", f"adapt.block_size={big}"]))
        previous = run_dir
    return steps


def final_chain_run(plan: HierarchyPlan) -> Path:
    """Stage III's run: the student the chain ends with."""
    return Path(plan.root) / "student" / "cross_scale"


def final_run(plan: HierarchyPlan) -> Path:
    """The student the hierarchy ends with (the one to ship): the low-speed continuation's last run where the plan
    has one, else Stage III's run."""
    if plan.lowspeed is None:
        return final_chain_run(plan)
    d = plan.lowspeed.dagger
    root = Path(plan.root) / LOWSPEED
    return root / "dagger" / f"r{d.rounds:02d}" if d is not None else root / "run"


def ar_run(plan: HierarchyPlan, who: str) -> Path:
    """``who``'s final AR model: its last DAgger round, or its AR pretraining run when the plan has none."""
    root = Path(plan.root) / who
    return root / "ar" if plan.dagger is None else root / "dagger" / f"r{plan.dagger.rounds:02d}"


def _ce_weight(plan: HierarchyPlan) -> list[str]:
    """Stage III's ground-truth anchor as an override; none at 0 (the config default), so earlier plans' runs keep
    their settings."""
    return [f"cross_scale.ce_weight={plan.cross_scale_ce_weight}"] if plan.cross_scale_ce_weight else []


def _union(files: list[Path]) -> str:
    return f"data.train=[{','.join(str(f) for f in files)}]"


def _dagger_steps(plan: HierarchyPlan, who: str, previous: Path, base: list[str], steps: list[Step],
                  files: list[Path], kind: str) -> tuple[Path, list[Path]]:
    """Appends ``who``'s DAgger rounds of ``kind`` to ``steps``: ``plan.dagger``'s AR rounds or ``plan.adapt_dagger``'s
    (driven by the B = 32 model, trained with Stage I's loss at that B); returns the last round's run and the data
    files (``files`` plus every round's) the rest of ``who``'s chain trains on. A model with ``dagger_from`` exports
    nothing: its round r trains on the lender's exports of rounds 1..r. ``previous`` is a run folder (``@run:``,
    resolved when the step starts)."""
    d, root = getattr(plan, kind), Path(plan.root)
    model: ModelPlan = getattr(plan, who)
    round_steps = model.dagger_steps if model.dagger_steps is not None else d.steps
    lender = model.dagger_from
    # fresh training seeds: after the plan's episodes and, for the B = 32 rounds, every AR round's
    first = plan.episodes + (plan.dagger.rounds * plan.dagger.episodes if plan.dagger and kind != "dagger" else 0)
    lr = [] if d.lr is None else [f"train.lr={d.lr}"]
    stage = ("ar", "tiny_ar", [f"ar.in_place_weight={plan.ar_in_place_weight}"]) if kind == "dagger" else \
        ("adapt", "tiny_adapt", [f"adapt.block_size={plan.curriculum[-1]}"])
    start = f"@run:{previous}"
    files = list(files)
    for r in range(1, d.rounds + 1):
        run_dir = root / who / kind / f"r{r:02d}"
        source = start if r == 1 else f"@run:{previous}"
        if lender is None:
            steps.append(Step(f"{who}/{kind}/r{r:02d}/data", "dagger-data", "", run_dir / "data", 0, [
                f"driver={source}", f"seed_offset={first + (r - 1) * d.episodes}", f"episodes={d.episodes}",
                f"expert_share={d.share(r)}"]))
        files.append((root / lender / kind / f"r{r:02d}" if lender else run_dir) / "data" / "train.json")
        steps.append(Step(f"{who}/{kind}/r{r:02d}", stage[0], stage[1], run_dir, round_steps, [
            _union(files), *base, *lr, f"model.init={source}", *stage[2]]))
        previous = run_dir
    return previous, files


def _export_format(plan: HierarchyPlan) -> list[str]:
    """The export flags every export of ``plan`` shares: its answers' format version and the route line."""
    return ["--format-version", str(plan.format_version), *(["--route-points"] if plan.route_points else [])]


def _export(args: list[str], progress: bool) -> int:
    """``wamdiff-train data`` (the world's dataset export) with ``args``."""
    from wamdiff_training.world.dataset import main as export

    return export(args + ([] if progress else ["--no-progress"]))


def export_dagger(plan: HierarchyPlan, step: Step, driver: str, progress: bool) -> None:
    """A DAgger round's data: the round's ``episodes`` fresh training episodes per scenario driven partly by
    ``driver`` (``step.out_dir`` / train.json; written last, so an export cut short runs again)."""
    setting = dict(o.split("=", 1) for o in step.overrides)
    offset, share = setting["seed_offset"], setting["expert_share"]
    args = ["generate", "--scenarios", setting.get("scenarios", plan.scenarios), "--episodes", setting["episodes"],
            "--split", "train", "--seed-offset", offset, "--noise-fraction", "0", "--driver", driver, "--expert-share",
            share, "--workers", str(plan.workers), "--out", str(step.out_dir), "--overwrite",
            *(["--scenario-file", setting["scenario_file"]] if setting.get("scenario_file") else []),
            *(["--counterfactual-commands"] if plan.counterfactual_commands else []), *_export_format(plan)]
    if _export(args, progress) != 0:
        raise RuntimeError(f"the DAgger export into {step.out_dir} failed")


def export_world(plan: HierarchyPlan, step: Step, progress: bool) -> None:
    """An expert export of its own (``world-data``: the low-speed continuation's): ``episodes`` training episodes per
    scenario from ``seed_offset``, DAgger-lite perturbed as the plan's own data (``step.out_dir`` / train.json)."""
    setting = dict(o.split("=", 1) for o in step.overrides)
    args = ["generate", "--scenarios", setting["scenarios"], "--episodes", setting["episodes"], "--split", "train",
            "--seed-offset", setting["seed_offset"], "--workers", str(plan.workers), "--out", str(step.out_dir),
            "--overwrite", *(["--scenario-file", setting["scenario_file"]] if setting["scenario_file"] else []),
            *(["--counterfactual-commands"] if plan.counterfactual_commands else []), *_export_format(plan)]
    if _export(args, progress) != 0:
        raise RuntimeError(f"the export into {step.out_dir} failed")


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
    cross = [*common, f"model.init=@run:{student / 'distill'}", f"cross_scale.block_size={big}", *_ce_weight(plan)]
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
    if plan.recoveries is None or recovery_data(plan).is_file():
        return
    r = plan.recoveries
    args = ["recoveries", "--scenarios", r.scenarios, "--samples", str(r.samples), "--split", "train",
            "--workers", str(plan.workers), "--out", str(recovery_data(plan).parent), "--overwrite",
            *_export_format(plan)]
    if _export(args, progress) != 0:
        raise RuntimeError(f"the recovery export into {recovery_data(plan).parent} failed")


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
    held_out = plan.episodes if plan.eval_episodes is None else plan.eval_episodes
    together = held_out == plan.episodes and not plan.counterfactual_commands
    runs = [("train,val,test", plan.episodes)] if together else [("train", plan.episodes), ("val,test", held_out)]
    for splits, episodes in runs:
        args = ["generate", "--scenarios", plan.scenarios, "--episodes", str(episodes), "--split", splits,
                "--workers", str(plan.workers), "--out", str(out), "--overwrite",
                *(["--counterfactual-commands"] if plan.counterfactual_commands and splits == "train" else []),
                *_export_format(plan)]
        if _export(args, progress) != 0:
            raise RuntimeError(f"the world's data export into {out} failed")
    return out


def _selected(name: str, globs: list[str] | None) -> bool:
    return not globs or any(fnmatch.fnmatchcase(name, g) for g in globs)


def run(plan: HierarchyPlan, progress: bool = True, dry_run: bool = False, only: list[str] | None = None,
        wait: float = 0.0) -> list[tuple[str, str, Path | None]]:
    """Runs what is missing; returns (step, what happened, its last checkpoint) per step. ``only``: glob patterns
    of step names (e.g. ``student/*``) to run a part, say the teacher's and the student's chains in two processes;
    a step whose predecessor has not finished or whose DAgger data is not exported yet stops with an error naming
    it, or with ``wait`` > 0 checks again every ``wait`` seconds until it is there (the other process makes it)."""
    from wamdiff_training.engine import train
    from wamdiff_training.stages import STAGES

    report = []
    steps = plan_steps(plan)
    if not any(_selected(step.name, only) for step in steps):
        return report
    if not dry_run and any(_selected(s.name, only) and not s.name.startswith(LOWSPEED) for s in steps):
        ensure_data(plan, progress)  # the low-speed continuation exports its own
    planned = {step.out_dir: step.steps for step in steps}
    for step in steps:
        if not _selected(step.name, only):
            continue
        if step.stage in ("world-data", "dagger-data"):  # exports: written last, so one cut short runs again
            data = step.out_dir / "train.json"
            if data.is_file():
                report.append((step.name, "done (exported)", data))
            elif dry_run:
                report.append((step.name, "to export", None))
            elif step.stage == "world-data":
                log.info("hierarchy: %s (export)", step.name)
                export_world(plan, step, progress)
                report.append((step.name, "exported", data))
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
            section, _, field_name = key.rpartition(".")
            if section == "lowspeed" and plan.lowspeed is not None and field_name in LowSpeedPlan.__slots__:
                setattr(plan.lowspeed, field_name, yaml.safe_load(value))
                plan.lowspeed.__post_init__()
                continue
            if key not in HierarchyPlan.__slots__ or key in ("teacher", "student", "lowspeed"):
                raise ConfigError("--set", key, "not a plain plan field (or lowspeed.<field> of a plan with one)")
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
