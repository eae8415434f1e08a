"""Unmasking policies: which still-masked positions of a block to fix at a denoising step (the one home)."""

from __future__ import annotations

import torch

SCHEDULES = ("threshold", "static")


def unmask_confident(confidence: torch.Tensor, masked: torch.Tensor, threshold: float | torch.Tensor) -> torch.Tensor:
    """Fix every masked position with confidence >= threshold; if none passes, the most confident one.

    Vectorised as an effective threshold min(threshold, best masked confidence): no host sync, no loop. Inside a
    CUDA Graph ``threshold`` is a 0-d device tensor of the confidence's dtype (no tensor is made on the host).
    """
    conf = confidence.masked_fill(~masked, -1.0)
    if not isinstance(threshold, torch.Tensor):
        threshold = torch.tensor(threshold, dtype=conf.dtype, device=conf.device)
    return masked & (conf >= torch.minimum(conf.max(), threshold))


def tokens_per_step(block_len: int, steps: int) -> list[int]:
    """Static schedule: spread ``block_len`` tokens over ``steps`` steps, earlier steps take the remainder."""
    steps = max(1, min(steps, block_len))
    return [tokens_at_step(block_len, steps, i) for i in range(steps)]


def tokens_at_step(block_len: int, steps: int, step: int) -> int:
    """``tokens_per_step(block_len, steps)[step]`` without building the list; steps past the last take its count."""
    steps = max(1, min(steps, block_len))
    base, extra = divmod(block_len, steps)
    return base + (1 if min(step, steps - 1) < extra else 0)


def unmask_top_k(confidence: torch.Tensor, masked: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Fix the ``k`` most confident masked positions (all of them when fewer remain); ties go to the lower index.
    Vectorised as "fewer than k masked positions rank above": no host sync, the same rule inside a CUDA Graph."""
    conf = confidence.masked_fill(~masked, -1.0)
    index = torch.arange(conf.shape[0], device=conf.device)
    ahead = (conf[None, :] > conf[:, None]) | ((conf[None, :] == conf[:, None]) & (index[None, :] < index[:, None]))
    return masked & (ahead.sum(-1) < k)


def unmask_step(schedule: str, confidence: torch.Tensor, masked: torch.Tensor, threshold: float, step: int,
                steps: int) -> torch.Tensor:
    """The positions ``schedule`` fixes at denoising ``step`` of a block (``steps``: T, which sets the static
    schedule's count per step): the one dispatch the eager decoder and the training rollouts share."""
    if schedule == "threshold":
        return unmask_confident(confidence, masked, threshold)
    return unmask_top_k(confidence, masked, tokens_at_step(int(masked.shape[0]), steps, step))
