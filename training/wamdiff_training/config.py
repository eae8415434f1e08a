"""The training configuration: one YAML file -> one validated ``Config``; every error names the dotted field.

Sections: ``model`` (initial weights), ``data`` (record files, task mix), ``train`` (batch, optimiser, schedule,
wrapping), ``out`` (folder, checkpoints, logs) and one section per stage (``ar``). ``--set train.lr=3e-4`` edits the
raw mapping before validation. Strings expand ``${VAR}`` from the environment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from wamdiff_ros.errors import FieldError
from wamdiff_training.sampling import DEFAULT_WEIGHTS

WRAPS = ("none", "ddp", "fsdp2")
PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on GPU, fp32 on CPU
TURNS = ("all", "first")
# Fields that do not change the trained weights: a run may resume with them changed.
RESUME_NEUTRAL = {"out", "data.cache_size"}
# Fields added after runs were made, with the value that means "as before": left out of the fingerprint while they
# hold it, so a run checkpointed before the field existed still resumes.
ADDED_DEFAULTS = {"ar.in_place_weight": 0.0}


class ConfigError(FieldError):
    """A config file, a field in it or a ``--set`` override is wrong; the message names the file and the field."""

    def __init__(self, source: str, field_name: str, message: str) -> None:
        Exception.__init__(self, f"{source}: {field_name}: {message}" if field_name else f"{source}: {message}")
        self.field, self.source = field_name, source


@dataclass(slots=True)
class TinyModel:
    hidden: int = 128
    layers: int = 4
    seed: int = 0
    vision_hidden: int = 64  # the vision tower's width and depth
    vision_depth: int = 2


@dataclass(slots=True)
class ModelConfig:
    init: str = "tiny-random"  # "tiny-random" or a checkpoint folder
    tiny: TinyModel = field(default_factory=TinyModel)


@dataclass(slots=True)
class DataConfig:
    train: list[str] = field(default_factory=list)  # record JSON files (wamdiff-train data exports, NAVSIM conversions)
    root: str | None = None  # image paths resolve against this instead of each file's folder
    turns: str = "all"
    task_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    epoch_size: int | None = None  # draws per epoch; default one per record
    limit: int | None = None  # keep only the first N records (overfit checks)
    cache_size: int = 0  # encoded samples kept in memory per rank


@dataclass(slots=True)
class TrainConfig:
    batch_size: int = 1  # samples per micro-batch per rank; global batch = batch_size * grad_accum * world_size
    grad_accum: int = 1
    steps: int = 100  # optimiser steps
    lr: float = 1e-4
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup: int = 0  # linear warm-up steps
    weight_decay: float = 0.0  # on matrices only, never on norms / biases
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0  # global L2 norm; 0 turns clipping off
    wrap: str = "none"  # none | ddp | fsdp2
    precision: str = "auto"
    seed: int = 0


@dataclass(slots=True)
class OutConfig:
    dir: str = "out/train"
    checkpoint_every: int = 0  # steps; 0: only at the end
    keep: int = 2  # newest checkpoints kept; 0 keeps all
    log_every: int = 1
    tensorboard: bool = True  # when torch.utils.tensorboard imports


@dataclass(slots=True)
class ArSection:
    """Phase 1, autoregressive multi-task pretraining."""

    freeze_vision: bool = False  # train the language side only
    # > 0: also the B = 1 in-place loss (every answer token [MASK]ed, predicted at its own position from the clean
    # prefix) with this weight, from the same forward: the next-token logits come from the layout's clean copy,
    # which attends exactly as the AR layout. 0 (the paper): next-token only; Stage I's B = 1 then learns the
    # in-place head from scratch.
    in_place_weight: float = 0.0


PAPER_CURRICULUM = (1, 4, 8, 16, 32)  # Stage I: B = 1 -> 4 -> 8 -> 16 -> 32


@dataclass(slots=True)
class AdaptSection:
    """The ``adapt:`` config section (one curriculum phase per run; ``curriculum`` plans the whole ladder)."""

    block_size: int = 1  # this run's B (the curriculum's overrides set it per phase)
    curriculum: list[int] = field(default_factory=lambda: list(PAPER_CURRICULUM))
    steps_per_phase: list[int] = field(default_factory=list)  # one per phase, or one for all; empty: train.steps
    t_min: float = 0.0  # per-block mask rate t ~ stratified U[t_min, t_max)
    t_max: float = 1.0
    prompt_attention: str = "block_causal"  # prompt in B-chunks (WAM-Diff2) or causal; saved in DecodeMeta
    pad_answers: bool = True  # EOS-pad answers to whole blocks, as the decoder's last block holds B tokens


@dataclass(slots=True)
class DistillSection:
    """The ``distill:`` config section."""

    teacher: str = ""  # the small-block diffusion teacher's checkpoint folder, or "tiny-random"
    teacher_tiny: TinyModel = field(default_factory=TinyModel)  # when teacher is tiny-random
    teacher_block_size: int | None = None  # None: the teacher's trained_block_size
    teacher_dtype: str = "auto"
    block_size: int = 32  # the student's
    divergence: str = "jsd"  # jsd | fkl | rkl
    beta: float = 0.5
    temperature: float = 1.0
    ce_weight: float = 0.0
    t_min: float = 0.1  # mask ratio of random states and the on-policy stopping rate
    t_max: float = 0.5
    on_policy: float = 0.5
    threshold: float = 0.9  # the student's decode settings in the rollout
    schedule: str = "threshold"
    decode_steps: int = 32
    rollout_steps: int = 8  # at most this many rollout forwards per training step
    prompt_attention: str = "block_causal"
    pad_answers: bool = True


@dataclass(slots=True)
class CrossScaleSection(DistillSection):
    """The ``cross_scale:`` config section: ``distill``'s keys plus the teacher's kind."""

    teacher_kind: str = "auto"


@dataclass(slots=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: OutConfig = field(default_factory=OutConfig)
    ar: ArSection = field(default_factory=ArSection)
    adapt: AdaptSection = field(default_factory=AdaptSection)
    distill: DistillSection = field(default_factory=DistillSection)
    cross_scale: CrossScaleSection = field(default_factory=CrossScaleSection)
    source: str = field(default="<config>", metadata={"internal": True})

    def as_dict(self) -> dict:
        return {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("internal")}

    def fingerprint(self) -> str:
        """sha256 of every field that shapes the trained weights (all but ``RESUME_NEUTRAL``, and the
        ``ADDED_DEFAULTS`` that hold their old-behaviour value)."""
        raw = self.as_dict()
        for name in RESUME_NEUTRAL:
            section, _, key = name.partition(".")
            if key:
                raw[section].pop(key, None)
            else:
                raw.pop(section, None)
        for name, default in ADDED_DEFAULTS.items():
            section, _, key = name.partition(".")
            if raw.get(section, {}).get(key) == default:
                raw[section].pop(key)
        return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()


def _check_type(source: str, path: str, hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _check_type(source, path, next(a for a in args if a is not type(None)), value)
    if dataclasses.is_dataclass(hint):
        return _build(source, hint, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(source, path, f"expected a list, got {value!r:.60}")
        return [_check_type(source, f"{path}[{i}]", args[0], v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, path, f"expected a mapping, got {value!r:.60}")
        return {_check_type(source, path, args[0], k): _check_type(source, f"{path}.{k}", args[1], v)
                for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(source, path, f"expected {hint.__name__}, got {value!r:.60}")
    return os.path.expandvars(value) if hint is str else value


def _build(source: str, cls: type, raw: Any, prefix: str = "") -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(source, prefix or "<top>", f"expected a mapping, got {raw!r:.60}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs = {}
    for key, value in raw.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(source, path, f"unknown key (known: {', '.join(fields)})")
        kwargs[key] = _check_type(source, path, hints[key], value)
    return cls(**kwargs)


def _require(source: str, ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ConfigError(source, path, message)


def validate(config: Config) -> Config:
    s, t, d, o = config.source, config.train, config.data, config.out
    _require(s, config.model.init != "", "model.init", "must name 'tiny-random' or a checkpoint folder")
    _require(s, config.model.tiny.hidden >= 32 and config.model.tiny.hidden % 32 == 0, "model.tiny.hidden",
             f"must be a positive multiple of 32 (head_dim), got {config.model.tiny.hidden}")
    _require(s, config.model.tiny.layers >= 1, "model.tiny.layers", f"must be >= 1, got {config.model.tiny.layers}")
    vh, vd = config.model.tiny.vision_hidden, config.model.tiny.vision_depth
    _require(s, vh >= 32 and vh % 32 == 0, "model.tiny.vision_hidden", f"must be a positive multiple of 32, got {vh}")
    _require(s, vd >= 1, "model.tiny.vision_depth", f"must be >= 1, got {vd}")
    _require(s, bool(d.train), "data.train", "lists no record file")
    _require(s, d.turns in TURNS, "data.turns", f"must be one of {TURNS}, got {d.turns!r}")
    for task, w in d.task_weights.items():
        _require(s, math.isfinite(w) and w >= 0, f"data.task_weights.{task}", f"must be finite and >= 0, got {w}")
    _require(s, d.epoch_size is None or d.epoch_size >= 1, "data.epoch_size", f"must be >= 1, got {d.epoch_size}")
    _require(s, d.limit is None or d.limit >= 1, "data.limit", f"must be >= 1, got {d.limit}")
    _require(s, d.cache_size >= 0, "data.cache_size", f"must be >= 0, got {d.cache_size}")
    for name in ("batch_size", "grad_accum", "steps"):
        _require(s, getattr(t, name) >= 1, f"train.{name}", f"must be >= 1, got {getattr(t, name)}")
    _require(s, t.lr > 0 and math.isfinite(t.lr), "train.lr", f"must be > 0, got {t.lr}")
    _require(s, 0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", f"must be in [0, 1], got {t.min_lr_ratio}")
    _require(s, 0 <= t.warmup <= t.steps, "train.warmup", f"must be in [0, train.steps={t.steps}], got {t.warmup}")
    _require(s, t.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {t.weight_decay}")
    _require(s, len(t.betas) == 2 and all(0 <= b < 1 for b in t.betas), "train.betas",
             f"must be two numbers in [0, 1), got {t.betas}")
    _require(s, t.eps > 0, "train.eps", f"must be > 0, got {t.eps}")
    _require(s, t.grad_clip >= 0, "train.grad_clip", f"must be >= 0 (0: off), got {t.grad_clip}")
    _require(s, t.wrap in WRAPS, "train.wrap", f"must be one of {WRAPS}, got {t.wrap!r}")
    _require(s, t.precision in PRECISIONS, "train.precision", f"must be one of {PRECISIONS}, got {t.precision!r}")
    _require(s, o.dir != "", "out.dir", "must name a folder")
    for name in ("checkpoint_every", "keep"):
        _require(s, getattr(o, name) >= 0, f"out.{name}", f"must be >= 0, got {getattr(o, name)}")
    _require(s, o.log_every >= 1, "out.log_every", f"must be >= 1, got {o.log_every}")
    w = config.ar.in_place_weight
    _require(s, math.isfinite(w) and w >= 0, "ar.in_place_weight", f"must be finite and >= 0, got {w}")
    return config


def apply_override(raw: dict, assignment: str, source: str = "--set") -> None:
    """``key.sub=value`` into the raw mapping; the value is parsed as YAML (numbers, booleans, lists)."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(source, assignment, "expected key=value, e.g. train.lr=3e-4")
    parts = key.strip().split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(source, ".".join(parts[: i + 1]), "is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(text)


def from_dict(raw: dict, source: str = "<config>") -> Config:
    config = _build(source, Config, raw)
    config.source = source
    return validate(config)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read, override and validate a YAML config; a missing or unparsable file is a ``ConfigError`` naming it."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"invalid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "", f"expected a mapping at the top, got {type(raw).__name__}")
    for assignment in overrides:
        apply_override(raw, assignment, f"{path} --set")
    return from_dict(raw, str(path))
