"""Stage I: progressive block-wise adaptation (anchors §1: BD3-LM layout, stratified per-block mask rates, in-place
labels, loss only on masked answer positions).

The curriculum B = 1 -> 4 -> 8 -> 16 -> 32 starts from the AR checkpoint; each phase is initialised from its
predecessor's final checkpoint. The switch from shifted (next-token) to in-place labels happens at B = 1, where
block diffusion is in-place AR (every token masked, seen from the clean prefix): ``measure_label_switch`` measures
what that switch costs a model (the paper's direct AR -> diffusion conversion reaches 84.1 PDMS, 88.14 for AR).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from wamdiff_ros.model import DecodeMeta, ModelBundle
from wamdiff_training.config import PAPER_CURRICULUM, AdaptSection
from wamdiff_training.data import Sample
from wamdiff_training.layout import IGNORE, IN_PLACE, Layout, NoiseConfig, ar_layout, diffusion_batch
from wamdiff_training.layout import forward_layouts, in_place_ar_layout
from wamdiff_training.losses import masked_cross_entropy, token_accuracy
from wamdiff_training.stages.common import answer_tokens, call, prompt_block_size, prompt_inputs



@dataclass(slots=True)
class AdaptStage:
    """Masked cross-entropy on the noisy copy of ``prompt ⊕ clean ⊕ noisy`` layouts, blocks of ``block_size``."""

    block_size: int
    mask_token_id: int
    pad_id: int  # eos = pad = <|im_end|>
    noise: NoiseConfig = NoiseConfig()
    prompt_attention: str = "block_causal"
    pad_answers: bool = True
    generator: torch.Generator | None = None  # None: torch's global RNG (seeded per rank, checkpointed by the engine)
    name: str = "adapt"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size {self.block_size} must be >= 1")
        prompt_block_size(self.prompt_attention, self.block_size)  # validates

    @property
    def prompt_block_size(self) -> int:
        return prompt_block_size(self.prompt_attention, self.block_size)

    def layouts(self, samples: Sequence[Sample]) -> list[Layout]:
        answers = [answer_tokens(s, self.block_size, self.pad_id, self.pad_answers) for s in samples]
        return diffusion_batch([prompt_inputs(s) for s in samples], answers, self.block_size, self.mask_token_id,
                               self.prompt_block_size, self.noise, self.generator)

    def loss(self, model: nn.Module, samples: list[Sample], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        layouts = self.layouts(samples)

        def forward(hf_model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out = forward_layouts(hf_model, layouts, pad_id=self.pad_id)
            scored = out.labels != IGNORE
            correct = ((out.logits.detach().argmax(-1) == out.labels) & scored).sum()
            return masked_cross_entropy(out.logits, out.labels), correct, scored.sum()

        loss, correct, masked = call(model, forward)
        masked, total = int(masked), sum(x.answer_len for x in layouts)
        return loss, {"weight": float(masked), "accuracy": float(correct) / max(masked, 1),
                      "masked_share": masked / total}

    def decode_meta(self, meta: DecodeMeta) -> DecodeMeta:
        """Block diffusion, in place, decodable with any B <= this phase's; the prompt as trained."""
        return dataclasses.replace(meta, prediction=IN_PLACE, trained_block_size=self.block_size,
                                   prompt_attention=self.prompt_attention)


def from_config(config, bundle: ModelBundle) -> AdaptStage:
    """The engine's factory: ``config.adapt`` (an ``AdaptSection``) + the model's [MASK] / EOS ids."""
    section: AdaptSection = config.adapt
    return AdaptStage(section.block_size, bundle.mask_token_id, bundle.eos_token_id,
                      NoiseConfig(section.t_min, section.t_max), section.prompt_attention, section.pad_answers)


# -- the curriculum ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CurriculumPhase:
    index: int
    block_size: int
    steps: int
    init_from: int | None  # the phase whose final checkpoint this one starts from; None: the run's model.init (AR)

    @property
    def name(self) -> str:
        return f"b{self.block_size:02d}"


@dataclass(frozen=True, slots=True)
class Curriculum:
    """The ordered phases; the engine runs one training per phase with ``overrides(phase, ...)``."""

    phases: tuple[CurriculumPhase, ...]

    def __iter__(self) -> Iterator[CurriculumPhase]:
        return iter(self.phases)

    def __len__(self) -> int:
        return len(self.phases)

    def __getitem__(self, index: int) -> CurriculumPhase:
        return self.phases[index]

    def out_dir(self, phase: CurriculumPhase, root: str | Path) -> Path:
        return Path(root) / phase.name

    def init_for(self, phase: CurriculumPhase, root: str | Path, base_init: str) -> str:
        """The checkpoint folder phase ``phase`` starts from; resolved when called (after its predecessor ran)."""
        if phase.init_from is None:
            return base_init
        from wamdiff_training import checkpoint

        return str(checkpoint.resolve(checkpoint.LATEST, self.out_dir(self.phases[phase.init_from], root)))

    def overrides(self, phase: CurriculumPhase, root: str | Path, base_init: str) -> list[str]:
        """``--set`` assignments turning the curriculum's config into this phase's run."""
        return [f"adapt.block_size={phase.block_size}", f"train.steps={phase.steps}",
                f"model.init={self.init_for(phase, root, base_init)}", f"out.dir={self.out_dir(phase, root)}"]


def curriculum(block_sizes: Sequence[int] = PAPER_CURRICULUM, steps_per_stage: int | Sequence[int] = 1000
               ) -> Curriculum:
    """Phase i trains B = ``block_sizes[i]`` for its steps, initialised from phase i - 1 (phase 0: the AR model)."""
    sizes = list(block_sizes)
    if not sizes or sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"block sizes must be >= 1 and strictly increasing, got {sizes}")
    steps = [steps_per_stage] * len(sizes) if isinstance(steps_per_stage, int) else list(steps_per_stage)
    if len(steps) == 1:
        steps *= len(sizes)
    if len(steps) != len(sizes) or min(steps) < 1:
        raise ValueError(f"need one step count >= 1 per phase ({len(sizes)}), got {steps}")
    return Curriculum(tuple(CurriculumPhase(i, b, s, i - 1 if i else None)
                            for i, (b, s) in enumerate(zip(sizes, steps))))


# -- the label switch -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelSwitch:
    """One model on the same answer tokens under the AR shifted layout and the B = 1 in-place layout."""

    shifted_loss: float
    shifted_accuracy: float
    in_place_loss: float
    in_place_accuracy: float
    tokens: int

    @property
    def cost(self) -> float:
        """Loss added by switching the labels (positive: the in-place head has yet to be learnt)."""
        return self.in_place_loss - self.shifted_loss


@torch.no_grad()
def measure_label_switch(model: nn.Module, samples: Sequence[Sample], mask_token_id: int, pad_id: int,
                         prompt_block_size: int = 1) -> LabelSwitch:
    """The cost of the switch: a next-token model read as next-token (logit i-1 -> token i) vs the same model fed
    the B = 1 in-place layout ([MASK] at i, clean prefix visible, logit i -> token i). Causal prompt by default,
    as an AR checkpoint was trained."""
    prompts = [prompt_inputs(s) for s in samples]
    shifted = [ar_layout(p, s.answer_ids, prompt_block_size) for p, s in zip(prompts, samples)]
    in_place = [in_place_ar_layout(p, s.answer_ids, mask_token_id, prompt_block_size) for p, s in zip(prompts, samples)]
    a = call(model, lambda m: forward_layouts(m, shifted, pad_id=pad_id))
    b = call(model, lambda m: forward_layouts(m, in_place, pad_id=pad_id))
    if not torch.equal(a.labels, b.labels):  # both score every answer token; a layout change must keep that
        raise RuntimeError("the shifted and in-place layouts score different answer tokens")
    return LabelSwitch(float(masked_cross_entropy(a.logits, a.labels)), token_accuracy(a.logits, a.labels),
                       float(masked_cross_entropy(b.logits, b.labels)), token_accuracy(b.logits, b.labels),
                       int(a.labels.numel()))
