"""Phase 1: autoregressive multi-task pretraining (plan, detect, ask).

``prompt ⊕ answer`` with causal attention everywhere (the prompt included, as the decoder's AR prefill runs it);
the logit at i-1 predicts token i; the loss is the cross-entropy on the answer tokens only (EOS included), averaged
per token. Its checkpoints decode autoregressively: ``next_token``, trained block size 1, causal prompt.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from wamdiff_ros.model import DecodeMeta, ModelBundle
from wamdiff_training.config import Config
from wamdiff_training.data import Sample
from wamdiff_training.layout import NEXT_TOKEN, ar_layout, forward_layouts
from wamdiff_training.losses import masked_cross_entropy
from wamdiff_training.stages.common import prompt_inputs


class ArStage:
    name = "ar"

    def __init__(self, config: Config, bundle: ModelBundle) -> None:
        self.pad_id = bundle.eos_token_id
        if config.ar.freeze_vision:
            bundle.model.model.visual.requires_grad_(False)

    def loss(self, model: nn.Module, samples: list[Sample], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        layouts = [ar_layout(prompt_inputs(s), s.answer_ids, prompt_block_size=1) for s in samples]

        def forward(hf_model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            out = forward_layouts(hf_model, layouts, pad_id=self.pad_id)
            correct = (out.logits.detach().argmax(-1) == out.labels).sum()
            return masked_cross_entropy(out.logits, out.labels), correct

        loss, correct = model(forward)
        tokens = sum(layout.answer_len for layout in layouts)
        return loss, {"weight": float(tokens), "accuracy": float(correct) / tokens}

    def decode_meta(self, meta: DecodeMeta) -> DecodeMeta:
        return dataclasses.replace(meta, prediction=NEXT_TOKEN, trained_block_size=1, prompt_attention="causal")
