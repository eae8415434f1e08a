"""Model-vs-model metrics (anchors §1): top-K overlap ρ_k on the same noisy states (the paper's ρ5: 8B diffusion
teacher vs 2B student 58.2 %, 8B AR teacher 51.2 %), its AR-aligned form, and per-waypoint L2 (exposure bias).

[MASK] is never an answer (the decoder fills it with -inf), so it is left out of every top-K here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_training.layout import IGNORE, Layout, ar_aligned_logits, forward_layouts


@dataclass(frozen=True, slots=True)
class Overlap:
    rho: float  # mean |topK_A ∩ topK_B| / K over the positions (nan when there are none)
    positions: int
    k: int

    @staticmethod
    def combine(parts: Sequence[Overlap]) -> Overlap:
        """Position-weighted mean of several measurements with the same K."""
        total = sum(p.positions for p in parts)
        rho = sum(p.rho * p.positions for p in parts if p.positions) / total if total else float("nan")
        return Overlap(rho, total, parts[0].k if parts else 0)


def top_k_hits(a: torch.Tensor, b: torch.Tensor, k: int = 5, exclude: Sequence[int] = ()) -> torch.Tensor:
    """Per position |topK(a) ∩ topK(b)| / K for logits (..., V); vocabularies are cut to the shorter one (an
    added [MASK] row may lengthen one)."""
    vocab = min(a.shape[-1], b.shape[-1])
    if not 1 <= k <= vocab - len(exclude):
        raise ValueError(f"k {k} must be in 1..{vocab - len(exclude)}")
    tops = []
    for logits in (a, b):
        logits = logits[..., :vocab].detach().float()
        if exclude:
            logits = logits.index_fill(-1, torch.tensor(list(exclude), device=logits.device), float("-inf"))
        tops.append(logits.topk(k, dim=-1).indices)
    return (tops[0][..., :, None] == tops[1][..., None, :]).sum((-2, -1)).float() / k


def top_k_overlap(
    a: torch.Tensor, b: torch.Tensor, k: int = 5, where: torch.Tensor | None = None, exclude: Sequence[int] = ()
) -> Overlap:
    """ρ_k between two logit tensors over the same positions, averaged over ``where`` (default all)."""
    hits = top_k_hits(a, b, k, exclude)
    if where is not None:
        hits = hits[where]
    count = int(hits.numel())
    return Overlap(float(hits.mean()) if count else float("nan"), count, k)


def _exclude(layouts: Sequence[Layout]) -> tuple[int, ...]:
    return tuple({x.mask_token_id for x in layouts if x.mask_token_id is not None})


@torch.no_grad()
def model_overlap(model_a, model_b, layouts: Sequence[Layout], k: int = 5) -> Overlap:
    """ρ_k of two models of the same convention on the same layouts, at the loss positions (masked answer
    tokens of diffusion layouts, every answer token of AR layouts)."""
    a, b = forward_layouts(model_a, layouts), forward_layouts(model_b, layouts)
    return top_k_overlap(a.logits, b.logits, k, a.labels != IGNORE, _exclude(layouts))


@torch.no_grad()
def ar_aligned_overlap(
    ar_model, diffusion_model, layouts: Sequence[Layout], k: int = 5, ar_prompt_block_size: int = 1
) -> Overlap:
    """ρ_k between an AR model's logit at i-1 given the clean prefix (prompt ⊕ answer[:i]) and a diffusion model's
    in-place logit at the masked position i of each diffusion layout."""
    if any(x.mask_token_id is None for x in layouts):
        raise ValueError("ar_aligned_overlap takes diffusion layouts (with a noisy copy)")
    diffusion = forward_layouts(diffusion_model, layouts)
    shifted = ar_aligned_logits(ar_model, [(x.prompt_inputs(), x.answer) for x in layouts], ar_prompt_block_size)
    return top_k_overlap(shifted, diffusion.logits, k, diffusion.labels != IGNORE, _exclude(layouts))


@dataclass(slots=True)
class WaypointErrors:
    per_waypoint: np.ndarray  # (8,) mean L2 (m) at each waypoint index over valid predictions; nan when none
    valid: int
    invalid: int  # predictions that did not parse (or were not finite 8 x 2 arrays): left out of the means

    @property
    def mean(self) -> float:
        return float(self.per_waypoint.mean())


def as_waypoints(prediction: str | np.ndarray) -> np.ndarray | None:
    """An (8, 2) float array from answer text or an array; None when the text does not parse or the array is not
    finite (8, 2)."""
    if isinstance(prediction, str):
        parsed = fmt.parse_waypoints(prediction)
        return parsed.waypoints.astype(np.float64) if parsed.valid else None
    arr = np.asarray(prediction, dtype=np.float64)
    if arr.shape != (fmt.NUM_WAYPOINTS, 2) or not np.isfinite(arr).all():
        return None
    return arr


def waypoint_l2(predicted: Sequence[str | np.ndarray], reference: Sequence[np.ndarray]) -> WaypointErrors:
    """Per-waypoint Euclidean error between predicted (answer text or (8, 2) array) and reference waypoints, averaged
    over the valid predictions for each waypoint index: the exposure-bias curve."""
    if len(predicted) != len(reference):
        raise ValueError(f"{len(predicted)} predictions for {len(reference)} references")
    errors = []
    for prediction, truth in zip(predicted, reference):
        truth = np.asarray(truth, dtype=np.float64)
        if truth.shape != (fmt.NUM_WAYPOINTS, 2) or not np.isfinite(truth).all():
            raise ValueError(f"a reference must be a finite ({fmt.NUM_WAYPOINTS}, 2) array, got {truth.shape}")
        waypoints = as_waypoints(prediction)
        if waypoints is not None:
            errors.append(np.linalg.norm(waypoints - truth, axis=1))
    valid = len(errors)
    per = np.mean(errors, axis=0) if valid else np.full(fmt.NUM_WAYPOINTS, np.nan)
    return WaypointErrors(per, valid, len(predicted) - valid)
