"""Stage III: model-wise cross-scale distillation (anchors §1: + model distillation 87.7 -> 88.3 PDMS; an 8B AR
teacher instead gives 79.9, its top-5 overlap with the 2B student 51.2 % vs 58.2 % for the 8B diffusion teacher).

A larger teacher (other depth / width, the same tokenizer) guides a smaller student on the same states with the same
divergence as Stage II (``distill``). A diffusion teacher scores a state by Stage II's rule (its own blocks, clean
context before each). An AR teacher (the paper's ablation) cannot read a noisy state: its logit at position i-1
given the clean prefix (prompt ⊕ answer[:i]) is aligned with the student's in-place logit at the masked position i,
the alignment of ``overlap.ar_aligned_overlap`` (``ar_aligned_logits`` below).
"""

from __future__ import annotations

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
    return CrossScaleStage(teacher, **stage_kwargs(section, bundle))
