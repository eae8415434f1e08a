"""A static KV cache and a lean text-decoder forward over the Qwen3-VL weights (SDPA).

The prompt (image + text, deepstack) is prefilled by the transformers model itself; its K/V are copied into
preallocated buffers. Every later forward runs only response tokens, whose three M-RoPE components are equal, so
one precomputed cos/sin table indexed by position serves them. A forward writes its K/V at
``[length, length + n)`` and attends over ``[0, length + n)`` with no mask (the whole prefix is visible and the
new tokens see each other both ways); ``commit=True`` advances ``length``, otherwise the slots are scratch that
the next forward overwrites. ``commit_and_step`` fuses a block's commit with the next block's first step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

from wamdiff_ros.decoding import masks
from wamdiff_ros.inputs import PromptInputs


class DecoderEngine:
    def __init__(self, model, capacity: int) -> None:
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
        self.keys = torch.empty(shape, device=self.device, dtype=self.dtype)
        self.values = torch.empty(shape, device=self.device, dtype=self.dtype)
        self.length = 0
        self.rope_delta = 0
        self.forward_calls = 0
        self._cos = self._sin = None

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
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **prompt.forward_kwargs(),
        )
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :, :length] = layer.keys
            self.values[i, :, :, :length] = layer.values
        self.length = length
        self.rope_delta = int(delta.reshape(-1)[0])
        self._build_rope()
        return out.logits[0, -1]

    def _build_rope(self) -> None:
        rotary = self.model.model.language_model.rotary_emb
        pos = torch.arange(self.capacity, device=self.device) + self.rope_delta
        probe = torch.empty(1, device=self.device, dtype=self.dtype)
        cos, sin = rotary(probe, pos.view(1, 1, -1).expand(3, 1, -1))
        self._cos, self._sin = cos[0], sin[0]  # (capacity, head_dim), indexed by sequence index

    # -- response tokens --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, commit: bool) -> torch.Tensor:
        """Forward ``tokens`` (n,) placed at ``[length, length + n)``; returns logits (n, V)."""
        return self._forward(tokens, None, tokens.shape[0] if commit else 0, 0)

    @torch.inference_mode()
    def commit_and_step(self, clean: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """One forward that commits ``clean`` and runs the first step of the following ``block``: the clean tokens
        see the prefix and each other (not the block), the block sees everything, exactly as a commit forward
        followed by a step would. Returns the block's logits."""
        c = clean.shape[0]
        n = c + block.shape[0]
        visible = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device)
        visible[:c, self.length + c:] = False
        return self._forward(torch.cat([clean, block]), visible[None, None], c, c)

    def _forward(self, tokens: torch.Tensor, mask: torch.Tensor | None, advance: int, skip: int) -> torch.Tensor:
        """Write K/V of ``tokens`` at ``[length, length + n)``, advance ``length`` by ``advance`` and return the
        logits of all but the first ``skip`` tokens."""
        n = tokens.shape[0]
        start, end = self.length, self.length + n
        if end > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded ({end})")
        cos, sin = self._cos[start:end][None], self._sin[start:end][None]
        h = self.embed(tokens)[None]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            shape = (1, n, -1, attn.head_dim)
            q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.keys[i, :, :, start:end] = k
            self.values[i, :, :, start:end] = v
            o = F.scaled_dot_product_attention(
                q, self.keys[i, :, :, :end], self.values[i, :, :, :end], attn_mask=mask, scale=attn.scaling,
                enable_gqa=True,
            )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(1, n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.length += advance
        self.forward_calls += 1
        return self.lm_head(self.norm(h[:, skip:]))[0]
