"""A static KV cache and a lean text-decoder forward over the Qwen3-VL weights.

The prompt (image, deepstack) is prefilled by the transformers model itself; its K/V are copied into preallocated
buffers. Every later forward runs only response tokens, whose three M-RoPE components are equal, so one
precomputed cos/sin table indexed by sequence position serves them. A forward writes its K/V at
``[length, length + n)`` and attends over ``[0, length + n)`` (the whole prefix is visible and the new tokens see
each other both ways); ``commit=True`` advances ``length``, otherwise the slots are scratch that the next forward
overwrites. ``commit_and_step`` fuses a block's commit with the next block's first step.

Attention is a backend (``attention.py``). The eager entry points (``forward``, ``commit_and_step``) plan and run in
one call. The graph entry points split them: ``plan`` (host, once per block) fills the static positions buffer and
the attention metadata, ``run_planned`` (graph-safe: device buffers only) is what a CUDA Graph captures.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from wamdiff_ros.decoding import masks
from wamdiff_ros.decoding.attention import select_attention
from wamdiff_ros.inputs import PromptInputs


FUSE_MAX_BYTES = 64 << 20  # projections fused only below this: dispatch dominates small models, not big ones
LM_HEAD_COLUMNS = 8192  # on the CPU the LM head into a buffer runs this many vocabulary columns per matmul
_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layers -> (weights' identity, fused layers)


@dataclass(frozen=True, slots=True)
class FusedLayer:
    """One decoder layer's projections stacked so that one matmul replaces several (CPU, fp32, small models)."""

    qkv: torch.Tensor  # q_proj, k_proj, v_proj weights stacked by rows
    gate_up: torch.Tensor  # gate_proj, up_proj
    qk_norm: torch.Tensor  # (heads + kv_heads, head_dim): q_norm's weight for each query head, then k_norm's
    heads: int
    kv_heads: int
    eps: float


def fused_layers(layers, device: torch.device, dtype: torch.dtype) -> list[FusedLayer] | None:
    """The layers' stacked projections, or None where stacking does not pay, would change the arithmetic or could
    go stale: off the CPU, outside fp32, with projection biases, above ``FUSE_MAX_BYTES``, or with weights made under
    inference mode (they keep no version counter). Built once per model and rebuilt when a weight changes (in-place
    updates bump a tensor's version), so an engine per plan costs nothing extra."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    parts = [(layer.self_attn, layer.mlp) for layer in layers]
    projections = [p for a, m in parts for p in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj)]
    if any(p.bias is not None for p in projections):
        return None
    sources = [p.weight for p in projections]
    if any(w.is_inference() for w in sources):  # made under inference_mode: no version counter to watch
        return None
    if any(a.q_norm.variance_epsilon != a.k_norm.variance_epsilon for a, _ in parts):
        return None
    if sum(w.numel() * w.element_size() for w in sources) > FUSE_MAX_BYTES:
        return None
    key = tuple((w.data_ptr(), w._version) for w in sources)
    hit = _FUSED.get(layers)
    if hit is not None and hit[0] == key:
        return hit[1]
    fused = []
    with torch.no_grad():
        for a, m in parts:
            heads, kv_heads = a.q_proj.weight.shape[0] // a.head_dim, a.k_proj.weight.shape[0] // a.head_dim
            fused.append(FusedLayer(
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                torch.cat([a.q_norm.weight.expand(heads, -1), a.k_norm.weight.expand(kv_heads, -1)]),
                heads, kv_heads, a.q_norm.variance_epsilon,
            ))
    _FUSED[layers] = (key, fused)
    return fused


@functools.lru_cache(maxsize=8)
def _cache_kwarg(model_class: type) -> str:
    """transformers renamed past_key_values -> cache (5.2x); the GPU machine may run an older one. Read once per
    model class, not per plan."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


class DecoderEngine:
    def __init__(self, model, capacity: int, attention: str = "sdpa", strict: bool = False) -> None:
        self.model = model
        lm = model.model.language_model
        self.layers = lm.layers
        self.norm = lm.norm
        self.embed = lm.embed_tokens
        self.lm_head = model.lm_head
        cfg = model.config.text_config
        weight = model.lm_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.capacity = capacity
        shape = (len(self.layers), 1, cfg.num_key_value_heads, capacity, cfg.head_dim)
        # zeros, not empty: the graph-safe SDPA attends over the whole capacity, and a masked slot must be finite
        self.keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.values = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.length = 0
        self.rope_delta = 0
        self.forward_calls = 0
        # static buffers (graph replays read them at fixed addresses): cos/sin per sequence index, query positions
        self._cos = torch.zeros(capacity, cfg.head_dim, device=self.device, dtype=self.dtype)
        self._sin = torch.zeros_like(self._cos)
        self._arange = torch.arange(capacity, device=self.device)
        self.positions = torch.zeros(capacity, dtype=torch.long, device=self.device)
        self.attention, self.graph_attention, self.attention_reason = select_attention(
            attention, scale=self.layers[0].self_attn.scaling, capacity=capacity, heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, dtype=self.dtype, device=self.device,
            strict=strict,
        )
        self._planned = self.graph_attention  # the backend the last ``plan`` prepared
        self._cache_kwarg = _cache_kwarg(type(model))
        self._fused = fused_layers(self.layers, self.device, self.dtype)

    # -- prompt ---------------------------------------------------------------------------------------------------
    def prefill(self, prompt: PromptInputs, prompt_block_size: int = 1) -> torch.Tensor:
        """Run the prompt through the full model, keep its K/V; returns the last position's logits (V,)."""
        model = self.model
        length = prompt.length
        if length >= self.capacity:
            raise ValueError(f"prompt of {length} tokens does not fit the cache of {self.capacity}")
        positions, delta = model.model.get_rope_index(
            prompt.input_ids, prompt.mm_token_type_ids, image_grid_thw=prompt.image_grid_thw
        )
        mask = None
        if prompt_block_size > 1:
            ids = masks.block_ids(length, 0, 1, prompt_block_size)
            mask = masks.additive(masks.visible(ids, ids), self.dtype).to(self.device)
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids=prompt.input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
            **prompt.forward_kwargs(),
        )
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :, :length] = layer.keys
            self.values[i, :, :, :length] = layer.values
        self.length = length
        self.set_rope_delta(int(delta.reshape(-1)[0]))
        return out.logits[0, -1]

    def set_rope_delta(self, delta: int) -> None:
        """The response positions' RoPE offset (the prompt's M-RoPE delta) and the cos/sin tables it gives."""
        self.rope_delta = delta
        rotary = self.model.model.language_model.rotary_emb
        pos = torch.arange(self.capacity, device=self.device) + self.rope_delta
        probe = torch.empty(1, device=self.device, dtype=self.dtype)
        cos, sin = rotary(probe, pos.view(1, 1, -1).expand(3, 1, -1))
        self._cos.copy_(cos[0])  # (capacity, head_dim), indexed by sequence index; in place for graph replays
        self._sin.copy_(sin[0])

    # -- response tokens, eager -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, commit: bool) -> torch.Tensor:
        """Forward ``tokens`` (n,) placed at ``[length, length + n)``; returns logits (n, V)."""
        return self._forward(tokens, 0, tokens.shape[0] if commit else 0)

    @torch.inference_mode()
    def commit_and_step(self, clean: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """One forward that commits ``clean`` and runs the first step of the following ``block``: the clean tokens
        see the prefix and each other (not the block), the block sees everything, exactly as a commit forward
        followed by a step would. Returns the block's logits."""
        c = clean.shape[0]
        return self._forward(torch.cat([clean, block]), c, c)

    def _forward(self, tokens: torch.Tensor, n_clean: int, advance: int) -> torch.Tensor:
        """Write K/V of ``tokens`` at ``[length, length + n)``, advance ``length`` by ``advance`` and return the
        logits of all but the first ``n_clean`` tokens."""
        n = tokens.shape[0]
        self._check_fits(n)
        self.attention.plan(self.length, n, n_clean)
        logits = self._layers(tokens, self._arange[:n] + self.length, n_clean, self.attention)
        self.length += advance
        self.forward_calls += 1
        return logits

    # -- response tokens, graph-safe --------------------------------------------------------------------------------
    def plan(self, n_query: int, n_clean: int = 0, eager: bool = False) -> None:
        """Host side, once per block: queries at ``[length, length + n_query)`` (positions buffer on the device)
        and the graph-safe attention's metadata. ``run_planned`` may then be replayed any number of times.
        ``eager``: plan the eager backend instead (no graph is captured: the CPU), so the planned forward computes
        exactly what ``forward`` does."""
        self._check_fits(n_query)
        self.positions[:n_query].copy_(self._arange[:n_query] + self.length)
        self._planned = self.attention if eager else self.graph_attention
        self._planned.plan(self.length, n_query, n_clean)

    def run_planned(self, tokens: torch.Tensor, n_clean: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
        """The planned forward (graph-safe unless planned ``eager``: fixed shapes, device buffers only); logits of all
        but the first ``n_clean`` tokens, written into ``out`` ((n - n_clean, V), the model's dtype) when given: a
        caller's static buffer, so the step allocates no (n, V) tensor (``GraphRunner``). Does not touch ``length``
        or ``forward_calls``: the caller accounts for them."""
        return self._layers(tokens, self.positions[: tokens.shape[0]], n_clean, self._planned, out)

    def _check_fits(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded ({self.length + n})")

    def _layers(self, tokens: torch.Tensor, pos: torch.Tensor, skip: int, attention,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """The text decoder on response tokens: the transformers layers' arithmetic op for op, with fewer ops where
        that is exact (one fused RMSNorm in fp32, the rotary embedding applied to the queries and keys at once, the
        projections called without their module wrappers; on a CPU the q/k/v and gate/up projections as one matmul
        each and the q/k norms as one, ``fused_layers``). A tiny model on a CPU spends its decode time dispatching
        ops, so this decodes about 1.2x faster there (``wamdiff-bench decode``, its "engine layer loop" line);
        ``test_decoding.py`` checks the logits equal ``bench.reference.module_layers``' bit for bit. The LM head runs
        on the last ``n - skip`` positions only (a fused commit's clean tokens need no logits), into ``out`` when
        given (the same matmul, so the same bits)."""
        n = tokens.shape[0]
        cos, sin = self._cos.index_select(0, pos)[None, None], self._sin.index_select(0, pos)[None, None]
        attention.begin(pos, skip)
        h = self.embed(tokens)[None]
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            f = self._fused[i] if self._fused is not None else None
            x = _rms_norm(h, layer.input_layernorm)
            if f is None:
                shape = (1, n, -1, attn.head_dim)
                q = _rms_norm(_linear(x, attn.q_proj).view(shape), attn.q_norm).transpose(1, 2)
                k = _rms_norm(_linear(x, attn.k_proj).view(shape), attn.k_norm).transpose(1, 2)
                v = _linear(x, attn.v_proj).view(shape).transpose(1, 2)
                heads = q.shape[1]
                qk = _rotate(torch.cat((q, k), 1), cos, sin)
            else:
                heads, qk_heads = f.heads, f.heads + f.kv_heads
                y = F.linear(x, f.qkv).view(1, n, -1, attn.head_dim)
                qk = F.rms_norm(y[:, :, :qk_heads], (attn.head_dim,), None, f.eps) * f.qk_norm
                qk, v = _rotate(qk.transpose(1, 2), cos, sin), y[:, :, qk_heads:].transpose(1, 2)
            q, k = qk[:, :heads], qk[:, heads:]
            self.keys[i, 0].index_copy_(1, pos, k[0])
            self.values[i, 0].index_copy_(1, pos, v[0])
            o = attention.run(q, self.keys[i], self.values[i])
            h = h + _linear(o.transpose(1, 2).reshape(1, n, -1), attn.o_proj)
            x = _rms_norm(h, layer.post_attention_layernorm)
            if f is None:
                gate, up = _linear(x, mlp.gate_proj), _linear(x, mlp.up_proj)
            else:
                gate, up = F.linear(x, f.gate_up).chunk(2, -1)
            h = h + _linear(mlp.act_fn(gate) * up, mlp.down_proj)
        h = _rms_norm(h[:, skip:], self.norm)[0]
        if out is None:
            return _linear(h, self.lm_head)
        return _linear_into(out, h, self.lm_head)


def _linear(x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def _linear_into(out: torch.Tensor, x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
    """``F.linear(x, module.weight, module.bias)`` for a 2-D ``x``, written into ``out``: the matmul ``F.linear``
    itself calls (mm, or addmm with a bias), and nothing allocated. On the CPU a vocabulary wider than
    ``LM_HEAD_COLUMNS`` goes ``LM_HEAD_COLUMNS`` columns per call, each into its columns of ``out`` (rows a
    vocabulary apart: BLAS writes them in place): the output block stays in cache while it is written, about 10 %
    faster at 151,936 columns, and every logit is still one dot product over the same K, so the same bits
    (``test_step_buffers.py`` compares with ``F.linear``)."""
    weight, bias = module.weight, module.bias
    columns = weight.shape[0]
    if out.device.type != "cpu" or columns <= 2 * LM_HEAD_COLUMNS:
        return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)
    step = LM_HEAD_COLUMNS
    for a in range(0, columns, step):
        b = min(a + step, columns)
        if bias is None:
            torch.mm(x, weight[a:b].t(), out=out[:, a:b])
        else:
            torch.addmm(bias[a:b], x, weight[a:b].t(), out=out[:, a:b])
    return out


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """The transformers RMSNorm (statistics in fp32, the weight applied in the input dtype): in fp32 one fused op,
    which gives the same bits; in other dtypes the module itself (the fused op would round once, not twice)."""
    if x.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of transformers' ``apply_rotary_pos_emb`` (rotate_half), on (1, heads, n, head_dim)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
