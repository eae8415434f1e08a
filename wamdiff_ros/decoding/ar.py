"""Autoregressive greedy decoding with a KV cache (next-token prediction): the baseline. ``decode_ar`` runs on a
``GraphRunner``'s AR graph (unconstrained); ``decode_ar_host`` is the engine's eager loop, the one that takes the
host constraint."""

from __future__ import annotations

import torch

from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.settings import DecodeResult


@torch.inference_mode()
def decode_ar(runner: GraphRunner, first_logits: torch.Tensor, max_new_tokens: int, eos_id: int,
              ignore_eos: bool = False) -> DecodeResult:
    """``decode_ar_host`` (unconstrained) on the runner's AR graph; EOS is looked for every ``check_every`` tokens,
    so up to ``check_every - 1`` forwards may run past it (counted; their tokens are dropped)."""
    if not runner.ar_supported:
        raise ValueError(f"the AR graph needs the sdpa backend, not {runner.engine.graph_attention.name}")
    engine = runner.engine
    if max_new_tokens > engine.capacity - engine.length:
        raise ValueError(f"{max_new_tokens} new tokens do not fit the cache after a {engine.length}-token prompt")
    p, token = torch.softmax(first_logits.float(), dim=-1).max(-1)
    runner.start_ar(token, p)
    forwards = 0
    for i in range(1, max_new_tokens):
        if not ignore_eos and i % runner.check_every == 0 and bool((runner.ar_answer(i)[0] == eos_id).any()):
            break
        runner.ar_step()
        forwards += 1
    tokens, confidence = (x.tolist() for x in runner.ar_answer(forwards + 1))
    if not ignore_eos and eos_id in tokens:
        cut = tokens.index(eos_id) + 1
        tokens, confidence = tokens[:cut], confidence[:cut]
    return DecodeResult(tokens, confidence, forwards, [])


@torch.inference_mode()
def decode_ar_host(
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
