"""Training losses from logits, all in fp32 (anchors §1: "loss only on masked positions"; distillation "symmetric
JSD (β=0.5) in fp32, teacher detached").

Logits are (..., V); ``labels`` use IGNORE (-100) where no loss applies; divergences take a bool ``where`` over
the same leading shape (None: every position). Every reduction is the mean over the selected positions; with none
selected the result is 0 (still attached to the graph).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from wamdiff_training.layout import IGNORE


def _mean(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return torch.where(where, values, torch.zeros_like(values)).sum() / where.sum().clamp(min=1)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """In-place cross-entropy: the logit at position i against ``labels[i]``, mean over labels != IGNORE."""
    where = labels != IGNORE
    nll = F.cross_entropy(logits.float().flatten(0, -2), labels.masked_fill(~where, 0).flatten(), reduction="none")
    return _mean(nll, where.flatten())


def shifted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over a full sequence: the logit at i-1 against ``targets[i]`` (token-aligned,
    IGNORE at the prompt), mean over the scored tokens."""
    return masked_cross_entropy(logits[..., :-1, :], targets[..., 1:])


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature {temperature} must be > 0")
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis; 0 log 0 = 0 (a vocabulary entry held at -inf)."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def _select(where: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    return torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device) if where is None else where


def forward_kl(
    student: torch.Tensor, teacher: torch.Tensor, where: torch.Tensor | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """KL(p_teacher || p_student): mass-covering; the teacher is detached. No T² factor (scale outside)."""
    log_t = _log_probs(teacher.detach(), temperature)
    return _mean(_kl(log_t, _log_probs(student, temperature)), _select(where, student))


def reverse_kl(
    student: torch.Tensor, teacher: torch.Tensor, where: torch.Tensor | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """KL(p_student || p_teacher): mode-seeking; the teacher is detached."""
    log_t = _log_probs(teacher.detach(), temperature)
    return _mean(_kl(_log_probs(student, temperature), log_t), _select(where, student))


def jsd(
    student: torch.Tensor,
    teacher: torch.Tensor,
    where: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """JSD_β = β KL(p_T || m) + (1-β) KL(p_S || m), m = β p_T + (1-β) p_S; symmetric at β = 0.5 and at most ln 2
    there. The teacher is detached."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta {beta} must be in (0, 1)")
    log_t = _log_probs(teacher.detach(), temperature)
    log_s = _log_probs(student, temperature)
    log_m = torch.logaddexp(log_t + math.log(beta), log_s + math.log1p(-beta))
    value = beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)
    return _mean(value, _select(where, student))


DIVERGENCES = {"jsd": jsd, "forward_kl": forward_kl, "reverse_kl": reverse_kl}


@torch.no_grad()
def token_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of labelled positions (labels != IGNORE) whose argmax is the label; nan when none is labelled."""
    where = labels != IGNORE
    if not bool(where.any()):
        return float("nan")
    return float((logits.argmax(-1) == labels)[where].float().mean())
