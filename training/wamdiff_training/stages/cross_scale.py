"""Stage III: model-wise cross-scale distillation (anchors §1: + model distillation 87.7 -> 88.3 PDMS; an 8B AR
teacher instead gives 79.9, its top-5 overlap with the 2B student 51.2 % vs 58.2 % for the 8B diffusion teacher).

A larger teacher (other depth / width, the same tokenizer) guides a smaller student on the same states with the same
divergence as Stage II (``distill``). A diffusion teacher scores a state by Stage II's rule (its own blocks, clean
context before each). An AR teacher (the paper's ablation) cannot read a noisy state: its logit at position i-1
given the clean prefix (prompt ⊕ answer[:i]) is aligned with the student's in-place logit at the masked position i,
the alignment of ``overlap.ar_aligned_overlap`` (``ar_aligned_logits`` below).

``block_teacher_share`` > 0 (not in the paper) mixes the target with a second diffusion model, the student's own
small-block one (Stage II's block teacher): p = (1 − share) · p_teacher + share · p_block on the same states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from wamdiff_ros.model import ModelBundle
from wamdiff_training.layout import IN_PLACE, NEXT_TOKEN, ar_aligned_logits
from wamdiff_training.stages.common import NoisyState
from wamdiff_training.config import CrossScaleSection
from wamdiff_training.stages.distill import DiffusionTeacher, DistillStage, freeze, load_teacher
from wamdiff_training.stages.distill import stage_kwargs

TEACHER_KINDS = ("auto", "diffusion", "ar")  # auto: from the teacher's DecodeMeta.prediction


@dataclass(slots=True)
class ARTeacher:
    """A next-token teacher: the same clean-prefix prediction for every state of an answer (it never sees the noise,
    which is why the paper finds it a poor guide)."""

    model: nn.Module
    prompt_block_size: int = 1  # an AR checkpoint's prompt is causal
    pad_id: int = 0
    kind: str = "ar"

    def __post_init__(self) -> None:
        freeze(self.model)

    @torch.no_grad()
    def logits(self, states: Sequence[NoisyState]) -> torch.Tensor:
        return ar_aligned_logits(self.model, [(s.prompt, s.answer) for s in states], self.prompt_block_size,
                                 self.pad_id)


@dataclass(slots=True)
class MixedTeacher:
    """(1 − share) · p_teacher + share · p_block as log-probabilities (read as logits by the divergence)."""

    teacher: DiffusionTeacher | ARTeacher
    block: DiffusionTeacher
    share: float
    kind: str = "mixed"

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"block_teacher_share must be in (0, 1], got {self.share}")

    @property
    def parts(self) -> tuple:
        return (self.teacher, self.block)

    @torch.no_grad()
    def logits(self, states: Sequence[NoisyState]) -> torch.Tensor:
        small = torch.log_softmax(self.block.logits(states).float(), dim=-1)
        if self.share == 1.0:  # the block teacher alone: the larger one need not run
            return small
        big = torch.log_softmax(self.teacher.logits(states).float(), dim=-1)
        return torch.logaddexp(big + math.log1p(-self.share), small.to(big.device) + math.log(self.share))


def scenario_of(record_id: str) -> str:
    """A world record's scenario: its id's second field (``train_highway_480_0000_plan`` -> ``highway``)."""
    parts = record_id.split("_")
    return parts[1] if len(parts) > 2 else ""


@dataclass(slots=True)
class RoutedTeacher:
    """Per record (``NoisyState.record``), ``routed``'s target for the records of ``scenarios`` and ``teacher``'s for
    every other (both score the same states): two models, each good where the other is not, taught to one student."""

    teacher: DiffusionTeacher | ARTeacher | MixedTeacher
    routed: DiffusionTeacher
    scenarios: frozenset[str]
    kind: str = "routed"

    @property
    def parts(self) -> tuple:
        return (*getattr(self.teacher, "parts", (self.teacher,)), self.routed)

    @torch.no_grad()
    def logits(self, states: Sequence[NoisyState]) -> torch.Tensor:
        pick = [scenario_of(s.record) in self.scenarios for s in states]
        if not any(pick):
            return self.teacher.logits(states)
        routed = self.routed.logits(states)
        if all(pick):
            return routed
        base = self.teacher.logits(states)  # logits or log-probabilities: each row is read through its softmax
        if base.shape != routed.shape:
            raise ValueError(f"the routed teacher scores the states as {tuple(routed.shape)}, the teacher as "
                             f"{tuple(base.shape)}: give them the same block size")
        lengths = torch.tensor([len(s.answer) for s in states], device=base.device)
        rows = torch.repeat_interleave(torch.tensor(pick, device=base.device), lengths)  # answers' rows, in order
        if rows.numel() != base.shape[0]:
            raise ValueError(f"{base.shape[0]} teacher rows for answers of {lengths.tolist()} tokens")
        return torch.where(rows[:, None], routed.to(base.device, base.dtype), base)


@dataclass(slots=True)
class CrossScaleStage(DistillStage):
    """Stage II's loss with a larger teacher (diffusion or AR); the student keeps its block size."""

    name: str = "cross-scale"


def make_teacher(loaded: ModelBundle, kind: str, pad_id: int, block_size: int | None = None
                 ) -> DiffusionTeacher | ARTeacher:
    if kind not in TEACHER_KINDS:
        raise ValueError(f"teacher_kind {kind!r} is not one of {TEACHER_KINDS}")
    if kind == "auto":
        kind = "ar" if loaded.meta.prediction == NEXT_TOKEN else "diffusion"
    want = NEXT_TOKEN if kind == "ar" else IN_PLACE
    if loaded.meta.prediction != want:  # reading a model under the other convention silently breaks it
        raise ValueError(f"a {kind} teacher needs a {want} checkpoint, got {loaded.meta.prediction}")
    if kind == "ar":
        return ARTeacher(loaded.model, loaded.meta.prompt_block_size, pad_id)
    return DiffusionTeacher(loaded.model, block_size or loaded.meta.trained_block_size, loaded.meta.prompt_block_size,
                            pad_id)


def from_config(config, bundle: ModelBundle) -> CrossScaleStage:
    """The engine's factory: ``config.cross_scale`` (a ``CrossScaleSection``)."""
    section: CrossScaleSection = config.cross_scale
    loaded = load_teacher(section.teacher, section.teacher_tiny, bundle, section.teacher_block_size,
                          ar=section.teacher_kind == "ar")
    teacher = make_teacher(loaded, section.teacher_kind, bundle.eos_token_id, section.teacher_block_size)
    if section.block_teacher_share > 0:
        small = load_teacher(section.block_teacher, section.teacher_tiny, bundle, section.block_teacher_block_size)
        try:
            block = make_teacher(small, "diffusion", bundle.eos_token_id, section.block_teacher_block_size)
        except ValueError as exc:  # not a block-diffusion checkpoint: name the field
            raise ValueError(f"cross_scale.block_teacher {section.block_teacher!r}: {exc}") from exc
        teacher = MixedTeacher(teacher, block, section.block_teacher_share)
    if section.route_teacher:
        other = load_teacher(section.route_teacher, section.teacher_tiny, bundle, section.block_size)
        try:
            routed = make_teacher(other, "diffusion", bundle.eos_token_id, section.block_size)
        except ValueError as exc:
            raise ValueError(f"cross_scale.route_teacher {section.route_teacher!r}: {exc}") from exc
        teacher = RoutedTeacher(teacher, routed, frozenset(section.route_scenarios))
    return CrossScaleStage(teacher, **stage_kwargs(section, bundle))
