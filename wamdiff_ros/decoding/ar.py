"""Autoregressive greedy decoding with a KV cache (next-token prediction): the baseline."""

from __future__ import annotations

import torch

from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.settings import DecodeResult


@torch.inference_mode()
def decode_ar(
    engine: DecoderEngine,
    first_logits: torch.Tensor,
    max_new_tokens: int,
    eos_id: int,
    constraint: WaypointConstraint | None = None,
    ignore_eos: bool = False,
) -> DecodeResult:
    """``first_logits``: the prefill's last-position logits, which predict the first answer token."""
    tokens: list[int] = []
    confidence: list[float] = []
    calls_before = engine.forward_calls
    state = constraint.start_state if constraint else 0
    logits = first_logits
    for i in range(max_new_tokens):
        if constraint is not None:
            p, token, _ = (x[0] for x in constraint.fresh_view(state, 1, i).decide(logits[None]))
        else:
            p, token = torch.softmax(logits.float(), dim=-1).max(-1)
        tokens.append(int(token))
        confidence.append(float(p))
        if constraint is not None:
            state = constraint.advance(state, [tokens[-1]])
        if (tokens[-1] == eos_id and not ignore_eos) or i == max_new_tokens - 1:
            break
        logits = engine.forward(token.view(1), commit=True)[0]
    return DecodeResult(tokens, confidence, engine.forward_calls - calls_before, [])
