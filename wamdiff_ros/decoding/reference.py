"""A naive block backend that recomputes the whole sequence with the explicit block-causal mask at every step.

No cache, the transformers forward end to end: the ground truth that the cached engine (and any faster backend)
must reproduce. Slow by design; used by tests and for checking new backends.
"""

from __future__ import annotations

import torch

from wamdiff_ros.decoding import masks
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
