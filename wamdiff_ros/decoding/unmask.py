"""Unmasking policies: which still-masked positions of a block to fix at a denoising step (the one home)."""

from __future__ import annotations

import torch

SCHEDULES = ("threshold", "static")


def unmask_confident(confidence: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """Fix every masked position with confidence >= threshold; if none passes, the most confident one.

    Vectorised as an effective threshold min(threshold, best masked confidence): no host sync, no loop.
    """
    conf = confidence.masked_fill(~masked, -1.0)
    effective = torch.minimum(conf.max(), torch.tensor(threshold, dtype=conf.dtype, device=conf.device))
    return masked & (conf >= effective)


def tokens_per_step(block_len: int, steps: int) -> list[int]:
    """Static schedule: spread ``block_len`` tokens over ``steps`` steps, earlier steps take the remainder."""
    steps = max(1, min(steps, block_len))
    base, extra = divmod(block_len, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def unmask_top_k(confidence: torch.Tensor, masked: torch.Tensor, k: int) -> torch.Tensor:
    """Fix the ``k`` most confident masked positions (all of them when fewer remain)."""
    conf = confidence.masked_fill(~masked, -1.0)
    k = min(k, int(masked.sum()))
    chosen = torch.zeros_like(masked)
    if k > 0:
        chosen[conf.topk(k).indices] = True
    return chosen & masked
