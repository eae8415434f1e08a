"""The x ordering rule: a plan's waypoints do not step back.

A car plan does not reverse: in the references every waypoint's x (metres ahead) lies at or ahead of the one before
it, and the first at or ahead of the car. The block decoder fixes digits in confidence order, and a tens digit fixed
before its neighbours can break this (``…,039.13,e05.79,059.13,…`` or x 7.5 then 0.6: training/README.md, "v16").
This rule lifts "x_k >= x_j - tolerance for every earlier j, and x_k <= x_(k-1) + max_step" (x_(-1) = 0, the car:
a plan neither steps back nor creeps backwards a metre at a time, nor outruns 40 m/s) to characters: for a
number with some characters fixed and some masked, a character is allowed at a masked place when some completion of
the number lies within its range, the interval the rule leaves it once every number's own range (from its fixed
characters) is carried along the chain forwards and backwards. The upper bound matters as much as the lower:
without it a units digit fixed at 0 after x = 7.5 would leave the tens digit free by allowing a hundreds digit of 1.
The decoder adds it to the grammar constraint (``constraint.py``), so it costs no model call.

Fixed-width answers only (format versions 2 and 3: every number 6 characters, then a comma), and only for tokenizers
whose answer tokens are single characters (the tiny tokenizer, Qwen's digits); elsewhere the rule is off.

Integer places are checked exactly over all 1,100 integer parts (``ddd`` and ``-dd``); the decimals enter as the
range their fixed characters leave, and are constrained themselves once the integer part is complete.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from wamdiff_ros import format as fmt

TOLERANCE_M = 1.0  # how far an x may lie behind the car or an earlier x (the ``steps_back`` count's threshold)
MAX_STEP_M = 20.0  # how far an x may lie ahead of the one before it: 40 m/s (largest reference step: 14.8 m)

_WIDTH = fmt.MAX_INT_DIGITS + 1 + fmt.WAYPOINT_DECIMALS  # characters of one fixed-width number
_STRIDE = _WIDTH + 1  # with its comma
_INT = fmt.MAX_INT_DIGITS
_DIGITS = "0123456789"
_DIGIT_PLACES = tuple(j for j in range(_WIDTH) if j != _INT)  # _INT: the decimal point's place
_ROUNDS = 8  # bounds-consistency rounds at most (``XOrder.intervals``)


def _table(rows: list[str]) -> np.ndarray:
    return np.array([[ord(ch) for ch in row] for row in rows], dtype=np.uint8)


class XOrder:
    """Allowed characters at the masked places of a fixed-width answer's x numbers. Positions are answer
    characters (0 = the answer's first); ``chars`` lists the answer's characters so far, None where masked."""

    def __init__(self, tolerance: float = TOLERANCE_M, max_step: float = MAX_STEP_M) -> None:
        if not tolerance >= 0 or not max_step > 0:
            raise ValueError(f"tolerance {tolerance} must be >= 0 and max_step {max_step} > 0")
        self.tolerance, self.max_step = float(tolerance), float(max_step)
        ints = ["".join(p) for p in itertools.product(_DIGITS, repeat=_INT)]
        negs = ["-" + "".join(p) for p in itertools.product(_DIGITS, repeat=_INT - 1)]
        self._int_chars = _table(ints + negs)  # (1100, 3)
        self._int_mag = np.array([int(s.lstrip("-")) for s in ints + negs], dtype=np.float64)
        self._int_sign = np.array([1.0] * len(ints) + [-1.0] * len(negs))
        decs = ["".join(p) for p in itertools.product(_DIGITS, repeat=fmt.WAYPOINT_DECIMALS)]
        self._dec_chars = _table(decs)  # (100, 2)
        self._dec_val = np.array([int(s) / 10**fmt.WAYPOINT_DECIMALS for s in decs])
        self._memo: dict[tuple, tuple] = {}  # _solve's answers
        self._ranges: dict[tuple, list | None] = {}  # intervals' answers, by the x numbers' characters

    # -- positions ------------------------------------------------------------------------------------------
    @staticmethod
    def place(position: int) -> tuple[int, int] | None:
        """(waypoint k, place inside its x: 0-5) of an answer character position, None when it is not inside an x."""
        number, inside = divmod(position, _STRIDE)
        if number % 2 or number >= 2 * fmt.NUM_WAYPOINTS or inside >= _WIDTH:
            return None
        return number // 2, inside

    @staticmethod
    def span(k: int) -> range:
        """The answer character positions of waypoint k's x."""
        return range(2 * k * _STRIDE, 2 * k * _STRIDE + _WIDTH)

    # -- one number -----------------------------------------------------------------------------------------
    def _solve(self, pattern: tuple, low: float, high: float) -> tuple:
        """For a number's 6 characters (None: masked) within [low, high]: (feasible, smallest, largest completion,
        allowed characters per place as a tuple of frozensets or None where unconstrained)."""
        key = (pattern, low, high)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        ints, decs = pattern[:_INT], pattern[_INT + 1:]
        rows = np.ones(len(self._int_chars), dtype=bool)
        for j, ch in enumerate(ints):
            if ch is not None:
                rows &= self._int_chars[:, j] == ord(ch)
        drows = np.ones(len(self._dec_chars), dtype=bool)
        for j, ch in enumerate(decs):
            if ch is not None:
                drows &= self._dec_chars[:, j] == ord(ch)
        out: tuple
        if not rows.any() or not drows.any():  # not a number the grammar writes: no rule
            out = (False, -math.inf, math.inf, (None,) * _WIDTH)
        else:
            dmin, dmax = float(self._dec_val[drows].min()), float(self._dec_val[drows].max())
            mag, sign = self._int_mag, self._int_sign
            lo = np.where(sign > 0, mag + dmin, -(mag + dmax))
            hi = np.where(sign > 0, mag + dmax, -(mag + dmin))
            fits = rows & (hi >= low) & (lo <= high)
            if not fits.any():
                out = (False, float(lo[rows].min()), float(hi[rows].max()), (None,) * _WIDTH)
            else:
                tight_lo = float(np.maximum(lo[fits], low).min())  # the completions' range within [low, high]
                tight_hi = float(np.minimum(hi[fits], high).max())
                allowed: list[frozenset | None] = [None] * _WIDTH
                for j, ch in enumerate(ints):
                    if ch is None:
                        allowed[j] = frozenset(chr(c) for c in np.unique(self._int_chars[fits, j]))
                feasible = True
                if all(ch is not None for ch in ints) and any(ch is None for ch in decs):  # the decimals' turn
                    i = int(np.flatnonzero(rows)[0])
                    value = sign[i] * (mag[i] + self._dec_val)
                    dfits = drows & (value >= low) & (value <= high)
                    feasible = bool(dfits.any())
                    if feasible:
                        tight_lo, tight_hi = float(value[dfits].min()), float(value[dfits].max())
                        for j, ch in enumerate(decs):
                            if ch is None:
                                allowed[_INT + 1 + j] = frozenset(chr(c) for c in np.unique(self._dec_chars[dfits, j]))
                out = (feasible, tight_lo, tight_hi, tuple(allowed))
        if len(self._memo) > 65536:
            self._memo.clear()
        self._memo[key] = out
        return out

    @classmethod
    def _pattern(cls, chars: list[str | None], k: int) -> tuple:
        span = cls.span(k)
        part = tuple(chars[span.start:span.stop])
        return part if len(part) == _WIDTH else part + (None,) * (_WIDTH - len(part))

    def intervals(self, chars: list[str | None]) -> list[tuple[float, float]] | None:
        """Per waypoint, the range its x may take, or None when some x has no completion within the rule.

        Each number starts from its own range (its fixed characters); the rule carries the ranges along the chain
        from the car (x = 0) forwards and backwards, and each range then shrinks to the completions that lie in it
        (a number's values are not an interval: ``?33.00`` is -33, 33, 133, ...). Repeated until nothing moves
        (at most ``_ROUNDS`` times): bounds consistency, which rules out far more than one pass, though not every
        dead end."""
        patterns = tuple(self._pattern(chars, k) for k in range(fmt.NUM_WAYPOINTS))
        if patterns in self._ranges:
            return self._ranges[patterns]
        if len(self._ranges) > 16384:
            self._ranges.clear()
        out = self._ranges[patterns] = self._propagate(patterns)
        return out

    def _propagate(self, patterns: tuple) -> list[tuple[float, float]] | None:
        lo, hi = [], []
        for pattern in patterns:
            _, a, b, _ = self._solve(pattern, -math.inf, math.inf)
            lo.append(a)
            hi.append(b)
        # Only partly fixed numbers can shrink past the chain's bounds: a masked one takes every value on the
        # 0.01 grid and a complete one is a single value, so for those the chain's bounds are already tight.
        partial = [k for k, pattern in enumerate(patterns)
                   if any(pattern[j] is None for j in _DIGIT_PLACES) and any(ch is not None for ch in pattern)]
        for _ in range(_ROUNDS):
            ahead = prev_hi = 0.0  # ahead: the farthest any earlier x (or the car) surely is
            for k in range(fmt.NUM_WAYPOINTS):
                lo[k], hi[k] = max(lo[k], ahead - self.tolerance), min(hi[k], prev_hi + self.max_step)
                ahead, prev_hi = max(ahead, lo[k]), hi[k]
            behind = hi[-1]  # the nearest any later x can be at most
            for k in range(fmt.NUM_WAYPOINTS - 2, -1, -1):
                lo[k], hi[k] = max(lo[k], lo[k + 1] - self.max_step), min(hi[k], behind + self.tolerance)
                behind = min(behind, hi[k])
            if any(lo[k] > hi[k] for k in range(fmt.NUM_WAYPOINTS)):
                return None
            moved = False
            for k in partial:
                feasible, a, b, _ = self._solve(patterns[k], lo[k], hi[k])
                if not feasible:
                    return None
                if a > lo[k] or b < hi[k]:
                    lo[k], hi[k], moved = a, b, True
            if not moved:
                break
        return list(zip(lo, hi))

    def allowed(self, chars: list[str | None], k: int, intervals: list | None = None
                ) -> tuple[frozenset | None, ...] | None:
        """Per place of waypoint k's x: the characters allowed (None: any the grammar allows); None when some x
        has no completion within the rule (the rule then stands aside rather than block decoding)."""
        ranges = intervals if intervals is not None else self.intervals(chars)
        if ranges is None:
            return None
        feasible, _, _, allowed = self._solve(self._pattern(chars, k), *ranges[k])
        return allowed if feasible else None

    def consistent(self, chars: list[str | None]) -> bool:
        """Whether every x can still be completed within the rule (as far as ``intervals`` sees)."""
        return self.intervals(chars) is not None

    def accepts(self, chars: list[str | None], position: int, ch: str) -> bool:
        """Whether fixing ``ch`` at ``position`` leaves every x completable within the rule (always, when they were
        not before: the rule has stood aside). ``chars`` is left unchanged."""
        place = self.place(position)
        if place is None or place[1] == _INT or not self.consistent(chars):  # _INT: the decimal point
            return True
        old = chars[position]
        chars[position] = ch
        try:
            return self.consistent(chars)
        finally:
            chars[position] = old

    def masked_places(self, chars: list[str | None], start: int, stop: int) -> dict[int, frozenset]:
        """The allowed characters of every masked x place in [start, stop) that the rule narrows."""
        out: dict[int, frozenset] = {}
        ks = sorted({p[0] for p in map(self.place, range(start, stop)) if p is not None})
        if not ks:
            return out
        ranges = self.intervals(chars)
        if ranges is None:
            return out
        for k in ks:
            allowed = self.allowed(chars, k, ranges)
            if allowed is None:
                continue
            for place, position in enumerate(self.span(k)):
                if start <= position < stop and allowed[place] is not None and (
                        position >= len(chars) or chars[position] is None):
                    out[position] = allowed[place]
        return out
