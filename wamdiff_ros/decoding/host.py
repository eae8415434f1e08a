"""Block-diffusion decoding on the host: the fallback for step traces (``on_step``) and for a grammar that is not a
per-position mask (WAM-Diff2's free width, ``constraint.py``), and the loop a reference backend runs
(``bench/reference.py``). The product decodes on a ``GraphRunner`` (``block.py``), to the same tokens.

Per block: B [MASK] tokens; each step forwards the block against the prefix (bidirectional inside the block)
without committing it, predicts every position in place and fixes some masked positions (threshold or static
schedule: ``unmask.py``); the block is done when no mask is left or after T steps (leftovers take their
last prediction). The clean block's K/V are then committed, fused into the next block's first step (one forward,
exact: the clean tokens do not see the new block). Decoding stops after the block holding EOS; nothing is committed
after the last block, so a block costs exactly the steps it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.settings import DecodeResult, DecodeSettings
from wamdiff_ros.decoding.unmask import unmask_step


class BlockBackend(Protocol):
    forward_calls: int
    device: torch.device

    def step(self, block: torch.Tensor) -> torch.Tensor: ...  # (n,) tokens -> (n, V) logits, nothing kept

    def commit_and_step(self, clean: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        ...  # ``clean`` joins the prefix; returns ``step(block)`` against the longer prefix


@dataclass(slots=True)
class StepTrace:
    offset: int  # answer tokens before this block
    step: int
    block: torch.Tensor  # tokens fed to this step
    logits: torch.Tensor  # raw logits, before the constraint
    fixed: torch.Tensor  # positions fixed at this step


class CachedBackend:
    """The engine's static KV cache: the fast path."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.device

    @property
    def forward_calls(self) -> int:
        return self.engine.forward_calls

    def step(self, block: torch.Tensor) -> torch.Tensor:
        return self.engine.forward(block, commit=False)

    def commit_and_step(self, clean: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        return self.engine.commit_and_step(clean, block)


@torch.inference_mode()
def decode_blocks_host(
    backend: BlockBackend,
    settings: DecodeSettings,
    mask_id: int,
    eos_id: int,
    constraint: WaypointConstraint | None = None,
    ignore_eos: bool = False,
    on_step: Callable[[StepTrace], None] | None = None,
) -> DecodeResult:
    tokens: list[int] = []
    confidence: list[float] = []
    steps_per_block: list[int] = []
    calls_before = backend.forward_calls
    state = constraint.start_state if constraint else 0
    pending: torch.Tensor | None = None  # the finished block, committed by the next block's first forward
    while len(tokens) < settings.max_new_tokens:
        n = min(settings.block_size, settings.max_new_tokens - len(tokens))
        block, conf, steps = _denoise_block(
            backend, settings, n, mask_id, constraint, state, len(tokens), on_step, pending
        )
        steps_per_block.append(steps)
        new = block.tolist()
        if constraint:
            state = constraint.advance(state, new)
        done = not ignore_eos and eos_id in new
        if done:
            cut = new.index(eos_id) + 1
            new, conf = new[:cut], conf[:cut]
        tokens += new
        confidence += conf.tolist()
        if done or len(tokens) >= settings.max_new_tokens:
            break
        pending = block
    return DecodeResult(tokens, confidence, backend.forward_calls - calls_before, steps_per_block)


def _denoise_block(backend, settings, n, mask_id, constraint, state, offset, on_step, pending):
    block = torch.full((n,), mask_id, dtype=torch.long, device=backend.device)
    masked = torch.ones(n, dtype=torch.bool, device=block.device)
    conf = torch.zeros(n, dtype=torch.float32, device=block.device)
    no_mask = torch.tensor([mask_id], device=block.device)
    step = 0
    prediction = block
    view = after = None  # grammar views before / after this step's fixes
    while step < settings.steps:
        logits = backend.step(block) if pending is None or step else backend.commit_and_step(pending, block)
        raw = logits
        if constraint is not None:  # the grammar never allows [MASK]
            view = constraint.fresh_view(state, n, offset) if after is None else after
            p, prediction, grammar_logits = view.decide(logits)
        else:
            logits = logits.index_fill(-1, no_mask, float("-inf"))  # [MASK] is never an answer
            p, prediction = torch.softmax(logits.float(), dim=-1).max(-1)
        select = unmask_step(settings.schedule, p, masked, settings.threshold, step, settings.steps)
        if view is not None:
            select, after = view.choose(select)
        block = torch.where(select, prediction, block)
        conf = torch.where(select, p, conf)
        masked = masked & ~select
        if on_step is not None:
            on_step(StepTrace(offset, step, block, raw, select))
        step += 1
        if not bool(masked.any()):
            break
    if bool(masked.any()):  # out of steps: leftovers take their last prediction (in-grammar when constrained)
        if view is None:
            block, conf = torch.where(masked, prediction, block), torch.where(masked, p, conf)
        else:
            filled, filled_conf = after.fill(block, grammar_logits)
            block, conf = filled, torch.where(masked, filled_conf, conf)
    return block, conf, step

