"""References the fast decoder is checked against, and the probes that check it: for tests and benchmarks only.

- ``FullSequenceBackend``: a naive block backend that recomputes the whole sequence with the explicit block-causal
  mask at every step. No cache, the transformers forward end to end: the ground truth that the cached engine (and
  any faster backend) must reproduce. Slow by design; used by tests and for checking new backends.
- ``module_layers``: the cached engine's response-token forward through the transformers modules themselves, the
  arithmetic ``DecoderEngine._layers`` must reproduce bit for bit in fp32; ``modules_in_engine`` makes every engine
  use it for a while (the decode benchmark's contender for the layer loop); ``unstacked_engines`` keeps the lean
  loop but every projection its own matmul (the benchmark's contender for the CPU's stacked projections).
- ``step_logits``, ``ar_step_logits``: one step's logits through a ``GraphRunner`` (its graph when captured), and
  ``load_state``: one engine's committed prefix copied into another, so that a fast path and its reference run from
  the identical cache (``gpu_check.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

from wamdiff_ros.decoding import engine as engine_module
from wamdiff_ros.decoding import masks
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import PromptInputs


class FullSequenceBackend:
    def __init__(self, model, prompt: PromptInputs, block_size: int, prompt_block_size: int = 1) -> None:
        self.model = model
        self.prompt = prompt
        self.block_size = block_size
        self.prompt_block_size = prompt_block_size
        self.device = prompt.input_ids.device
        self.committed: list[int] = []
        self.forward_calls = 0
        self._vision = None
        if prompt.pixel_values is not None:
            self._vision = model.model.get_image_features(prompt.pixel_values, prompt.image_grid_thw, return_dict=True)

    @torch.inference_mode()
    def logits(self, response: torch.Tensor) -> torch.Tensor:
        """Logits (len(response), V) of ``response`` placed after the prompt, under the block-causal mask."""
        prompt = self.prompt
        device = prompt.input_ids.device
        ids = torch.cat([prompt.input_ids[0], response.to(device)])[None]
        types = torch.cat(
            [prompt.mm_token_type_ids[0], torch.zeros(len(response), dtype=torch.int32, device=device)]
        )[None]
        positions, _ = self.model.model.get_rope_index(ids, types, image_grid_thw=prompt.image_grid_thw)
        block_ids = masks.block_ids(prompt.length, len(response), self.block_size, self.prompt_block_size)
        mask = masks.additive(masks.visible(block_ids, block_ids), self.model.dtype).to(device)
        kwargs = {"image_grid_thw": prompt.image_grid_thw}
        if self._vision is not None:
            kwargs["mm_encoder_outputs"] = {"image": self._vision}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, mm_token_type_ids=types, **kwargs)
        self.forward_calls += 1
        return out.logits[0, prompt.length:]

    def step(self, block: torch.Tensor) -> torch.Tensor:
        committed = torch.tensor(self.committed, dtype=torch.long, device=block.device)
        return self.logits(torch.cat([committed, block]))[-len(block):]

    def commit_and_step(self, clean: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        self.committed += clean.tolist()
        return self.step(block)


def module_layers(engine: DecoderEngine, tokens: torch.Tensor, pos: torch.Tensor, skip: int, attention) -> torch.Tensor:
    """``DecoderEngine._layers`` through the transformers modules (norms, projections, ``apply_rotary_pos_emb``,
    the MLP): K/V written into the engine's cache the same way, logits of all but the first ``skip`` tokens."""
    n = tokens.shape[0]
    cos, sin = engine._cos.index_select(0, pos)[None], engine._sin.index_select(0, pos)[None]
    attention.begin(pos, skip)
    h = engine.embed(tokens)[None]
    for i, layer in enumerate(engine.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        shape = (1, n, -1, attn.head_dim)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        engine.keys[i, 0].index_copy_(1, pos, k[0])
        engine.values[i, 0].index_copy_(1, pos, v[0])
        o = attention.run(q, engine.keys[i], engine.values[i])
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, n, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return engine.lm_head(engine.norm(h[:, skip:]))[0]


@contextlib.contextmanager
def modules_in_engine() -> Iterator[None]:
    """While open, every ``DecoderEngine`` (eager and graph entry points) runs ``module_layers``. Not thread-safe:
    for benchmarks and tests."""
    lean = DecoderEngine._layers
    DecoderEngine._layers = module_layers
    try:
        yield
    finally:
        DecoderEngine._layers = lean


@contextlib.contextmanager
def unstacked_engines() -> Iterator[None]:
    """While open, engines built run every projection as its own matmul (``engine.fused_layers`` returns None), as
    off the CPU. Not thread-safe: for benchmarks and tests."""
    stacked = engine_module.fused_layers
    engine_module.fused_layers = lambda *args: None
    try:
        yield
    finally:
        engine_module.fused_layers = stacked


def load_state(engine: DecoderEngine, other: DecoderEngine) -> None:
    """Give ``engine`` ``other``'s committed prefix (K/V, length, RoPE offset; dtype cast as needed), so that two
    engines - say a bf16 one and an fp32 oracle - continue from the identical cache."""
    if other.capacity != engine.capacity:
        raise ValueError(f"capacity {other.capacity} differs from this engine's {engine.capacity}")
    engine.keys.copy_(other.keys)
    engine.values.copy_(other.values)
    engine.length = other.length
    engine.set_rope_delta(other.rope_delta)


@torch.inference_mode()
def step_logits(runner: GraphRunner, n: int, clean: torch.Tensor | None = None,
                schedule: str = "static") -> torch.Tensor:
    """Logits of one step on a fresh block of ``n`` masks at the engine's length, committing ``clean`` in the same
    forward when given (a block's first step); through the graph when captured, else the graph-safe attention run
    eagerly (what a graph would capture)."""
    n_clean = 0 if clean is None else clean.shape[0]
    runner.set_unmask(schedule, n, DecodeSettings().threshold)
    runner.start_block(n, clean=clean)
    runner.engine.plan(n + n_clean, n_clean)  # the graph-safe attention, also where graphs are off
    return runner.step().clone()


@torch.inference_mode()
def ar_step_logits(runner: GraphRunner, token: torch.Tensor) -> torch.Tensor:
    """Logits of one AR forward of ``token`` at the engine's length (committed); through the graph when captured."""
    runner.start_ar(token, torch.ones((), device=token.device))
    return runner.ar_step().clone()
