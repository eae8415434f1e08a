"""The one attention-visibility rule of block diffusion, used by the decoder's reference and by training.

Every position carries a block id that never decreases along the sequence; a query sees a key iff the key's block
id is <= the query's. Causal attention is the special case of one position per block.
"""

from __future__ import annotations

import torch


def block_ids(prompt_len: int, response_len: int, block_size: int, prompt_block_size: int = 1) -> torch.Tensor:
    """Block id per position: the prompt in ``prompt_block_size`` chunks from position 0, then response blocks of
    ``block_size`` starting at the prompt's end."""
    prompt = torch.arange(prompt_len) // max(1, prompt_block_size)
    first = int(prompt[-1]) + 1 if prompt_len else 0
    response = first + torch.arange(response_len) // block_size
    return torch.cat([prompt, response])


def visible(query_ids: torch.Tensor, key_ids: torch.Tensor) -> torch.Tensor:
    """(q, k) bool: True where the query may attend to the key."""
    return key_ids[None, :] <= query_ids[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bool visibility -> a (1, 1, q, k) additive float mask (0 visible, -inf hidden)."""
    out = torch.zeros(mask.shape, dtype=dtype)
    out.masked_fill_(~mask, torch.finfo(dtype).min)
    return out[None, None]
