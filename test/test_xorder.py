"""The x ordering rule (decoding/xorder.py): waypoints do not step back, and the decoders keep to it."""

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.decoding.unmask import tokens_per_step, unmask_top_k
from wamdiff_ros.decoding.xorder import MAX_STEP_M, TOLERANCE_M, XOrder
from wamdiff_ros.tiny import tiny_tokenizer


def _chars(text: str) -> list:
    """Answer characters with '?' for a masked place."""
    return [None if ch == "?" else ch for ch in text]


def _show(allowed) -> list:
    return allowed and ["".join(sorted(a)) if a is not None else None for a in allowed]


def test_a_lost_tens_digit_is_ruled_out_and_the_hundreds_stay_zero():
    rule = XOrder()
    before = "003.50,e00.00,007.50,e00.00,"  # x1 = 3.5, x2 = 7.5: x3 must lie in [6.5, 27.5]
    assert rule.intervals(_chars(before))[2] == (6.5, 27.5)
    assert _show(rule.allowed(_chars(before + "??0???"), 2)) == ["0", "12", None, None, None, None]
    assert _show(rule.allowed(_chars(before + "?0????"), 2)) == ["0", None, "6789", None, None, None]
    # the integer part complete: the decimals keep it at or above 6.5
    assert _show(rule.allowed(_chars(before + "006.??"), 2)) == [None] * 4 + ["56789", "0123456789"]
    assert rule.allowed(_chars(before + "000.??"), 2) is None  # already broken: the rule stands aside


def test_the_first_waypoint_is_bounded_by_the_car_and_a_later_number_bounds_an_earlier_one():
    rule = XOrder()
    assert rule.intervals([])[0] == (-TOLERANCE_M, MAX_STEP_M)
    later = "??????,e00.00,050.00"  # x2 = 50 known first: x1 would need >= 30, but the car allows at most 20
    assert not rule.consistent(_chars(later))
    ok = "??????,e00.00,015.00"
    assert rule.consistent(_chars(ok))
    assert rule.intervals(_chars(ok))[0] == (-TOLERANCE_M, 15.0 + TOLERANCE_M)
    assert _show(rule.allowed(_chars(ok), 0))[:3] == ["-0", "01", "0123456789"]


def test_accepts_refuses_a_pick_that_breaks_a_neighbour_and_stands_aside_once_broken():
    rule = XOrder()
    chars = _chars("003.50,e00.00,007.50,e00.00,??????")
    assert rule.accepts(chars, 28 + 1, "1")  # tens 1: 10.x..19.x fits
    assert not rule.accepts(chars, 28 + 0, "5")  # hundreds 5: 500 m ahead of 7.5 in 0.5 s
    assert chars[28] is None  # left unchanged
    broken = _chars("003.50,e00.00,000.10,e00.00,??????")  # x2 already behind x1
    assert rule.accepts(broken, 28, "9")
    assert XOrder.place(28) == (2, 0) and XOrder.place(35) is None and XOrder.place(34) is None


def _steps_back(x: np.ndarray) -> bool:
    """Any x more than the tolerance behind the car or an earlier x (float32 waypoints: a little slack)."""
    path = np.concatenate([[0.0], x])
    return bool((path < np.maximum.accumulate(path) - TOLERANCE_M - 1e-4).any())


def _random_decode(constraint, vocab: int, eos: int, block: int, steps: int, seed: int) -> list[int]:
    """Block decoding driven by random logits, static top-k picks vetted by the grammar and the x rule."""
    gen = torch.Generator().manual_seed(seed)
    tokens: list[int] = []
    states = constraint.start_state
    mask_id = vocab
    while len(tokens) < 128:
        n = min(block, 128 - len(tokens))
        view = constraint.fresh_view(states, n, len(tokens))
        current, masked = torch.full((n,), mask_id), torch.ones(n, dtype=torch.bool)
        for k in tokens_per_step(n, steps):
            chars = constraint.chars_of(tokens) + constraint.chars_of(current.tolist(), masked.tolist())
            logits = torch.randn(n, vocab + 1, generator=gen) * 4
            p, prediction, grammar_logits = view.decide(logits, chars)
            select, after = view.choose(unmask_top_k(p, masked, k), chars)
            assert select.any() and after.feasible
            current = torch.where(select, prediction, current)
            masked &= ~select
            view = after
        if masked.any():
            chars = constraint.chars_of(tokens) + constraint.chars_of(current.tolist(), masked.tolist())
            current, _ = view.fill(current, grammar_logits, chars)
        tokens += current.tolist()
        states = constraint.advance(states, current.tolist())
        if eos in current.tolist():
            break
    return tokens


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("block, steps", [(1, 1), (8, 2), (32, 32), (32, 4), (128, 3)])
def test_random_logits_never_step_back(block, steps, version):
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    on = WaypointConstraint(tok, eos, 128, format_version=version, x_order=True)
    off = WaypointConstraint(tok, eos, 128, format_version=version)
    assert on.order is not None and off.order is None
    broken_free = 0
    for seed in range(6):
        for constraint, free in ((on, False), (off, True)):
            tokens = _random_decode(constraint, len(tok), eos, block, steps, seed)
            parsed = fmt.parse_waypoints(tok.decode([t for t in tokens if t != eos]))
            assert parsed.valid
            x = parsed.waypoints[:, 0].astype(np.float64)
            if free:
                broken_free += _steps_back(x)
            else:
                assert not _steps_back(x), x
                assert (np.diff(np.concatenate([[0.0], x])) <= MAX_STEP_M + 1e-9).all(), x
    assert broken_free > 0  # random logits do step back without the rule: the test can see a failure


def test_version_one_and_multi_character_number_tokens_turn_the_rule_off():
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    assert WaypointConstraint(tok, eos, 128, format_version=1, x_order=True).order is None

    class Merging:
        pieces = list("0123456789.,-") + ["12", "<|im_end|>"]

        def __len__(self):
            return len(self.pieces)

        def decode(self, ids):
            return "".join(self.pieces[i] for i in ids)

    assert WaypointConstraint(Merging(), len(Merging.pieces) - 1, 128, format_version=2, x_order=True).order is None


class _Backend:
    """Logits that favour a fixed answer but put a wrong digit first at some places, most confident there, so
    confidence order fixes the wrong digit before its neighbours."""

    def __init__(self, tok, answer: str, wrong: dict[int, str]) -> None:
        self.tok, self.forward_calls, self.device = tok, 0, torch.device("cpu")
        ids = tok(answer + fmt.CHAT_END, add_special_tokens=False)["input_ids"]
        self.target = ids
        self.wrong = {p: tok.convert_tokens_to_ids(ch) for p, ch in wrong.items()}
        self.offset = 0

    def _logits(self, n: int) -> torch.Tensor:
        out = torch.zeros(n, len(self.tok) + 1)
        for j in range(n):
            p = self.offset + j
            if p < len(self.target):
                out[j, self.target[p]] = 6.0 + (p % 7) * 0.1
            if p in self.wrong:
                out[j, self.wrong[p]] = 12.0  # wrong and very sure
                out[j, self.target[p]] = 10.0
        return out

    def step(self, block):
        self.forward_calls += 1
        return self._logits(len(block))

    def commit_and_step(self, clean, block):
        self.offset += len(clean)
        return self.step(block)


def test_block_decoder_fixes_the_tens_digit_it_would_lose():
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    mask_id = len(tok)
    truth = np.array([[6.0, 0], [12.0, 0], [16.5, 0], [20.0, 0], [24.0, 0], [28.0, 0], [32.0, 0], [36.0, 0]])
    answer = fmt.format_waypoints(truth, 3)
    wrong = {2 * 2 * 7 + 1: "0"}  # x3's tens digit: "016.50" -> "006.50", 5.5 m behind x2
    settings = DecodeSettings(block_size=32, steps=32, threshold=0.7)
    results = {}
    for x_order in (True, False):
        constraint = WaypointConstraint(tok, eos, 128, len(tok) + 1, 3, x_order)
        result = decode_blocks(_Backend(tok, answer, wrong), settings, mask_id, eos, constraint)
        results[x_order] = fmt.parse_waypoints(tok.decode([t for t in result.tokens if t != eos])).waypoints
    assert results[False][2, 0] == pytest.approx(6.5)  # without the rule the lost digit stays lost
    np.testing.assert_allclose(results[True], truth, atol=1e-6)


@pytest.mark.parametrize("ar", [False, True], ids=["block", "ar"])
def test_planner_with_x_order_never_steps_back_on_a_random_model(ar):
    from wamdiff_ros.model import DecodeMeta, tiny_random
    from wamdiff_ros.planner import EgoState, Planner

    meta = DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal") if ar else None
    bundle = tiny_random(seed=3, **({"meta": meta} if meta else {}))
    block = 1 if ar else 32
    rng = np.random.default_rng(0)
    back = {True: 0, False: 0}
    for _ in range(3):
        image = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        ego = EgoState((float(rng.uniform(0, 20)), 0.0))
        for x_order in (True, False):
            plan = Planner(bundle, DecodeSettings(block_size=block, x_order=x_order)).plan(image, ego, "follow")
            assert plan.valid
            back[x_order] += _steps_back(plan.waypoints[:, 0].astype(np.float64))
    assert back[True] == 0
    assert back[False] > 0  # the random model does step back without the rule
