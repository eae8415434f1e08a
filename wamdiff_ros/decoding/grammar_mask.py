"""The plan grammar as a per-position allowed-token mask, for the decode step on the device (inside a CUDA Graph).

In the fixed-width format (version 3) every answer position has one role ("tenths of x4", "the bin letter of y2"),
and with a tokenizer that writes the answer one character per token each position's allowed set does not depend on
the other positions: the grammar is a product of per-position sets. The host constraint (``constraint.py``) then
allows, at every position, exactly the row of this mask, whatever is fixed elsewhere (``test_grammar_mask`` checks
it position by position, token by token), so the step can apply the mask to the logits with no host work.
WAM-Diff2's free width (version 1) or multi-character number tokens make the length and the roles depend on what is
written: those keep the host constraint.
"""

from __future__ import annotations

import numpy as np
import torch

from wamdiff_ros.decoding.constraint import _MASKED, BlockView, WaypointConstraint


def separable(constraint: WaypointConstraint, tokenizer, eos_id: int) -> bool:
    """Whether the grammar is a product of per-position sets with this tokenizer: the fixed-width format, and every
    grammar token but EOS one character."""
    if constraint.format_version != 3:
        return False
    return all(len(tokenizer.decode([int(t)])) == 1 for t in constraint.grammar_ids if int(t) != eos_id)


def allowed_sets(constraint: WaypointConstraint, length: int, fixed: dict[int, int] | None = None) -> list[set[int]]:
    """The host constraint's allowed token ids at each of the first ``length`` answer positions, with ``fixed``
    (position -> token id) fixed and every other position masked."""
    codes = [_MASKED] * length
    for position, token in (fixed or {}).items():
        codes[position] = int(constraint.token_sig[token])
    view = BlockView(constraint, constraint.start_state, codes, 0)
    out = []
    for j in range(length):
        if codes[j] != _MASKED:  # a fixed position: the tokens of its signature
            out.append(set(constraint.grammar_ids[constraint._grammar_sig == codes[j]].tolist()))
            continue
        index = constraint.allowed_row(view.fwd[j] & view.bwd[j], view.bwd[j + 1])  # may grow the rows: index first
        row = constraint._rows[index]
        out.append({int(t) for t in constraint.grammar_ids[np.isfinite(row)]})
    return out


def grammar_mask(constraint: WaypointConstraint, tokenizer, eos_id: int, vocab_size: int,
                 device: torch.device | str = "cpu") -> torch.Tensor | None:
    """(max_new_tokens, vocab_size) bool, True where the grammar allows the token at that answer position; None
    when the grammar is not separable with this tokenizer (``separable``)."""
    if not separable(constraint, tokenizer, eos_id):
        return None
    length = constraint.max_new_tokens
    mask = torch.zeros(length, vocab_size, dtype=torch.bool)
    for j, allowed in enumerate(allowed_sets(constraint, length)):
        mask[j, sorted(allowed)] = True
    return mask.to(device)
