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

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from wamdiff_ros.decoding.constraint import _MASKED, BlockView, WaypointConstraint
from wamdiff_ros.decoding.reflect import Draft, PlanCheck, reflect
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
    check: PlanCheck | None = None,
    rounds: int = 0,
    candidates: int = 10,
) -> DecodeResult:
    """``check`` and ``rounds`` (a ``CachedBackend`` only): reflection (``reflect.py``) on the host loop, the
    free-width format's path; each step then keeps the top ``candidates`` of the positions it fixes."""
    keep = candidates if check is not None and rounds > 0 else 0
    if keep and not isinstance(backend, CachedBackend):
        raise ValueError("reflection on the host loop needs the engine's cache (CachedBackend)")
    tokens: list[int] = []
    confidence: list[float] = []
    cand_t: list[list[int]] = []
    cand_p: list[list[float]] = []
    steps_per_block: list[int] = []
    states, sizes = [], []  # the grammar states before each block, and its size (reflection)
    calls_before = backend.forward_calls
    prefix = backend.engine.length if keep else 0
    state = constraint.start_state if constraint else 0
    pending: torch.Tensor | None = None  # the finished block, committed by the next block's first forward
    while len(tokens) < settings.max_new_tokens:
        n = min(settings.block_size, settings.max_new_tokens - len(tokens))
        states.append(state)
        sizes.append(n)
        block, conf, steps, cands = _denoise_block(
            backend, settings, n, mask_id, constraint, state, len(tokens), on_step, pending, keep=keep
        )
        steps_per_block.append(steps)
        new = block.tolist()
        if constraint:
            state = constraint.advance(state, new)
        tokens += new
        confidence += conf.tolist()
        if keep:
            cand_t += cands[0]
            cand_p += cands[1]
        if (not ignore_eos and eos_id in new) or len(tokens) >= settings.max_new_tokens:
            break
        pending = block
    reflection = None
    if keep:
        draft = Draft(tokens, confidence, cand_t, cand_p, sizes, prefix)
        denoiser = HostDenoiser(backend, settings, mask_id, constraint, states, keep)
        reflection = reflect(denoiser, draft, check, rounds, settings.steps)
        tokens, confidence = draft.tokens, draft.confidence
    if not ignore_eos and eos_id in tokens:
        cut = tokens.index(eos_id) + 1
        tokens, confidence = tokens[:cut], confidence[:cut]
    return DecodeResult(tokens, confidence, backend.forward_calls - calls_before, steps_per_block,
                        reflection=reflection)


class HostDenoiser:
    """Reflection's re-denoising on the host loop (``reflect.Denoiser``): the same ``_denoise_block`` from a block's
    tokens with its [MASK] positions to denoise, under the grammar from the state before the block."""

    def __init__(self, backend: CachedBackend, settings: DecodeSettings, mask_id: int,
                 constraint: WaypointConstraint | None, states: list[int], keep: int) -> None:
        self.backend, self.settings, self.mask_id, self.constraint = backend, settings, mask_id, constraint
        self.states, self.keep = states, keep

    @property
    def forward_calls(self) -> int:
        return self.backend.forward_calls

    def rewind(self, length: int) -> None:
        engine = self.backend.engine
        if not 0 <= length <= engine.length:
            raise ValueError(f"rewind to {length}: the cache holds {engine.length} tokens")
        engine.length = length

    def block(self, j, n, offset, pending, start, steps, deadline):
        settings = dataclasses.replace(self.settings, steps=steps)
        init = torch.tensor(start, dtype=torch.long, device=self.backend.device)
        block, conf, _, cands = _denoise_block(self.backend, settings, n, self.mask_id, self.constraint,
                                               self.states[j], offset, None,
                                               None if pending is None else pending.to(self.backend.device),
                                               init=init, keep=self.keep, deadline=deadline)
        if block is None:
            return None
        return block.tolist(), conf.tolist(), cands[0], cands[1]


def _top(probs: np.ndarray, ids: np.ndarray, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per row of ``probs`` (n, K) over the tokens ``ids`` (K,): the k most probable, first the most."""
    k = min(k, probs.shape[1])
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return ids[order].tolist(), np.take_along_axis(probs, order, axis=1).tolist()


def _denoise_block(backend, settings, n, mask_id, constraint, state, offset, on_step, pending, init=None, keep=0,
                   deadline=None):
    """One block; ``init``: its start instead of n masks (the fixed positions anchors); ``keep``: also the top-``keep``
    candidates of the step that fixed each position; ``deadline``: no step starts past it (returns None, the block
    unfinished). Returns the block, its confidences, the steps run and the candidates ((n, keep) tokens and probs)."""
    block = torch.full((n,), mask_id, dtype=torch.long, device=backend.device) if init is None else init.clone()
    masked = block == mask_id
    conf = torch.zeros(n, dtype=torch.float32, device=block.device)
    no_mask = torch.tensor([mask_id], device=block.device)
    cand_t = [[int(t)] for t in block.tolist()]
    cand_p = [[1.0] for _ in range(n)]
    step = 0
    prediction = block
    view = after = None  # grammar views before / after this step's fixes
    if constraint is not None and init is not None:
        codes = [_MASKED if m else int(constraint.token_sig[t]) for m, t in zip(masked.tolist(), block.tolist())]
        after = BlockView(constraint, state, codes, offset)
    while step < settings.steps:
        if step and deadline is not None and time.perf_counter() >= deadline:
            return None, None, step, None
        logits = backend.step(block) if pending is None or step else backend.commit_and_step(pending, block)
        raw = logits
        if constraint is not None:  # the grammar never allows [MASK]
            view = constraint.fresh_view(state, n, offset) if after is None else after
            p, prediction, grammar_logits = view.decide(logits)
        else:
            logits = logits.index_fill(-1, no_mask, float("-inf"))  # [MASK] is never an answer
            probs = torch.softmax(logits.float(), dim=-1)
            p, prediction = probs.max(-1)
        select = unmask_step(settings.schedule, p, masked, settings.threshold, step, settings.steps)
        if view is not None:
            select, after = view.choose(select)
        if keep and bool(select.any()):
            if constraint is not None:
                e = np.exp(grammar_logits - grammar_logits.max(1, keepdims=True))
                top = _top(e / e.sum(1, keepdims=True), constraint.grammar_ids, keep)
            else:
                values, ids = torch.topk(probs, min(keep, probs.shape[-1]), -1)
                top = ids.tolist(), values.tolist()
            for i in np.flatnonzero(select.cpu().numpy()).tolist():
                cand_t[i], cand_p[i] = top[0][i], top[1][i]
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
    return block, conf, step, (cand_t, cand_p)
