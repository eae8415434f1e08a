"""Task-aware vocabulary constraint: the planning answer's grammar lifted from characters to tokens.

Block diffusion fixes tokens in any order, so a left-to-right mask is not enough. For a block with some positions
fixed and the rest masked, a forward pass over the grammar's states (a masked position takes any token) and a
backward pass of the states from which the answer can still end within the token budget give, per masked
position, exactly the tokens that some completion allows. A step that fixes several tokens at once is checked
jointly and falls back to adding them one by one in confidence order when they conflict, so a plan always parses.

State sets are Python ints used as bitsets (bit = grammar state). A token's effect on a state only shifts it by a
constant that depends on the position inside a number, so one transition is a few mask-and-shift operations, and
tokens with the same effect (all single digits, say) share one signature.
"""

from __future__ import annotations

import torch

from wamdiff_ros import format as fmt

_GRAMMAR_CHARS = frozenset("0123456789.,-")
_MASKED = -1
_FORBIDDEN = -2

Groups = tuple[tuple[int, int], ...]  # (shift, source-state mask) pairs


def _image(states: int, groups: Groups) -> int:
    out = 0
    for shift, mask in groups:
        out |= (states & mask) << shift
    return out


def _preimage(states: int, groups: Groups) -> int:
    out = 0
    for shift, mask in groups:
        out |= (states >> shift) & mask
    return out


class WaypointConstraint:
    def __init__(self, tokenizer, eos_id: int, max_new_tokens: int, vocab_size: int | None = None) -> None:
        """``vocab_size``: the model's logit count (embedding rows may exceed the tokenizer's length)."""
        vocab_size = vocab_size or len(tokenizer)
        n_char = fmt.WAYPOINT_GRAMMAR_STATES
        self.end_state = n_char  # after EOS; EOS repeats to pad the budget
        signatures: dict[Groups, int] = {}
        token_sig = torch.full((vocab_size,), _FORBIDDEN, dtype=torch.long)
        for token_id in range(min(vocab_size, len(tokenizer))):
            if token_id == eos_id:
                continue
            text = tokenizer.decode([token_id])
            if not text or not set(text) <= _GRAMMAR_CHARS:
                continue
            pairs: dict[int, int] = {}
            for s in range(n_char):
                nxt = fmt.waypoint_grammar_run(s, text)
                if nxt >= 0:
                    pairs[nxt - s] = pairs.get(nxt - s, 0) | (1 << s)
            if pairs:
                token_sig[token_id] = signatures.setdefault(tuple(sorted(pairs.items())), len(signatures))
        complete = sum(1 << s for s in range(n_char) if fmt.waypoint_grammar_complete(s))
        eos_groups: Groups = ((0, 1 << self.end_state),) + tuple(
            (self.end_state - s, 1 << s) for s in range(n_char) if complete >> s & 1
        )
        token_sig[eos_id] = signatures.setdefault(eos_groups, len(signatures))
        self.signatures: list[Groups] = list(signatures)
        merged: dict[int, int] = {}
        for groups in self.signatures:
            for shift, mask in groups:
                merged[shift] = merged.get(shift, 0) | mask
        self.any_groups: Groups = tuple(sorted(merged.items()))
        self.token_sig = token_sig
        self.vocab = vocab_size
        self.max_new_tokens = max_new_tokens
        coreach = [1 << self.end_state]  # coreach[r]: states that can end within r more tokens
        for _ in range(max_new_tokens):
            coreach.append(_preimage(coreach[-1], self.any_groups) | coreach[-1])
        self.coreach = coreach
        self._rows: dict[int, torch.Tensor] = {}
        self._sig_memo: dict[tuple[int, int], int] = {}
        self._fwd_memo: tuple[tuple, list[int]] | None = None

    @property
    def start_state(self) -> int:
        """Grammar state set (bitset) before the first answer token."""
        return 1 << fmt.WAYPOINT_GRAMMAR_START

    # -- state sets --------------------------------------------------------------------------------------------
    def advance(self, states: int, tokens: list[int]) -> int:
        for sig in self.token_sig[tokens].tolist() if tokens else []:
            states = _image(states, self.signatures[sig]) if sig >= 0 else 0
        return states

    def _codes(self, block: torch.Tensor, masked: torch.Tensor) -> tuple[int, ...]:
        sig = self.token_sig[block.clamp(0, self.vocab - 1).cpu()]
        return tuple(sig.masked_fill(masked.cpu(), _MASKED).tolist())

    def _forward(self, states: int, codes: tuple[int, ...]) -> list[int]:
        key = (states, codes)
        if self._fwd_memo is not None and self._fwd_memo[0] == key:
            return self._fwd_memo[1]
        fwd = [states]
        for code in codes:
            if code == _MASKED:
                states = _image(states, self.any_groups)
            else:
                states = _image(states, self.signatures[code]) if code >= 0 else 0
            fwd.append(states)
        self._fwd_memo = (key, fwd)
        return fwd

    def _backward(self, codes: tuple[int, ...], offset: int) -> list[int]:
        states = self.coreach[self._budget(offset + len(codes))]
        bwd = [states]
        for code in reversed(codes):
            if code == _MASKED:
                states = _preimage(states, self.any_groups)
            else:
                states = _preimage(states, self.signatures[code]) if code >= 0 else 0
            bwd.append(states)
        bwd.reverse()
        return bwd

    def _budget(self, produced: int) -> int:
        return max(self.max_new_tokens - produced, 0)

    def _row(self, allowed_sigs: int) -> torch.Tensor:
        row = self._rows.get(allowed_sigs)
        if row is None:
            if allowed_sigs == 0:  # fixed position (or an already infeasible block): leave the logits alone
                row = torch.ones(self.vocab, dtype=torch.bool)
            else:
                sigs = torch.tensor([g for g in range(len(self.signatures)) if allowed_sigs >> g & 1])
                row = torch.isin(self.token_sig, sigs)
            self._rows[allowed_sigs] = row
        return row

    # -- decoder interface ---------------------------------------------------------------------------------------
    def allowed_tokens(self, states: int, block: torch.Tensor, masked: torch.Tensor, offset: int) -> torch.Tensor:
        """(n, V) bool: tokens each masked position may take given the fixed ones. ``offset``: answer tokens
        before this block; ``states``: grammar state set after them."""
        codes = self._codes(block, masked)
        fwd = self._forward(states, codes)
        bwd = self._backward(codes, offset)
        self._last_backward = (states, codes, offset, bwd)
        keys = [self._allowed_sigs(fwd[j] & bwd[j], bwd[j + 1]) if code == _MASKED else 0
                for j, code in enumerate(codes)]
        return torch.stack([self._row(k) for k in keys]).to(block.device)

    def _allowed_sigs(self, here: int, there: int) -> int:
        """Bitset of signatures leading from a state in ``here`` to one in ``there``."""
        key = (here, there)
        sigs = self._sig_memo.get(key)
        if sigs is None:
            sigs = 0
            for g, groups in enumerate(self.signatures):
                if _image(here, groups) & there:
                    sigs |= 1 << g
            if len(self._sig_memo) > 65536:
                self._sig_memo.clear()
            self._sig_memo[key] = sigs
        return sigs

    def fill(self, states: int, block: torch.Tensor, masked: torch.Tensor, offset: int, logits: torch.Tensor):
        """Fix every masked position left to right with its best allowed token (no model call); returns the
        block and each filled token's probability under the constrained distribution (0 elsewhere)."""
        codes = self._codes(block, masked)
        bwd = self._backward(codes, offset)
        block = block.clone()
        probs_out = torch.zeros(len(codes), dtype=torch.float32)
        cur = states
        for j, code in enumerate(codes):
            if code == _MASKED:
                row = self._row(self._allowed_sigs(cur & bwd[j], bwd[j + 1])).to(logits.device)
                probs = torch.softmax(logits[j].float().masked_fill(~row, float("-inf")), -1)
                best = int(probs.argmax())
                block[j] = best
                probs_out[j] = probs[best]
                code = int(self.token_sig[best])
            cur = _image(cur, self.signatures[code]) if code >= 0 else 0
        return block, probs_out.to(block.device)

    def feasible(self, states: int, block: torch.Tensor, masked: torch.Tensor, offset: int) -> bool:
        codes = self._codes(block, masked)
        return bool(self._forward(states, codes)[-1] & self.coreach[self._budget(offset + len(codes))])

    def apply(self, logits: torch.Tensor, states: int, block: torch.Tensor, masked: torch.Tensor, offset: int):
        return logits.masked_fill(~self.allowed_tokens(states, block, masked, offset), float("-inf"))

    def choose(self, states: int, block: torch.Tensor, masked: torch.Tensor, offset: int,
               select: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Shrink ``select`` (positions to fix with ``tokens``, each allowed on its own) to a jointly feasible set.

        One left-to-right pass: a candidate is kept when the grammar states so far (earlier kept candidates fixed)
        can take it and still reach the backward set computed with the later candidates masked; so the result is
        feasible, and the leftmost candidate is always kept. Call right after ``allowed_tokens`` on the same block.
        """
        codes = self._codes(block, masked)
        last = getattr(self, "_last_backward", None)
        if last is not None and last[:3] == (states, codes, offset):
            bwd = last[3]
        else:
            bwd = self._backward(codes, offset)
        chosen = select.cpu()
        picks = set(chosen.nonzero().flatten().tolist())
        new_sig = self.token_sig[tokens.clamp(0, self.vocab - 1).cpu()].tolist()
        kept = chosen.clone()
        out_codes = list(codes)
        fwd = [states]
        for j, code in enumerate(codes):
            cur = fwd[-1]
            if j in picks:
                sig = new_sig[j]
                nxt = _image(cur, self.signatures[sig]) if sig >= 0 else 0
                if nxt & bwd[j + 1]:
                    out_codes[j] = sig
                    fwd.append(nxt)
                    continue
                kept[j] = False
            if code == _MASKED:
                fwd.append(_image(cur, self.any_groups))
            else:
                fwd.append(_image(cur, self.signatures[code]) if code >= 0 else 0)
        self._fwd_memo = ((states, tuple(out_codes)), fwd)
        return kept.to(select.device)
