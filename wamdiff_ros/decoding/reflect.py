"""Reflection: block decoding repairs a drafted plan in place, with the same model (gradient-free self-correction).

Masked diffusion predicts every position in place, so a wrong token can be chosen again among the model's own
candidates, and the tokens that depend on it denoised again with the rest of the answer fixed as anchors
(ReflectDrive, ICLR 2026: a local search finds safe anchor tokens, then inpainting regenerates the rest).

After the draft, when the plan checker (``PlanCheck``: the planner's side, ``wamdiff_ros.plan_check``) names failing
waypoints, each round
1. **searches**, earliest failing waypoint first, its tokens' candidates, the per-position top-k of the step that fixed
   each token (``GraphRunner(candidates=k)``): assignments in order of joint probability (ties: the more significant
   character changed first); the first that passes given the waypoints before it is fixed as an anchor (no forward),
   and the next waypoint that still fails is searched, until one has no passing candidate. When none passes, the
   waypoint before it is searched instead, for a candidate with which both pass (a wrong digit there shows only at
   the next waypoint: x = 5.27 at 1 m/s, then 0.00);
2. **re-denoises** that waypoint's tokens and those of the later waypoints that still fail: they become [MASK] again,
   the cache is rewound to the first block holding one, and those blocks run the runner's denoising step again (same
   KV cache, the grammar mask on), every other token fixed; their new candidates serve the next round's search.
At most ``rounds`` rounds; none starts, and no re-denoising step starts, past the deadline (a round cut there keeps
its anchor and drops its re-denoising). A plan that passes is never touched: same tokens, no forward.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from wamdiff_ros.decoding.graphs import GraphRunner

MIN_CANDIDATE_PROB = 1e-6  # candidates less likely than this are not tried
MAX_TRIALS = 128  # assignments checked per searched waypoint at most (~50 µs each)


class PlanCheck(Protocol):
    """The planner's view of an answer's tokens (the full blocks; what follows EOS is ignored)."""

    num_waypoints: int

    def failing(self, tokens: Sequence[int]) -> list[int]: ...  # failing waypoints, earliest first

    def passes(self, tokens: Sequence[int], waypoint: int) -> bool: ...  # given the waypoints before it

    def span(self, tokens: Sequence[int], waypoint: int) -> list[int]: ...  # its numbers' token positions, in order

    def ranks(self, tokens: Sequence[int], waypoint: int) -> list[int]: ...  # ``span``'s significance, 0 = first


@dataclass(slots=True)
class ReflectStats:
    rounds: int = 0
    extra_forwards: int = 0
    searched: int = 0  # waypoints whose anchor the search found
    remasked: int = 0  # tokens denoised again
    edited: list[int] = field(default_factory=list)  # waypoints whose tokens changed (0-based)
    cut: bool = False  # a round was cut by the deadline
    draft: list[int] = field(default_factory=list)  # the tokens before reflection (past EOS too)



@dataclass(slots=True)
class Draft:
    """The answer as the block loop left it: every block's tokens (past EOS too), their confidences and candidates."""

    tokens: list[int]
    confidence: list[float]
    cand_tokens: list[list[int]]  # per position, the top-k of the step that fixed it
    cand_probs: list[list[float]]
    block_sizes: list[int]
    prefix: int  # the engine's length before the answer
    committed: int = -1  # blocks whose K/V the cache holds as they stand (the draft: all but the last)

    def __post_init__(self) -> None:
        if self.committed < 0:
            self.committed = len(self.block_sizes) - 1


def search(tokens: list[int], positions: Sequence[int], cand_tokens: list[list[int]], cand_probs: list[list[float]],
           ok: Callable[[list[int]], bool], ranks: Sequence[int] | None = None,
           max_trials: int = MAX_TRIALS) -> list[int] | None:
    """The most probable assignment of ``positions`` (each one of its candidates; the others as in ``tokens``) that
    ``ok`` accepts, other than the current one, most significant character first; None when none of the trials does.

    ``ranks``: each position's significance (0: the first character of its number; default: all 0). Stage r lets the
    positions of rank <= r change, so a wrong tens digit is found before the many near-even combinations of the
    decimals are tried; within a stage, best-first over the product of the candidate lists (each by probability):
    a heap of index vectors scored by joint log-probability, ties towards changing earlier positions. ``max_trials``
    is shared by the stages."""
    ranks = [0] * len(positions) if ranks is None else list(ranks)
    options = []  # per position: (token, probability) pairs, the current token first, then by probability
    for p in positions:
        pairs = list(zip(cand_tokens[p], cand_probs[p]))
        current = [tq for tq in pairs if tq[0] == tokens[p]][:1] or [(tokens[p], 1.0)]
        options.append(current + sorted([tq for tq in pairs if tq[0] != tokens[p] and tq[1] >= MIN_CANDIDATE_PROB],
                                        key=lambda tq: -tq[1]))
    logp = [[math.log(max(q, 1e-30)) for _, q in opt] for opt in options]
    stages = sorted(set(ranks))
    budget = max_trials
    tried: set[tuple[int, ...]] = set()
    for n, stage in enumerate(stages):
        free = [j for j, r in enumerate(ranks) if r <= stage and len(options[j]) > 1]
        share = budget // (len(stages) - n)  # what the later stages leave for this one, at least
        found, used = _best_first(tokens, positions, options, logp, free, ok, tried, share)
        budget -= used
        if found is not None:
            return found
    return None


def _best_first(tokens, positions, options, logp, free, ok, tried, max_trials):
    """One stage of ``search``: the assignments changing only the ``free`` positions, most probable first; returns
    (the first that passes or None, trials used). ``tried`` carries the vectors earlier stages checked."""
    start = (0,) * len(options)

    def score(index: tuple[int, ...]) -> float:
        return sum(lp[i] for lp, i in zip(logp, index))

    def order(index: tuple[int, ...]) -> tuple:  # most probable first; ties: the earlier position changed
        return -score(index), tuple(-i for i in index)

    heap = [(order(start), start)]
    seen = {start}
    trials = 0
    while heap and trials < max_trials:
        _, index = heapq.heappop(heap)
        if index != start and index not in tried:
            trials += 1
            tried.add(index)
            trial = list(tokens)
            for p, opt, i in zip(positions, options, index):
                trial[p] = opt[i][0]
            if ok(trial):
                return trial, trials
        for j in free:
            if index[j] + 1 < len(options[j]):
                nxt = index[:j] + (index[j] + 1,) + index[j + 1:]
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (order(nxt), nxt))
    return None, trials


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


class Denoiser(Protocol):
    """What re-denoising needs from a decode loop: the runner's (``RunnerDenoiser``) or the host loop's
    (``host.HostDenoiser``)."""

    mask_id: int

    @property
    def forward_calls(self) -> int: ...

    def rewind(self, length: int) -> None: ...  # forget the cache from ``length`` on

    def block(self, j: int, n: int, offset: int, pending: torch.Tensor | None, start: list[int], steps: int,
              deadline: float | None) -> tuple[list[int], list[float], list[list[int]], list[list[float]]] | None:
        ...  # block ``j`` from ``start`` ([MASK] = to denoise), committing ``pending``; None when cut by the deadline


class RunnerDenoiser:
    """Re-denoising on a ``GraphRunner``: its step, replayed where captured."""

    def __init__(self, runner: GraphRunner) -> None:
        self.runner, self.mask_id = runner, runner.mask_id

    @property
    def forward_calls(self) -> int:
        return self.runner.engine.forward_calls

    def rewind(self, length: int) -> None:
        self.runner.rewind(length)

    def block(self, j, n, offset, pending, start, steps, deadline):
        runner = self.runner
        runner.start_block(n, offset, pending, tokens=torch.tensor(start, dtype=torch.long, device=runner.engine.device))
        runner.step()
        done = 1
        while done < steps and runner.masks_left():
            if _past(deadline):
                return None
            runner.step()
            done += 1
        block, conf = runner.finish_block()
        cand_t, cand_p = runner.block_candidates()
        return block.tolist(), conf.tolist(), cand_t.tolist(), cand_p.tolist()


@torch.inference_mode()
def redenoise(denoiser: Denoiser, draft: Draft, remask: set[int], steps: int, deadline: float | None) -> bool:
    """Denoise the ``remask`` positions of ``draft`` again in place (the draft is updated): rewind the cache to the
    first block holding one (or to the last block it holds as it stands, if that is earlier), run each block up to the
    last such block with its other tokens fixed (a block with none only commits the one before). False, with the
    draft unchanged, when the deadline cut it."""
    offsets = [sum(draft.block_sizes[:j]) for j in range(len(draft.block_sizes))]
    block_of = [j for j, n in enumerate(draft.block_sizes) for _ in range(n)]
    first, last = min(block_of[min(remask)], draft.committed), block_of[max(remask)]
    tokens = list(draft.tokens)
    updates: dict[int, tuple[int, float, list[int], list[float]]] = {}
    denoiser.rewind(draft.prefix + offsets[first])
    pending = None
    for j in range(first, last + 1):
        n, off = draft.block_sizes[j], offsets[j]
        start = [denoiser.mask_id if off + i in remask else tokens[off + i] for i in range(n)]
        done = None if _past(deadline) else denoiser.block(j, n, off, pending, start, steps, deadline)
        if done is None:
            draft.committed = min(draft.committed, j)
            return False
        block_l, conf_l, cand_tl, cand_pl = done
        for i in range(n):
            if off + i in remask:
                updates[off + i] = (block_l[i], conf_l[i], cand_tl[i], cand_pl[i])
                tokens[off + i] = block_l[i]
        pending = torch.tensor(block_l, dtype=torch.long)
    for p, (t, c, ct, cp) in updates.items():
        draft.tokens[p], draft.confidence[p], draft.cand_tokens[p], draft.cand_probs[p] = t, c, ct, cp
    draft.committed = last  # the blocks before it are in the cache; it and the ones after are not (or stale)
    return True


def reflect(denoiser: Denoiser | GraphRunner, draft: Draft, check: PlanCheck, rounds: int, steps: int,
            deadline: float | None = None) -> ReflectStats:
    """Repair ``draft`` in place (the module's rounds) with ``denoiser`` (a runner is taken as its
    ``RunnerDenoiser``); returns what was done."""
    if isinstance(denoiser, GraphRunner):
        denoiser = RunnerDenoiser(denoiser)
    before = list(draft.tokens)
    stats = ReflectStats(draft=before)
    calls = denoiser.forward_calls
    for _ in range(rounds):
        failing = check.failing(draft.tokens)
        if not failing:
            break
        if _past(deadline):
            stats.cut = True
            break
        stats.rounds += 1
        remask: set[int] = set()
        w = -1
        while True:  # the failing waypoints in order: each searched and anchored, until one has no passing candidate
            later = [v for v in check.failing(draft.tokens) if v > w]
            if not later:
                break
            w = later[0]
            span = check.span(draft.tokens, w)
            anchor = search(draft.tokens, span, draft.cand_tokens, draft.cand_probs, lambda t: check.passes(t, w),
                            check.ranks(draft.tokens, w))
            if anchor is None and w > 0:  # the waypoint before may be the wrong one: it and w must pass together
                span = check.span(draft.tokens, w - 1)
                anchor = search(draft.tokens, span, draft.cand_tokens, draft.cand_probs,
                                lambda t: check.passes(t, w - 1) and check.passes(t, w),
                                check.ranks(draft.tokens, w - 1))
            if anchor is None:
                remask.update(check.span(draft.tokens, w))
                break
            stats.searched += 1
            for p in span:
                if anchor[p] != draft.tokens[p]:
                    draft.tokens[p] = anchor[p]
                    k = draft.cand_tokens[p].index(anchor[p])
                    draft.confidence[p] = draft.cand_probs[p][k]
        if remask:  # that waypoint and the later ones that still fail: denoised again, everything else fixed
            for v in check.failing(draft.tokens):
                if v > w:
                    remask.update(check.span(draft.tokens, v))
            if not redenoise(denoiser, draft, remask, steps, deadline):
                stats.cut = True
                break
            stats.remasked += len(remask)
    stats.extra_forwards = denoiser.forward_calls - calls
    changed = {p for p, (a, b) in enumerate(zip(before, draft.tokens)) if a != b}
    stats.edited = [w for w in range(check.num_waypoints) if changed & set(check.span(draft.tokens, w))]
    return stats
