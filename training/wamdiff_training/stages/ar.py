"""Phase 1: autoregressive multi-task pretraining (plan, detect, ask).

``prompt ⊕ answer`` with causal attention everywhere (the prompt included, as the decoder's AR prefill runs it);
the logit at i-1 predicts token i; the loss is the cross-entropy on the answer tokens only (EOS included), averaged
per token. Its checkpoints decode autoregressively: ``next_token``, trained block size 1, causal prompt.

With ``ar.in_place_weight`` > 0 each sample is laid out as B = 1 in place (``prompt ⊕ answer ⊕ [MASK]s``): the
clean copy attends exactly as ``prompt ⊕ answer`` does, so its shifted logits are the AR loss's, and the masked
copy adds the in-place loss (token i predicted at its own position) that Stage I's B = 1 phase trains, so the
label switch (next-token -> in place) is learnt alongside instead of after.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from wamdiff_ros.model import DecodeMeta, ModelBundle
from wamdiff_training.config import Config
from wamdiff_training.data import Sample
from wamdiff_training.layout import NEXT_TOKEN, ar_layout, forward_layouts, in_place_ar_layout
from wamdiff_training.losses import masked_cross_entropy
from wamdiff_training.stages.common import prompt_inputs


class ArStage:
    name = "ar"

    def __init__(self, config: Config, bundle: ModelBundle) -> None:
        self.pad_id, self.mask_token_id = bundle.eos_token_id, bundle.mask_token_id
        self.in_place_weight = float(config.ar.in_place_weight)  # validated by the config (>= 0)
        if config.ar.freeze_vision:
            bundle.model.model.visual.requires_grad_(False)

    def loss(self, model: nn.Module, samples: list[Sample], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        if self.in_place_weight > 0:
            return self._joint_loss(model, samples)
        layouts = [ar_layout(prompt_inputs(s), s.answer_ids, prompt_block_size=1) for s in samples]

        def forward(hf_model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            out = forward_layouts(hf_model, layouts, pad_id=self.pad_id)
            correct = (out.logits.detach().argmax(-1) == out.labels).sum()
            return masked_cross_entropy(out.logits, out.labels), correct

        loss, correct = model(forward)
        tokens = sum(layout.answer_len for layout in layouts)
        return loss, {"weight": float(tokens), "accuracy": float(correct) / tokens}

    def _joint_loss(self, model: nn.Module, samples: list[Sample]) -> tuple[torch.Tensor, dict[str, float]]:
        layouts = [in_place_ar_layout(prompt_inputs(s), s.answer_ids, self.mask_token_id, prompt_block_size=1)
                   for s in samples]

        def forward(hf_model: nn.Module) -> tuple[torch.Tensor, ...]:
            out = forward_layouts(hf_model, layouts, pad_id=self.pad_id, with_next_token=True)
            next_loss = masked_cross_entropy(out.next_token, out.labels)
            in_place_loss = masked_cross_entropy(out.logits, out.labels)
            correct = (out.next_token.detach().argmax(-1) == out.labels).sum()
            in_place_correct = (out.logits.detach().argmax(-1) == out.labels).sum()
            return (next_loss + self.in_place_weight * in_place_loss, correct, in_place_correct,
                    next_loss.detach(), in_place_loss.detach())

        loss, correct, in_place_correct, next_loss, in_place_loss = model(forward)
        tokens = sum(layout.answer_len for layout in layouts)
        return loss, {"weight": float(tokens), "accuracy": float(correct) / tokens,
                      "next_token_loss": float(next_loss), "in_place_loss": float(in_place_loss),
                      "in_place_accuracy": float(in_place_correct) / tokens}

    def decode_meta(self, meta: DecodeMeta) -> DecodeMeta:
        return dataclasses.replace(meta, prediction=NEXT_TOKEN, trained_block_size=1, prompt_attention="causal")
