"""Task-aware vocabulary constraint: the planning answer's grammar lifted from characters to tokens.

Block diffusion fixes tokens in any order, so a left-to-right mask is not enough. For a block with some positions
fixed and the rest masked, a forward pass over the grammar's states (a masked position takes any token) and a
backward pass of the states from which the answer can still end within the token budget give, per masked
position, exactly the tokens that some completion allows. A step that fixes several tokens at once is checked
jointly and falls back to adding them one by one in confidence order when they conflict, so a plan always parses.

State sets are Python ints used as bitsets (bit = grammar state). A token's effect on a state only shifts it by a
constant that depends on the position inside a number, so one transition is a few mask-and-shift operations, and
tokens with the same effect (all single digits, say) share one signature.

Per denoising step the decoder holds a ``BlockView`` (the block's grammar codes and its forward / backward state
sets): it turns the step's logits into constrained predictions and vets the positions the unmask rule picked.
A constraint memoises views and rows: use one per decoding thread.
"""

from __future__ import annotations

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import DecodeSettingsError

_GRAMMAR_CHARS = frozenset("0123456789.,-" + fmt.LATERAL_BINS)
_MASKED = -1
_FORBIDDEN = -2

Groups = tuple[tuple[int, int], ...]  # (shift, source-state mask) pairs


def _compile(groups: Groups, inverse: bool = False):
    """A function applying ``groups`` (or their inverse) to a state bitset: one call, no loop, on the hot path."""
    if not groups:
        return lambda x: 0
    if inverse:
        terms = " | ".join(f"((x >> {shift}) & {mask})" for shift, mask in groups)
    else:
        terms = " | ".join(f"((x & {mask}) << {shift})" for shift, mask in groups)
    return eval(f"lambda x: {terms}")  # noqa: S307 - built from integers computed above


class WaypointConstraint:
    def __init__(self, tokenizer, eos_id: int, max_new_tokens: int, vocab_size: int | None = None,
                 format_version: int = fmt.FORMAT_VERSION) -> None:
        """``vocab_size``: the model's logit count (embedding rows may exceed the tokenizer's length);
        ``format_version``: the waypoint width the checkpoint writes (``DecodeMeta.format_version``)."""
        vocab_size = vocab_size or len(tokenizer)
        self.format_version = fmt.check_format_version(format_version)
        n_char = fmt.WAYPOINT_GRAMMAR_STATES
        self.end_state = n_char  # after EOS; EOS repeats to pad the budget
        signatures: dict[Groups, int] = {}
        token_sig = np.full(vocab_size, _FORBIDDEN, dtype=np.int64)
        for token_id in range(min(vocab_size, len(tokenizer))):
            if token_id == eos_id:
                continue
            text = tokenizer.decode([token_id])
            if not text or not set(text) <= _GRAMMAR_CHARS:
                continue
            pairs: dict[int, int] = {}
            for s in range(n_char):
                nxt = fmt.waypoint_grammar_run(s, text, format_version)
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
        # transition functions indexed by code + 2 (code: _FORBIDDEN, _MASKED, then signature ids)
        all_groups = [(), self.any_groups] + self.signatures
        self.image_fns = [_compile(g) for g in all_groups]
        self.preimage_fns = [_compile(g, inverse=True) for g in all_groups]
        any_preimage = self.preimage_fns[_MASKED + 2]
        coreach = [1 << self.end_state]  # coreach[r]: states that can end within r more tokens
        for _ in range(max_new_tokens):
            coreach.append(any_preimage(coreach[-1]) | coreach[-1])
        self.coreach = coreach
        if not coreach[max_new_tokens] & self.start_state:
            reach, shortest = coreach[-1], max_new_tokens
            while not reach & self.start_state and shortest < 10 * fmt.WAYPOINT_GRAMMAR_STATES:
                reach, shortest = any_preimage(reach) | reach, shortest + 1
            need = f" (it needs at least {shortest})" if reach & self.start_state else ""
            raise DecodeSettingsError(
                f"max_new_tokens {max_new_tokens} cannot hold a waypoint answer with this tokenizer{need}"
            )
        # Under the constraint a masked position's distribution lives on the grammar tokens only, so the decoder
        # works on their K logits instead of the vocabulary; additive rows (0 allowed, -inf not) per allowed set.
        self.grammar_ids = np.flatnonzero(token_sig >= 0)
        self._grammar_ids = torch.from_numpy(self.grammar_ids)
        self._grammar_sig = token_sig[self.grammar_ids]
        self._row_index: dict[frozenset[int], int] = {}
        self._rows = np.zeros((0, len(self.grammar_ids)), dtype=np.float32)
        self._sig_memo: dict[tuple[int, int], int] = {}
        self._fresh: dict[tuple[int, int, int], BlockView] = {}
        self._free_row = self._row_for(frozenset(range(len(self.signatures))))  # fixed positions: unused

    @property
    def start_state(self) -> int:
        """Grammar state set (bitset) before the first answer token."""
        return 1 << fmt.WAYPOINT_GRAMMAR_START

    def advance(self, states: int, tokens: list[int]) -> int:
        for sig in self.token_sig[np.asarray(tokens, dtype=np.int64)].tolist():
            states = self.step_states(states, sig)
        return states

    def step_states(self, states: int, code: int) -> int:
        return self.image_fns[code + 2](states)

    def budget(self, produced: int) -> int:
        return max(self.max_new_tokens - produced, 0)

    def allowed_row(self, here: int, there: int) -> int:
        """Index of the penalty row allowing the signatures that lead from a state in ``here`` to one in
        ``there``."""
        key = (here, there)
        row = self._sig_memo.get(key)
        if row is None:
            sigs = [g for g in range(len(self.signatures)) if self.step_states(here, g) & there]
            row = self._row_for(frozenset(sigs))
            if len(self._sig_memo) > 65536:
                self._sig_memo.clear()
            self._sig_memo[key] = row
        return row

    def _row_for(self, sigs: frozenset[int]) -> int:
        row = self._row_index.get(sigs)
        if row is None:
            penalty = np.where(np.isin(self._grammar_sig, list(sigs)), 0.0, -np.inf).astype(np.float32)
            self._rows = np.concatenate([self._rows, penalty[None]])
            row = self._row_index[sigs] = len(self._rows) - 1
        return row

    def fresh_view(self, states: int, n: int, offset: int) -> BlockView:
        """The view of a block of ``n`` masks (a block's first step); its state sets are memoised."""
        key = (states, n, self.budget(offset + n))
        view = self._fresh.get(key)
        if view is None:
            if len(self._fresh) > 4096:
                self._fresh.clear()
            view = self._fresh[key] = BlockView(self, states, [_MASKED] * n, offset)
        return view


class BlockView:
    """The grammar's view of one block at one denoising step. ``states``: grammar states after the answer so far;
    ``codes``: per position a signature, _MASKED or _FORBIDDEN; ``offset``: answer tokens before the block."""

    def __init__(
        self, constraint: WaypointConstraint, states: int, codes: list[int], offset: int, fwd: list[int] | None = None
    ) -> None:
        self.c = constraint
        self.states = states
        self.codes = codes
        self.offset = offset
        if fwd is None:
            image = constraint.image_fns
            fwd = [states]
            for code in codes:
                fwd.append(image[code + 2](fwd[-1]))
        preimage = constraint.preimage_fns
        bwd = [constraint.coreach[constraint.budget(offset + len(codes))]]
        for code in reversed(codes):
            bwd.append(preimage[code + 2](bwd[-1]))
        bwd.reverse()
        self.fwd, self.bwd = fwd, bwd
        self._penalty: torch.Tensor | None = None

    @property
    def feasible(self) -> bool:
        return bool(self.fwd[-1] & self.bwd[-1])

    def decide(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Greedy token and its probability per position under the grammar: the softmax over the tokens some
        completion allows (masked positions; fixed ones get the best grammar token, unused); plus the constrained
        grammar-token logits (n, K) for ``fill``. Works on the K grammar columns on the host (tiny arrays)."""
        c = self.c
        if self._penalty is None:
            fwd, bwd, free = self.fwd, self.bwd, c._free_row
            rows = [c.allowed_row(fwd[j] & bwd[j], bwd[j + 1]) if code == _MASKED else free
                    for j, code in enumerate(self.codes)]
            self._penalty = c._rows[rows]
        sub = logits.index_select(-1, c._grammar_ids.to(logits.device)).float().cpu().numpy() + self._penalty
        best = sub.argmax(1)
        top = sub[np.arange(len(best)), best]
        p = 1.0 / np.exp(sub - top[:, None]).sum(1)
        self._best_sig = c._grammar_sig[best].tolist()
        prediction = torch.from_numpy(c.grammar_ids[best]).to(logits.device)
        return torch.from_numpy(p.astype(np.float32)).to(logits.device), prediction, sub

    def choose(self, select: torch.Tensor) -> tuple[torch.Tensor, BlockView]:
        """Shrink ``select`` (positions to fix with the tokens ``decide`` predicted, each allowed on its own) to a
        jointly feasible set; returns it and the view of the block after those fixes.

        One left-to-right pass: a candidate is kept when the states so far (earlier kept candidates fixed) can take
        it and still reach the backward set, which treats later candidates as masked; so the kept set is feasible
        and the leftmost candidate is always kept.
        """
        picks = select.tolist()
        sigs = self._best_sig
        kept = list(picks)
        image, bwd = self.c.image_fns, self.bwd
        codes = list(self.codes)
        fwd = [self.states]
        for j, code in enumerate(self.codes):
            cur = fwd[-1]
            if picks[j]:
                nxt = image[sigs[j] + 2](cur)
                if nxt & bwd[j + 1]:
                    codes[j] = sigs[j]
                    fwd.append(nxt)
                    continue
                kept[j] = False
            fwd.append(image[code + 2](cur))
        after = BlockView(self.c, self.states, codes, self.offset, fwd)
        return torch.tensor(kept, dtype=torch.bool, device=select.device), after

    def fill(self, block: torch.Tensor, grammar_logits: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Fix every masked position left to right with its best allowed token under ``grammar_logits`` (an
        earlier ``decide``'s, no model call). Returns the block and each filled token's probability under the
        constrained distribution (0 elsewhere)."""
        scores_all = grammar_logits
        filled = block.cpu().numpy().copy()
        conf = np.zeros(len(self.codes), dtype=np.float32)
        image, bwd, c = self.c.image_fns, self.bwd, self.c
        cur = self.states
        for j, code in enumerate(self.codes):
            if code == _MASKED:
                row = c.allowed_row(cur & bwd[j], bwd[j + 1])  # may grow c._rows: look it up after
                scores = scores_all[j] + c._rows[row]
                best = int(scores.argmax())
                conf[j] = 1.0 / np.exp(scores - scores[best]).sum()  # softmax over the allowed tokens
                filled[j] = c.grammar_ids[best]
                code = int(c._grammar_sig[best])
            cur = image[code + 2](cur)
        return torch.from_numpy(filled).to(block.device), torch.from_numpy(conf).to(block.device)
