"""Behaviour of the text format: prompts, answers, the never-raising parsers and the waypoint character grammar."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from wamdiff_ros.format import (
    CHAT_ASSISTANT,
    CHAT_END,
    CHAT_USER,
    IMAGE_PAD,
    IMAGE_PLACEHOLDER,
    MAX_INT_DIGITS,
    NO_BOXES,
    NUM_WAYPOINTS,
    VISION_END,
    VISION_START,
    FORMAT_VERSION,
    FORMAT_VERSIONS,
    LATERAL_BINS,
    WAYPOINT_GRAMMAR_START,
    WAYPOINT_GRAMMAR_STATES,
    Box,
    BoxParse,
    Command,
    WaypointParse,
    ask_prompt,
    chat,
    detect_prompt,
    check_format_version,
    format_boxes,
    has_route_line,
    parse_boxes,
    parse_route_line,
    parse_text,
    parse_waypoints,
    plan_prompt,
    route_line,
    waypoint_grammar_complete,
    lateral_range,
    waypoint_range,
    waypoint_text_version,
)
from wamdiff_ros.format import format_waypoints as format_any
from wamdiff_ros.format import waypoint_grammar_run as grammar_run_any
from wamdiff_ros.format import waypoint_grammar_step as grammar_step_any

# Most tests below pin waypoint format version 1, the paper's free width; version 3 (fixed-width x, y as sideways
# bins, the default the package writes) has its own section at the end and shares the parser.
format_waypoints = functools.partial(format_any, version=1)
waypoint_grammar_run = functools.partial(grammar_run_any, version=1)
waypoint_grammar_step = functools.partial(grammar_step_any, version=1)

GRAMMAR_ALPHABET = "0123456789.,-"
LIMIT = 999.99
TOLERANCE = 0.005 + 1e-4  # half a hundredth, plus float32 spacing near 1000

EXAMPLE = np.array(
    [[1.5, 0.0], [3.25, -0.01], [5.0, -0.1], [7.12, -0.3], [9.4, -0.55], [11.0, -0.9], [13.33, -1.2], [15.0, -1.6]]
)
EXAMPLE_TEXT = "1.50,0.00,3.25,-0.01,5.00,-0.10,7.12,-0.30,9.40,-0.55,11.00,-0.90,13.33,-1.20,15.00,-1.60"

waypoint_arrays = arrays(np.float64, (NUM_WAYPOINTS, 2), elements=st.floats(-999.0, 999.0))
answer_numbers = st.integers(-(10 ** (MAX_INT_DIGITS + 2) - 1), 10 ** (MAX_INT_DIGITS + 2) - 1).map(
    lambda hundredths: f"{hundredths / 100:.2f}"
)
answers = st.lists(answer_numbers, min_size=2 * NUM_WAYPOINTS, max_size=2 * NUM_WAYPOINTS).map(",".join)
box_labels = st.builds(
    lambda first, rest: first + rest.rstrip(),
    st.sampled_from("abcxyzABCXYZ"),
    st.text(alphabet="abcxyzABCXYZ0189_ -", max_size=10),
)


@st.composite
def grid_boxes(draw: st.DrawFn) -> Box:
    x1 = draw(st.integers(0, 999))
    y1 = draw(st.integers(0, 999))
    x2 = draw(st.integers(x1 + 1, 1000))
    y2 = draw(st.integers(y1 + 1, 1000))
    return Box(draw(box_labels), float(x1), float(y1), float(x2), float(y2))


@st.composite
def mutated_answers(draw: st.DrawFn, base: st.SearchStrategy[str] = answers, alphabet: str = GRAMMAR_ALPHABET) -> str:
    text = list(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        ch = draw(st.sampled_from(alphabet))
        if op == "insert":
            text.insert(i, ch)
        elif i < len(text):
            if op == "delete":
                del text[i]
            else:
                text[i] = ch
    return "".join(text)


def _grammar_accepts(text: str) -> bool:
    return waypoint_grammar_complete(waypoint_grammar_run(WAYPOINT_GRAMMAR_START, text))


# ---------------------------------------------------------------------------------------------------------------
# Waypoint answers


def test_format_waypoints_exact_text() -> None:
    assert format_waypoints(EXAMPLE) == EXAMPLE_TEXT
    assert format_waypoints(EXAMPLE.reshape(-1)) == EXAMPLE_TEXT


def _assert_round_trip(wp: np.ndarray) -> None:
    text = format_waypoints(wp)
    assert "-0.00" not in text.split(",")
    parsed = parse_waypoints(text)
    assert parsed.valid, parsed.reason
    assert parsed.reason == ""
    assert parsed.waypoints.dtype == np.float32
    assert parsed.waypoints.shape == (NUM_WAYPOINTS, 2)
    expected = np.clip(np.asarray(wp, dtype=np.float64), -LIMIT, LIMIT)
    np.testing.assert_allclose(parsed.waypoints, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("seed", range(20))
def test_round_trip_random_arrays(seed: int) -> None:
    rng = np.random.default_rng(seed)
    _assert_round_trip(rng.uniform(-999.0, 999.0, size=(NUM_WAYPOINTS, 2)))


@given(waypoint_arrays)
def test_round_trip_hypothesis(wp: np.ndarray) -> None:
    _assert_round_trip(wp)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-0.001, "0.00"),
        (-0.004, "0.00"),
        (0.004, "0.00"),
        (-0.006, "-0.01"),
        (12.345678, "12.35"),
        (-999.0, "-999.00"),
        (999.994, "999.99"),
        (1e6, "999.99"),
        (-1e6, "-999.99"),
        (math.inf, "999.99"),
        (-math.inf, "-999.99"),
    ],
)
def test_format_waypoints_rounds_clips_and_drops_negative_zero(value: float, text: str) -> None:
    wp = np.full((NUM_WAYPOINTS, 2), value)
    out = format_waypoints(wp)
    assert out == ",".join([text] * 2 * NUM_WAYPOINTS)
    assert parse_waypoints(out).valid


def test_parse_waypoints_values() -> None:
    parsed = parse_waypoints(EXAMPLE_TEXT)
    assert parsed.valid
    np.testing.assert_array_equal(parsed.waypoints, EXAMPLE.astype(np.float32))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty answer"),
        ("   \n\t", "empty answer"),
        (CHAT_END + EXAMPLE_TEXT, "empty answer"),
        (EXAMPLE_TEXT.rsplit(",", 1)[0], "expected 16 numbers, got 15"),
        (EXAMPLE_TEXT + ",1.00", "expected 16 numbers, got 17"),
        ("1.00", "expected 16 numbers, got 1"),
        (EXAMPLE_TEXT.replace("5.00", "abc"), "number 5 'abc' is not like -12.34"),
        (EXAMPLE_TEXT.replace("3.25", "3.255"), "number 3 '3.255' is not like -12.34"),
        (EXAMPLE_TEXT.replace("3.25", "3.2"), "number 3 '3.2' is not like -12.34"),
        (EXAMPLE_TEXT.replace("3.25", "3"), "number 3 '3' is not like -12.34"),
        (EXAMPLE_TEXT.replace("11.00", "1100.00"), "number 11 '1100.00' is not like -12.34"),
        (EXAMPLE_TEXT.replace("1.50", "+1.50"), "number 1 '+1.50' is not like -12.34"),
        (EXAMPLE_TEXT.replace("1.50", "1e2"), "number 1 '1e2' is not like -12.34"),
        (EXAMPLE_TEXT.replace("1.50", "nan"), "number 1 'nan' is not like -12.34"),
        (EXAMPLE_TEXT.replace("0.00", ""), "number 2 '' is not like -12.34"),
        ("(" + EXAMPLE_TEXT + ")", "number 1 '(1.50' is not like -12.34"),
    ],
)
def test_parse_waypoints_invalid_reasons(text: str, reason: str) -> None:
    parsed = parse_waypoints(text)
    assert not parsed.valid
    assert parsed.reason == reason
    np.testing.assert_array_equal(parsed.waypoints, np.zeros((NUM_WAYPOINTS, 2), dtype=np.float32))
    assert parsed.waypoints.dtype == np.float32


def test_parse_waypoints_reason_truncates_long_item() -> None:
    parsed = parse_waypoints(EXAMPLE_TEXT.replace("1.50", "x" * 100))
    assert not parsed.valid
    assert parsed.reason == f"number 1 {'x' * 20!r} is not like -12.34"


@pytest.mark.parametrize(
    "text",
    [
        EXAMPLE_TEXT + CHAT_END,
        EXAMPLE_TEXT + CHAT_END + "\n",
        EXAMPLE_TEXT + CHAT_END + "garbage, 1, 2, 3" + CHAT_END,
        "  " + EXAMPLE_TEXT + " \n" + CHAT_END,
        EXAMPLE_TEXT.replace(",", ", "),
        "\n" + EXAMPLE_TEXT + "\n",
    ],
)
def test_parse_waypoints_ignores_chat_end_tail_and_whitespace(text: str) -> None:
    parsed = parse_waypoints(text)
    assert parsed.valid, parsed.reason
    np.testing.assert_array_equal(parsed.waypoints, EXAMPLE.astype(np.float32))


# ---------------------------------------------------------------------------------------------------------------
# Boxes


def test_format_boxes_exact_text() -> None:
    boxes = [Box("car", 10.4, 20.6, 300.0, 400.0), Box("traffic cone", 0.0, 0.0, 1000.0, 1000.0)]
    assert format_boxes(boxes) == "car:10,21,300,400;traffic cone:0,0,1000,1000"
    assert format_boxes([]) == NO_BOXES == "none"


@given(st.lists(grid_boxes(), max_size=6))
def test_boxes_round_trip(boxes: list[Box]) -> None:
    parsed = parse_boxes(format_boxes(boxes))
    assert parsed.valid, parsed.reason
    assert parsed.reason == ""
    assert parsed.boxes == boxes


@pytest.mark.parametrize("text", ["none", " none\n", "none" + CHAT_END, "none" + CHAT_END + "car:1,2,3,4"])
def test_parse_boxes_none_is_empty_and_valid(text: str) -> None:
    assert parse_boxes(text) == BoxParse([], True, "")


def test_parse_boxes_values_and_spacing() -> None:
    parsed = parse_boxes(" car : 1.5 , 2 , 30 , 40 ;truck:0,0,1000,1000" + CHAT_END + "ignored")
    assert parsed.valid, parsed.reason
    assert parsed.boxes == [Box("car", 1.5, 2.0, 30.0, 40.0), Box("truck", 0.0, 0.0, 1000.0, 1000.0)]
    assert all(b.score == 1.0 for b in parsed.boxes)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty answer"),
        (CHAT_END + "none", "empty answer"),
        ("car:0,0,1001,10", "box 1 leaves the 0-1000 grid"),
        ("car:-1,0,10,10", "box 1 leaves the 0-1000 grid"),
        ("car:1,2,3,4;bus:0,0,10,2000", "box 2 leaves the 0-1000 grid"),
        ("car:0,0,10," + "9" * 400, "box 1 leaves the 0-1000 grid"),
        ("car:10,10,10,20", "box 1 has no area"),
        ("car:10,10,20,10", "box 1 has no area"),
        ("car:20,10,10,30", "box 1 has no area"),
        ("car:1,2,3,4;car:5,5,5,9", "box 2 has no area"),
        ("car 1,2,3,4", "box 1 'car 1,2,3,4' is not like car:10,20,30,40"),
        ("car:1,2,3", "box 1 'car:1,2,3' is not like car:10,20,30,40"),
        ("car:1,2,3,4,5", "box 1 'car:1,2,3,4,5' is not like car:10,20,30,40"),
        ("1car:1,2,3,4", "box 1 '1car:1,2,3,4' is not like car:10,20,30,40"),
        (":1,2,3,4", "box 1 ':1,2,3,4' is not like car:10,20,30,40"),
        ("car:a,2,3,4", "box 1 'car:a,2,3,4' is not like car:10,20,30,40"),
        ("car:1,2,3,4;", "box 2 '' is not like car:10,20,30,40"),
        ("car:1,2,3,4;;bus:1,2,3,4", "box 2 '' is not like car:10,20,30,40"),
        ("None", "box 1 'None' is not like car:10,20,30,40"),
    ],
)
def test_parse_boxes_invalid_reasons(text: str, reason: str) -> None:
    parsed = parse_boxes(text)
    assert not parsed.valid
    assert parsed.reason == reason


# ---------------------------------------------------------------------------------------------------------------
# Prompts and chat


@pytest.mark.parametrize(
    ("command", "phrase"),
    [(Command.LEFT, "left"), (Command.RIGHT, "right"), (Command.STRAIGHT, "straight"), (Command.FOLLOW, "lane follow")],
)
def test_plan_prompt_wording(command: Command, phrase: str) -> None:
    prompt = plan_prompt(command, (4.66, -0.09), (0.17, -1.53))
    assert prompt.startswith(f"Here is a front-view images from a driving vehicle: {IMAGE_PLACEHOLDER}\n")
    assert prompt.count(IMAGE_PLACEHOLDER) == 1
    assert f"The navigation information is: {phrase}\n" in prompt
    assert "The current position is (0.00,0.00)\n" in prompt
    assert "The current velocity is: (4.66,-0.09) and current accelerate is: (0.17,-1.53)\n" in prompt
    assert "predict the optimal driving action for the next 4 seconds with 8 new waypoints." in prompt
    assert plan_prompt(command.value, (4.66, -0.09), (0.17, -1.53)) == prompt


def test_plan_prompt_rounds_and_drops_negative_zero() -> None:
    prompt = plan_prompt(Command.STRAIGHT, (4.655, -0.001), (-0.004, 12.0))
    assert "The current velocity is: (4.66,0.00) and current accelerate is: (0.00,12.00)\n" in prompt
    assert "-0.00" not in prompt


def test_plan_prompt_rejects_unknown_command() -> None:
    with pytest.raises(ValueError):
        plan_prompt("backwards", (0.0, 0.0), (0.0, 0.0))  # type: ignore[arg-type]


@pytest.mark.parametrize("image_tokens", [0, 1, 4, 256])
def test_chat_image_tokens_and_stripping(image_tokens: int) -> None:
    text = chat("  Look here: <image>\n  What is ahead?  ", image_tokens)
    assert text == (
        f"{CHAT_USER}Look here:{VISION_START}{IMAGE_PAD * image_tokens}{VISION_END}What is ahead?"
        f"{CHAT_END}\n{CHAT_ASSISTANT}"
    )
    assert text.count(IMAGE_PAD) == image_tokens
    assert text.count(VISION_START) == text.count(VISION_END) == 1
    assert IMAGE_PLACEHOLDER not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_plan_prompt() -> None:
    text = chat(plan_prompt(Command.LEFT, (4.66, -0.09), (0.17, -1.53)), 3)
    assert text.startswith(
        "<|im_start|>user\nHere is a front-view images from a driving vehicle:"
        "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>The navigation information is: left\n"
    )
    assert text.endswith("8 new waypoints.<|im_end|>\n<|im_start|>assistant\n")


def test_chat_without_image() -> None:
    assert chat("  hello  ", 5) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_detect_and_ask_prompts() -> None:
    detect = detect_prompt()
    assert detect.count(IMAGE_PLACEHOLDER) == 1
    assert "label:x1,y1,x2,y2" in detect
    assert "0-1000 grid" in detect
    assert f"'{NO_BOXES}'" in detect
    ask = ask_prompt("  Is the light red?\n")
    assert ask.count(IMAGE_PLACEHOLDER) == 1
    assert ask.endswith("Question: Is the light red?")
    assert chat(ask, 2).count(IMAGE_PAD) == 2


# ---------------------------------------------------------------------------------------------------------------
# Character grammar


def test_grammar_state_count() -> None:
    assert WAYPOINT_GRAMMAR_STATES == 2 * NUM_WAYPOINTS * (1 + 1 + MAX_INT_DIGITS + 1 + 2) == 128
    assert WAYPOINT_GRAMMAR_START == 0


def test_every_state_reachable_and_can_finish() -> None:
    forward = {WAYPOINT_GRAMMAR_START}
    frontier = [WAYPOINT_GRAMMAR_START]
    edges: dict[int, set[int]] = {s: set() for s in range(WAYPOINT_GRAMMAR_STATES)}
    while frontier:
        state = frontier.pop()
        for ch in GRAMMAR_ALPHABET:
            nxt = waypoint_grammar_step(state, ch)
            if nxt < 0:
                continue
            assert 0 <= nxt < WAYPOINT_GRAMMAR_STATES
            edges[state].add(nxt)
            if nxt not in forward:
                forward.add(nxt)
                frontier.append(nxt)
    assert forward == set(range(WAYPOINT_GRAMMAR_STATES))
    finishing = {WAYPOINT_GRAMMAR_STATES - 1}
    changed = True
    while changed:
        changed = False
        for state, nexts in edges.items():
            if state not in finishing and nexts & finishing:
                finishing.add(state)
                changed = True
    assert finishing == set(range(WAYPOINT_GRAMMAR_STATES))
    complete = [s for s in range(WAYPOINT_GRAMMAR_STATES) if waypoint_grammar_complete(s)]
    assert complete == [WAYPOINT_GRAMMAR_STATES - 1]
    assert edges[WAYPOINT_GRAMMAR_STATES - 1] == set()


@pytest.mark.parametrize("state", [-1, WAYPOINT_GRAMMAR_STATES, 10**6])
def test_grammar_step_outside_states_is_forbidden(state: int) -> None:
    assert all(waypoint_grammar_step(state, ch) == -1 for ch in GRAMMAR_ALPHABET)


@pytest.mark.parametrize("char", ["", "12", "a", " ", "+", "e", "\u0661", "\uff11", "-1"])
def test_grammar_step_rejects_non_alphabet(char: str) -> None:
    assert all(waypoint_grammar_step(s, char) == -1 for s in range(WAYPOINT_GRAMMAR_STATES))


def test_grammar_accepts_example_and_every_prefix_is_alive() -> None:
    assert _grammar_accepts(EXAMPLE_TEXT)
    for i in range(len(EXAMPLE_TEXT)):
        state = waypoint_grammar_run(WAYPOINT_GRAMMAR_START, EXAMPLE_TEXT[:i])
        assert state >= 0
        assert not waypoint_grammar_complete(state)


@pytest.mark.parametrize("seed", range(10))
def test_grammar_accepts_formatted_random_arrays(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    assert _grammar_accepts(format_waypoints(rng.uniform(-2000.0, 2000.0, size=(NUM_WAYPOINTS, 2))))


@given(waypoint_arrays)
def test_grammar_accepts_every_formatted_answer(wp: np.ndarray) -> None:
    assert _grammar_accepts(format_waypoints(wp))


@pytest.mark.parametrize(
    "text",
    [
        "1..",
        "--1",
        "-.",
        ".5",
        "1234.00",
        "1.000",
        "1.0,",
        "1,",
        ",",
        "1.00,,",
        "+1.00",
        " 1.00",
        EXAMPLE_TEXT + ",",
        EXAMPLE_TEXT + ",0.00",
        EXAMPLE_TEXT + "0",
        EXAMPLE_TEXT + CHAT_END,
    ],
)
def test_grammar_rejects_forbidden(text: str) -> None:
    assert waypoint_grammar_run(WAYPOINT_GRAMMAR_START, text) == -1


@pytest.mark.parametrize(
    "text",
    ["", "1", "-", "123", "123.", "1.0", "1.00", "1.00,", EXAMPLE_TEXT[:-1], EXAMPLE_TEXT.rsplit(",", 1)[0]],
)
def test_grammar_incomplete_is_alive_but_not_complete(text: str) -> None:
    state = waypoint_grammar_run(WAYPOINT_GRAMMAR_START, text)
    assert state >= 0
    assert not waypoint_grammar_complete(state)
    assert not parse_waypoints(text).valid


def test_grammar_integer_digit_limit() -> None:
    assert MAX_INT_DIGITS == 3
    assert waypoint_grammar_run(WAYPOINT_GRAMMAR_START, "999.99") >= 0
    assert waypoint_grammar_run(WAYPOINT_GRAMMAR_START, "-999.99") >= 0
    assert waypoint_grammar_run(WAYPOINT_GRAMMAR_START, "9999") == -1
    assert waypoint_grammar_run(WAYPOINT_GRAMMAR_START, "-9999") == -1


@pytest.mark.parametrize("number", ["007.50", "-0.00", "-000.00", "0.01", "-999.99"])
def test_grammar_and_parser_agree_on_unusual_numbers(number: str) -> None:
    text = ",".join([number] * 2 * NUM_WAYPOINTS)
    assert _grammar_accepts(text)
    parsed = parse_waypoints(text)
    assert parsed.valid
    np.testing.assert_array_equal(parsed.waypoints, np.full((NUM_WAYPOINTS, 2), float(number), dtype=np.float32))


@given(answers)
def test_grammar_accepts_every_generated_answer(text: str) -> None:
    assert _grammar_accepts(text)
    assert parse_waypoints(text).valid


@given(st.one_of(st.text(alphabet=GRAMMAR_ALPHABET, max_size=120), mutated_answers()))
def test_grammar_complete_iff_parser_valid_over_alphabet(text: str) -> None:
    assert _grammar_accepts(text) == parse_waypoints(text).valid


# ---------------------------------------------------------------------------------------------------------------
# The parsers never raise


_noise_alphabet = GRAMMAR_ALPHABET + ":; \n\tabcxyzACZ" + "<|>_"
arbitrary_text = st.one_of(
    st.text(),
    st.text(alphabet=_noise_alphabet),
    st.binary().map(lambda b: b.decode("utf-8", errors="replace")),
    mutated_answers(),
    mutated_answers().map(lambda s: s + CHAT_END + "tail"),
    st.lists(grid_boxes(), max_size=3).map(format_boxes),
)


def _check_waypoint_parse(parsed: WaypointParse) -> None:
    assert isinstance(parsed, WaypointParse)
    assert isinstance(parsed.valid, bool)
    assert isinstance(parsed.reason, str)
    assert isinstance(parsed.waypoints, np.ndarray)
    assert parsed.waypoints.shape == (NUM_WAYPOINTS, 2)
    assert parsed.waypoints.dtype == np.float32
    assert np.isfinite(parsed.waypoints).all()
    if parsed.valid:
        assert parsed.reason == ""
        assert (np.abs(parsed.waypoints) < 10.0**MAX_INT_DIGITS).all()
    else:
        assert parsed.reason
        assert not parsed.waypoints.any()


def _check_box_parse(parsed: BoxParse) -> None:
    assert isinstance(parsed, BoxParse)
    assert isinstance(parsed.valid, bool)
    assert isinstance(parsed.reason, str)
    assert isinstance(parsed.boxes, list)
    assert all(isinstance(b, Box) for b in parsed.boxes)
    if parsed.valid:
        assert parsed.reason == ""
        for b in parsed.boxes:
            assert 0 <= b.x1 < b.x2 <= 1000
            assert 0 <= b.y1 < b.y2 <= 1000
            assert b.label and b.label == b.label.strip()
    else:
        assert parsed.reason


@settings(max_examples=10_000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(arbitrary_text)
def test_parsers_never_raise(text: str) -> None:
    _check_waypoint_parse(parse_waypoints(text))
    _check_box_parse(parse_boxes(text))
    out = parse_text(text)
    assert isinstance(out, str)
    assert CHAT_END not in out
    assert out == out.strip()


@pytest.mark.parametrize("value", [None, 123, 1.5, b"bytes", ["1.00"], object()])
def test_parsers_reject_non_str(value: object) -> None:
    wp = parse_waypoints(value)  # type: ignore[arg-type]
    _check_waypoint_parse(wp)
    assert not wp.valid
    assert wp.reason == "empty answer"
    boxes = parse_boxes(value)  # type: ignore[arg-type]
    _check_box_parse(boxes)
    assert not boxes.valid
    assert boxes.reason == "empty answer"
    assert parse_text(value) == ""  # type: ignore[arg-type]


def test_parsers_accept_ascii_digits_only() -> None:
    assert not parse_waypoints(",".join(["１.００"] * 16)).valid
    assert not parse_boxes("car:１,２,３０,４０").valid


def test_format_waypoints_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        format_waypoints(np.full((8, 2), np.nan))


# ---------------------------------------------------------------------------------------------------------------
# Version 3, the default: every x in fixed width (3 integer places, zero-padded, a minus sign taking the first),
# every y a sideways bin letter (a..i, e = 0) and its residual + 5 m in the same width

EXAMPLE_TEXT_V3 = ("001.50,e05.00,003.25,e04.99,005.00,e04.90,007.12,e04.70,009.40,e04.45,011.00,e04.10,013.33,"
                   "e03.80,015.00,e03.40")
V3_ALPHABET = GRAMMAR_ALPHABET + LATERAL_BINS
TURN = np.array([[1.41, -0.22], [3.06, -0.74], [4.93, -1.74], [6.51, -3.26], [7.61, -5.13], [8.26, -7.38],
                 [8.67, -10.08], [9.07, -13.17]])
TURN_TEXT_V3 = ("001.41,e04.78,003.06,e04.26,004.93,e03.26,006.51,e01.74,007.61,d09.87,008.26,d07.62,008.67,"
                "d04.92,009.07,d01.83")


def _accepts_v3(text: str) -> bool:
    return waypoint_grammar_complete(grammar_run_any(WAYPOINT_GRAMMAR_START, text, version=3))


def _fixed_width_texts(values: np.ndarray) -> list[str]:
    """``values`` (NUM_WAYPOINTS of them) each written as version 3 writes an x."""
    return format_any(np.column_stack([values, np.zeros(NUM_WAYPOINTS)]), version=3).split(",")[::2]


def _unbinned(wp: np.ndarray) -> str:
    """An answer with every number, y too, in the fixed x width and no bin letters: a near miss of version 3 that
    parses as version 1."""
    xs, ys = _fixed_width_texts(wp[:, 0]), _fixed_width_texts(wp[:, 1])
    return ",".join(f"{x},{y}" for x, y in zip(xs, ys))


def test_version_3_is_the_default_and_version_2_is_gone() -> None:
    assert FORMAT_VERSION == 3 and FORMAT_VERSIONS == (1, 3)
    assert format_any(EXAMPLE) == format_any(EXAMPLE, version=3) == EXAMPLE_TEXT_V3
    assert all(len(n) == 6 for n in EXAMPLE_TEXT_V3.split(","))
    np.testing.assert_allclose(parse_waypoints(EXAMPLE_TEXT_V3).waypoints, EXAMPLE, rtol=0, atol=TOLERANCE)
    with pytest.raises(ValueError, match="format version 2"):
        format_any(EXAMPLE, version=2)
    with pytest.raises(ValueError, match="format version 2"):
        grammar_run_any(WAYPOINT_GRAMMAR_START, EXAMPLE_TEXT_V3, version=2)


def test_version_3_exact_text_and_parse() -> None:
    assert format_any(TURN, version=3) == TURN_TEXT_V3  # the turn's y leaves the straight road's bin e
    assert all(len(n) == 6 for n in TURN_TEXT_V3.split(","))
    for wp, text in ((EXAMPLE, EXAMPLE_TEXT_V3), (TURN, TURN_TEXT_V3)):
        parsed = parse_waypoints(text + CHAT_END)
        assert parsed.valid and waypoint_text_version(text) == 3 and _accepts_v3(text)
        np.testing.assert_allclose(parsed.waypoints, wp, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "000.00"), (-0.004, "000.00"), (-0.006, "-00.01"), (7.5, "007.50"), (-7.5, "-07.50"),
     (-12.345, "-12.35"), (123.456, "123.46"), (-99.99, "-99.99"), (-100.0, "-99.99"), (-1e6, "-99.99"),
     (999.994, "999.99"), (math.inf, "999.99")],
)
def test_version_3_x_rounds_pads_and_clips(value: float, text: str) -> None:
    wp = np.column_stack([np.full(NUM_WAYPOINTS, value), np.zeros(NUM_WAYPOINTS)])
    out = format_any(wp, version=3)
    assert out == ",".join([text, "e05.00"] * NUM_WAYPOINTS)
    assert waypoint_text_version(out) == 3 and _accepts_v3(out)
    np.testing.assert_allclose(parse_waypoints(out).waypoints[:, 0], np.clip(value, *waypoint_range(3)),
                               atol=TOLERANCE)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "e05.00"), (-0.004, "e05.00"), (-13.17, "d01.83"), (4.999, "e10.00"), (5.0, "e10.00"),
     (5.01, "f00.01"), (15.0, "g00.00"), (-15.0, "c10.00"), (44.0, "i09.00"), (45.0, "i10.00"), (-45.0, "a00.00"),
     (-60.0, "a00.00"), (math.inf, "i10.00")],
)
def test_version_3_bins_round_and_clip(value: float, text: str) -> None:
    wp = np.column_stack([np.full(NUM_WAYPOINTS, 12.5), np.full(NUM_WAYPOINTS, value)])
    out = format_any(wp, version=3)
    assert out == ",".join(["012.50", text] * NUM_WAYPOINTS)
    assert _accepts_v3(out) and waypoint_text_version(out) == 3
    low, high = lateral_range()
    np.testing.assert_allclose(parse_waypoints(out).waypoints[:, 1], np.clip(value, low, high), atol=TOLERANCE)


@given(waypoint_arrays)
def test_version_3_round_trip_and_grammar(wp: np.ndarray) -> None:
    text = format_any(wp, version=3)
    assert waypoint_text_version(text) == 3 and _accepts_v3(text)
    expected = np.column_stack([np.clip(wp[:, 0], *waypoint_range(3)), np.clip(wp[:, 1], *lateral_range())])
    np.testing.assert_allclose(parse_waypoints(text).waypoints, expected, rtol=0, atol=TOLERANCE)


def test_versions_keep_values_across_formats() -> None:
    v1 = parse_waypoints(EXAMPLE_TEXT)
    assert v1.valid and format_any(v1.waypoints.astype(np.float64), version=3) == EXAMPLE_TEXT_V3
    v3 = parse_waypoints(EXAMPLE_TEXT_V3)
    assert v3.valid and format_any(v3.waypoints.astype(np.float64), version=1) == EXAMPLE_TEXT


def test_text_version_of_answers() -> None:
    assert waypoint_text_version(EXAMPLE_TEXT) == 1
    assert waypoint_text_version(EXAMPLE_TEXT_V3) == 3
    assert waypoint_text_version(EXAMPLE_TEXT_V3 + CHAT_END) == 3
    assert waypoint_text_version("garbage") is None
    assert waypoint_text_version(_unbinned(EXAMPLE)) == 1  # fixed width without bins: free width that happens to pad
    assert waypoint_text_version(",".join(["100.00"] * 15 + ["1.00"])) == 1  # one free-width number: version 1


@pytest.mark.parametrize("text", [EXAMPLE_TEXT, "1.00", "-0.00", "-000.00", "0000.00", "-1.00", "00.00", "+00.00",
                                  "001.50,000.00", "001.50,-00.01"])
def test_version_3_grammar_refuses_other_widths(text: str) -> None:
    state = grammar_run_any(WAYPOINT_GRAMMAR_START, text, version=3)
    assert state == -1 or not waypoint_grammar_complete(state)
    if text == EXAMPLE_TEXT or "," in text:  # a free-width x; a y without its bin
        assert state == -1


@pytest.mark.parametrize(
    "text",
    [EXAMPLE_TEXT_V3.replace("e05.00", "005.00", 1),  # one y without its bin
     EXAMPLE_TEXT_V3.replace("001.50", "e01.50", 1),  # a bin letter on an x
     EXAMPLE_TEXT_V3.replace("e03.40", "j03.40"),  # no such bin
     EXAMPLE_TEXT_V3.replace("001.50", "1.50", 1)],  # a free-width x
)
def test_version_3_parser_and_grammar_refuse_mixtures(text: str) -> None:
    assert not parse_waypoints(text).valid or waypoint_text_version(text) != 3
    assert not _accepts_v3(text)


def test_version_3_grammar_every_prefix_alive_and_states_can_finish() -> None:
    for text in (EXAMPLE_TEXT_V3, TURN_TEXT_V3):
        for i in range(len(text)):
            state = grammar_run_any(WAYPOINT_GRAMMAR_START, text[:i], version=3)
            assert state >= 0 and not waypoint_grammar_complete(state)
    reached, frontier, edges = {WAYPOINT_GRAMMAR_START}, [WAYPOINT_GRAMMAR_START], {}
    while frontier:
        state = frontier.pop()
        edges[state] = {n for ch in V3_ALPHABET if (n := grammar_step_any(state, ch, version=3)) >= 0}
        for nxt in edges[state] - reached:
            reached.add(nxt)
            frontier.append(nxt)
    assert len(reached) == WAYPOINT_GRAMMAR_STATES - 2 * NUM_WAYPOINTS  # the sign state is not used
    finishing, changed = {WAYPOINT_GRAMMAR_STATES - 1}, True
    while changed:
        grown = {s for s in reached if edges[s] & finishing} | finishing
        changed, finishing = grown != finishing, grown
    assert finishing == reached


binned_answers = waypoint_arrays.map(lambda wp: format_any(wp, version=3))
unbinned_answers = waypoint_arrays.map(_unbinned)


@given(st.one_of(st.text(alphabet=V3_ALPHABET, max_size=120), mutated_answers(binned_answers, V3_ALPHABET),
                 mutated_answers(unbinned_answers, V3_ALPHABET)))
def test_version_3_grammar_complete_iff_binned_parse(text: str) -> None:
    assert _accepts_v3(text) == (waypoint_text_version(text) == 3)


def test_unknown_version_is_refused() -> None:
    for version in (0, 2, 4):
        with pytest.raises(ValueError, match=f"format version {version}"):
            check_format_version(version)
    with pytest.raises(ValueError, match="format version 0"):
        format_any(EXAMPLE, version=0)


# ---------------------------------------------------------------------------------------------------------------
# The optional route line of the plan prompt: one format, every number in version 3's x width

ROUTE_TURN = np.array([[10.0, -0.77], [29.24, -15.3]])


def test_route_line_writes_fixed_width_and_parses_back() -> None:
    line = route_line(ROUTE_TURN)
    assert line == "The route passes (010.00,-00.77) and (029.24,-15.30)"
    np.testing.assert_allclose(parse_route_line(line), ROUTE_TURN, atol=1e-9)
    far = route_line(np.array([[10.0, -150.0], [1500.0, 0.004]]))  # clipped to the fixed width's range
    assert far == "The route passes (010.00,-99.99) and (999.99,000.00)"
    for bad in (np.zeros((3, 2)), np.array([[10.0, math.nan], [30.0, 0.0]])):
        with pytest.raises(ValueError, match="route points"):
            route_line(bad)


def test_plan_prompt_carries_the_route_line_after_the_command() -> None:
    paper = plan_prompt(Command.RIGHT, (6.0, 0.1), (0.2, 0.0))
    routed = plan_prompt(Command.RIGHT, (6.0, 0.1), (0.2, 0.0), ROUTE_TURN)
    assert not has_route_line(paper) and parse_route_line(paper) is None
    assert has_route_line(routed) and routed.replace(route_line(ROUTE_TURN) + "\n", "") == paper
    lines = routed.split("\n")
    assert lines[lines.index(route_line(ROUTE_TURN)) - 1].startswith("The navigation information is:")
    np.testing.assert_allclose(parse_route_line(routed), ROUTE_TURN, atol=1e-9)
