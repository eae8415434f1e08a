"""What the diffusion stages share (anchors §1): samples -> prompts and answers, noisy answer states (random
masking, or the student's own partial block decoding), their layouts, and calling a model through the engine.

A noisy state is the decoder's view of an answer while block b is being denoised: every block before b committed
(here: the clean ground truth, teacher forcing), block b holding [MASK] where still masked and a token elsewhere.
All blocks of an answer are independent given the clean prefix, so one BD3 layout carries one state per block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from wamdiff_ros.decoding.unmask import SCHEDULES, unmask_step
from wamdiff_ros.inputs import PromptInputs
from wamdiff_training.data import Sample
from wamdiff_training.layout import Layout, NoiseConfig, diffusion_layout, forward_layouts, pad_to_blocks
from wamdiff_training.layout import sample_mask_rates, sample_masked

T = TypeVar("T")
PROMPT_ATTENTION = ("block_causal", "causal")  # DecodeMeta.prompt_attention's names


def prompt_inputs(sample: Sample) -> PromptInputs:
    """The sample's prompt as the planner encodes it (batch of one, CPU)."""
    return PromptInputs(sample.prompt_ids[None], sample.mm_token_type_ids[None], sample.pixel_values,
                        sample.image_grid_thw)


def answer_tokens(sample: Sample, block_size: int, pad_id: int, pad: bool = True) -> torch.Tensor:
    """The answer (ending with EOS), EOS-padded to whole blocks when ``pad``: the decoder's last block holds B."""
    return pad_to_blocks(sample.answer_ids, block_size, pad_id) if pad else sample.answer_ids


def prompt_block_size(prompt_attention: str, block_size: int) -> int:
    """The prompt's chunk in training, as ``DecodeMeta.prompt_block_size`` derives it for the decoder's prefill."""
    if prompt_attention not in PROMPT_ATTENTION:
        raise ValueError(f"prompt_attention {prompt_attention!r} is not one of {PROMPT_ATTENTION}")
    return block_size if prompt_attention == "block_causal" else 1


def call(model: nn.Module, fn: Callable[[nn.Module], T]) -> T:
    """Run ``fn(hf_model)``: through the engine's ``Runner`` (maybe DDP/FSDP2-wrapped, so its hooks fire), or on a
    plain Qwen3-VL model (tests, teachers)."""
    return fn(model) if hasattr(model, "lm_head") else model(fn)


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@dataclass(slots=True)
class NoisyState:
    """One answer mid-denoising: ``noisy`` holds [MASK] where still masked and, elsewhere, the ground truth (random
    masking) or the student's own committed prediction (on-policy), which may differ from ``answer``."""

    prompt: PromptInputs
    answer: torch.Tensor  # (n,) clean, EOS-padded
    noisy: torch.Tensor  # (n,)
    mask_token_id: int
    steps: torch.Tensor | None = None  # on-policy: denoising steps each student block ran; None: random masking

    @property
    def masked(self) -> torch.Tensor:
        return self.noisy == self.mask_token_id

    @property
    def on_policy(self) -> bool:
        return self.steps is not None

    def layout(self, block_size: int, prompt_block_size: int = 1) -> Layout:
        """The BD3 layout of this state under blocks of ``block_size``: clean copy = the ground truth, noisy copy =
        ``noisy``; loss rows (labels) at the masked positions."""
        layout = diffusion_layout(self.prompt, self.answer, self.masked, block_size, self.mask_token_id,
                                  prompt_block_size)
        ids = layout.input_ids.clone()
        ids[layout.scored] = self.noisy.to(ids.device)
        layout.input_ids = ids
        return layout


def random_states(prompts: Sequence[PromptInputs], answers: Sequence[torch.Tensor], block_size: int,
                  mask_token_id: int, noise: NoiseConfig, generator: torch.Generator | None = None) -> list[NoisyState]:
    """Random masking: each block's rate stratified in [t_min, t_max) over the batch (>= 1 mask per block)."""
    masked = sample_masked([len(a) for a in answers], block_size, noise, generator)
    return [NoisyState(p, a, torch.where(m, torch.full_like(a, mask_token_id), a), mask_token_id)
            for p, a, m in zip(prompts, answers, masked)]


@dataclass(frozen=True, slots=True)
class Rollout:
    """How on-policy states are made: the student's own block decoding (the decoder's unmask rule and settings)
    from an all-[MASK] block, stopped at the first state whose masked share is <= a rate t drawn from the noise
    range (0.1-0.5 in distillation), after at most ``max_steps`` steps. A step that would fix the block's last masks
    is not taken (a finished block teaches nothing), so every state is one the decoder really visits."""

    threshold: float = 0.9
    schedule: str = "threshold"  # "static": tokens_per_step(B, steps) per step
    steps: int = 32  # T (sets the static schedule)
    max_steps: int = 8  # cost cap: at most this many extra no-grad forwards per training step

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if not 0.0 < self.threshold <= 1.0 or self.steps < 1 or self.max_steps < 1:
            raise ValueError(f"bad rollout settings {self}")

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int) -> torch.Tensor:
        return unmask_step(self.schedule, confidence, masked, self.threshold, step, self.steps)


@torch.no_grad()
def rollout_states(model: nn.Module, prompts: Sequence[PromptInputs], answers: Sequence[torch.Tensor],
                   block_size: int, mask_token_id: int, prompt_block_size: int, rollout: Rollout,
                   noise: NoiseConfig, pad_id: int, generator: torch.Generator | None = None) -> list[NoisyState]:
    """On-policy states: every block of every answer denoised by ``model`` in parallel (one forward per step over
    the batch's BD3 layouts, each noisy block seeing the clean prefix and itself, as a decoder step does)."""
    states = [NoisyState(p, a, torch.full_like(a, mask_token_id), mask_token_id,
                         torch.zeros(-(-len(a) // block_size), dtype=torch.long)) for p, a in zip(prompts, answers)]
    targets = sample_mask_rates(sum(len(s.steps) for s in states), noise, generator).split(
        [len(s.steps) for s in states])
    active = [torch.ones(len(s.steps), dtype=torch.bool) for s in states]
    for step in range(rollout.max_steps):
        live = [i for i, a in enumerate(active) if bool(a.any())]
        if not live:
            break
        layouts = [states[i].layout(block_size, prompt_block_size) for i in live]
        out = call(model, lambda m: forward_layouts(m, layouts, pad_id=pad_id))
        for i, logits in zip(live, out.split()):
            state = states[i]
            for b in active[i].nonzero().flatten().tolist():
                start, stop = b * block_size, min(len(state.answer), (b + 1) * block_size)
                block = state.noisy[start:stop]
                # the decoder's own step: [MASK] is never an answer; greedy prediction and its probability
                scores = logits[start:stop].float().index_fill(-1, torch.tensor([mask_token_id], device=logits.device),
                                                               float("-inf"))
                confidence, prediction = torch.softmax(scores, -1).max(-1)
                masked = block == mask_token_id
                select = rollout.select(confidence.cpu(), masked, step)
                left = masked & ~select
                if not bool(left.any()):
                    active[i][b] = False
                    continue
                state.noisy[start:stop] = torch.where(select, prediction.cpu(), block)
                state.steps[b] += 1
                if float(left.float().mean()) <= float(targets[i][b]):
                    active[i][b] = False
    return states


def make_states(model: nn.Module, samples: Sequence[Sample], block_size: int, mask_token_id: int, pad_id: int,
                prompt_block_size: int, noise: NoiseConfig, on_policy: float, rollout: Rollout,
                pad_answers: bool = True, generator: torch.Generator | None = None) -> list[NoisyState]:
    """Each sample's state is on-policy with probability ``on_policy``, else randomly masked; batch order kept."""
    prompts = [prompt_inputs(s) for s in samples]
    answers = [answer_tokens(s, block_size, pad_id, pad_answers) for s in samples]
    chosen = (torch.rand(len(samples), generator=generator) < on_policy).tolist()
    on = [i for i, c in enumerate(chosen) if c]
    off = [i for i, c in enumerate(chosen) if not c]
    states: dict[int, NoisyState] = {}
    if on:
        states.update(zip(on, rollout_states(model, [prompts[i] for i in on], [answers[i] for i in on], block_size,
                                             mask_token_id, prompt_block_size, rollout, noise, pad_id, generator)))
    if off:
        states.update(zip(off, random_states([prompts[i] for i in off], [answers[i] for i in off], block_size,
                                             mask_token_id, noise, generator)))
    return [states[i] for i in range(len(samples))]
