"""Image + user text -> the tensors a Qwen3-VL forward takes (one image, batch of one)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.model import ModelBundle


@dataclass(slots=True)
class PromptInputs:
    input_ids: torch.Tensor  # (1, L)
    mm_token_type_ids: torch.Tensor  # (1, L): 1 at image tokens
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    vision: object | None = None  # precomputed image features (the model's get_image_features output)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    def forward_kwargs(self) -> dict:
        kwargs = {"mm_token_type_ids": self.mm_token_type_ids}
        if self.vision is not None:
            kwargs.update(mm_encoder_outputs={"image": self.vision}, image_grid_thw=self.image_grid_thw)
        elif self.pixel_values is not None:
            kwargs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw)
        return kwargs


def encode_prompt(bundle: ModelBundle, user_text: str, image: np.ndarray | None) -> PromptInputs:
    device = bundle.device
    pixel_values = grid = None
    image_tokens = 0
    if image is not None:
        processed = bundle.image_processor(images=[image], return_tensors="pt")
        grid = processed["image_grid_thw"].to(device)
        merge = bundle.image_processor.merge_size
        image_tokens = int(grid.prod()) // (merge * merge)
        pixel_values = processed["pixel_values"].to(device=device, dtype=bundle.model.dtype)
    text = fmt.chat(user_text, image_tokens)
    ids = bundle.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
    image_id = bundle.model.config.image_token_id
    token_types = (ids == image_id).to(torch.int32)
    if int(token_types.sum()) != image_tokens:
        raise RuntimeError(f"prompt holds {int(token_types.sum())} image tokens, the image needs {image_tokens}")
    return PromptInputs(ids, token_types, pixel_values, grid)
