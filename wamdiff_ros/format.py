"""The one home of the text format: prompts, answer grammar, and a parser that never raises.

Frame convention (stated once, used everywhere): waypoints are in the ego frame at the current pose,
x forward, y left, metres, one every 0.5 s for 4 s (8 points), written with 2 decimals.
Waypoint answers come in two formats (``FORMAT_VERSIONS``; a checkpoint's ``format_version`` says which it writes).
Version 1 is WAM-Diff2's free width (``2.26,-0.17``). Version 3, what this package exports and trains, gives every
position of the answer one role, which a block of [MASK] tokens decoded in any order needs: x has 3 integer places,
zero-padded, a minus sign taking the first (``002.26``, range -99.99..999.99); y is a sideways bin and a residual in
the same width, one letter ``a``..``i`` for the bin ``round(y / 10 m)`` (-4..4, ``e`` = 0), then the residual + 5 m
with 2 integer places (``d01.83`` = -10 + 1.83 - 5 = -13.17 m; range -45..45 m).
Prompts are the same in every version; the optional route line writes its numbers in version 3's x width.
Boxes are written on a 0-1000 image grid (x right, y down) as ``label:x1,y1,x2,y2`` items joined by ``;``.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = 3  # what this package writes
FORMAT_VERSIONS = (1, 3)  # what it reads and decodes
NUM_WAYPOINTS = 8
WAYPOINT_DT_S = 0.5
WAYPOINT_DECIMALS = 2
MAX_INT_DIGITS = 3  # |coordinate| < 1000 m
LATERAL_BIN_M = 10.0  # the width of a sideways bin
LATERAL_BINS = "abcdefghi"  # bins -4..4 (e = 0), one letter each
BOX_GRID = 1000
NO_BOXES = "none"

IMAGE_PLACEHOLDER = "<image>"
CHAT_USER = "<|im_start|>user\n"
CHAT_END = "<|im_end|>"
CHAT_ASSISTANT = "<|im_start|>assistant\n"


class Task(str, enum.Enum):
    PLAN = "plan"
    DETECT = "detect"
    ASK = "ask"


class Command(str, enum.Enum):
    LEFT = "left"
    RIGHT = "right"
    STRAIGHT = "straight"
    FOLLOW = "follow"

    @property
    def phrase(self) -> str:
        return _COMMAND_PHRASES[self]


_COMMAND_PHRASES = {
    Command.LEFT: "left",
    Command.RIGHT: "right",
    Command.STRAIGHT: "straight",
    Command.FOLLOW: "lane follow",
}

_IMAGE_INTRO = f"Here is a front-view images from a driving vehicle: {IMAGE_PLACEHOLDER}\n"
_PLAN_INSTRUCTION = (
    "Instruction: Based on the visual motion cues from the image (such as the relative speed of other vehicles and "
    "the changing distance to the intersection) and the provided telemetry, "
    "predict the optimal driving action for the next 4 seconds with 8 new waypoints."
)
_DETECT_INSTRUCTION = (
    "Instruction: Detect every vehicle in the image. Answer with label:x1,y1,x2,y2 boxes on a 0-1000 grid "
    f"joined by ';', or '{NO_BOXES}'."
)


def _pair(a: float, b: float) -> str:
    return f"({_num(a)},{_num(b)})"


def _num(v: float) -> str:
    text = f"{float(v):.{WAYPOINT_DECIMALS}f}"
    return "0.00" if text == "-0.00" else text


ROUTE_AHEAD_M = (10.0, 30.0)  # where along the route the route points lie (metres ahead of the ego)
_ROUTE_LINE = "The route passes "


def route_line(points: np.ndarray) -> str:
    """The optional route line of the plan prompt: the route lane's centre ``ROUTE_AHEAD_M`` ahead along the route,
    ego frame, e.g. ``The route passes (010.00,-00.77) and (029.24,-04.17)``."""
    arr = np.asarray(points, dtype=np.float64)
    if arr.shape != (len(ROUTE_AHEAD_M), 2) or not np.isfinite(arr).all():
        raise ValueError(f"route points: expected {len(ROUTE_AHEAD_M)} finite (x, y) pairs, got {arr.tolist()!r}")
    arr = np.clip(arr, *_FIXED_RANGE)
    return _ROUTE_LINE + " and ".join(f"({_fixed(x)},{_fixed(y)})" for x, y in arr)


def has_route_line(prompt: str) -> bool:
    return _ROUTE_LINE in prompt


_ROUTE_POINTS = re.compile(re.escape(_ROUTE_LINE) + " and ".join([r"\((-?[\d.]+),(-?[\d.]+)\)"] * len(ROUTE_AHEAD_M)))


def parse_route_line(prompt: str) -> np.ndarray | None:
    """The route points a plan prompt's route line carries (``route_line``'s inverse), (len(ROUTE_AHEAD_M), 2) ego
    frame; None when the prompt has no route line (the paper's prompt)."""
    m = _ROUTE_POINTS.search(prompt)
    if m is None:
        return None
    return np.array([float(v) for v in m.groups()], dtype=np.float64).reshape(-1, 2)


def plan_prompt(command: Command, velocity: tuple[float, float], acceleration: tuple[float, float],
                route: np.ndarray | None = None) -> str:
    """WAM-Diff2's NAVSIM planning prompt (user turn, before chat wrapping). ``route``: the optional route points
    (``route_line``), written after the navigation command; the paper's prompt has none."""
    return (
        _IMAGE_INTRO
        + f"The navigation information is: {Command(command).phrase}\n"
        + ("" if route is None else route_line(route) + "\n")
        + "The current position is (0.00,0.00)\n"
        + f"The current velocity is: {_pair(*velocity)} and current accelerate is: {_pair(*acceleration)}\n"
        + _PLAN_INSTRUCTION
    )


def detect_prompt() -> str:
    return _IMAGE_INTRO + _DETECT_INSTRUCTION


def ask_prompt(question: str) -> str:
    return _IMAGE_INTRO + f"Question: {question.strip()}"


VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


def chat(user: str, image_tokens: int) -> str:
    """Qwen chat text for one user turn, as WAM-Diff2 renders it: the text around ``<image>`` is stripped and the
    image becomes ``image_tokens`` pad tokens; the assistant's answer follows and ends with ``<|im_end|>``."""
    before, sep, after = user.partition(IMAGE_PLACEHOLDER)
    content = before.strip()
    if sep:
        content += VISION_START + IMAGE_PAD * image_tokens + VISION_END + after.strip()
    return f"{CHAT_USER}{content}{CHAT_END}\n{CHAT_ASSISTANT}"


# ----------------------------------------------------------------------------------------------------------------
# Answers


_FREE_RANGE = (-(10.0**MAX_INT_DIGITS - 0.01), 10.0**MAX_INT_DIGITS - 0.01)
_FIXED_RANGE = (-(10.0 ** (MAX_INT_DIGITS - 1) - 0.01), 10.0**MAX_INT_DIGITS - 0.01)  # a minus sign takes a place


def check_format_version(version: int) -> int:
    if version not in FORMAT_VERSIONS:
        raise ValueError(f"format version {version!r} is not one of {FORMAT_VERSIONS}")
    return version


def waypoint_range(version: int = FORMAT_VERSION) -> tuple[float, float]:
    """The x values a version can write (version 1: also its y); ``format_waypoints`` clips to it (version 3's y:
    ``lateral_range``)."""
    return _FREE_RANGE if check_format_version(version) == 1 else _FIXED_RANGE


def lateral_range() -> tuple[float, float]:
    """The y values version 3 can write: the outer bins' centres plus half a bin."""
    half = len(LATERAL_BINS) // 2
    return -LATERAL_BIN_M * (half + 0.5), LATERAL_BIN_M * (half + 0.5)


def _lateral(v: float) -> str:
    """A y of version 3: bin letter, then the residual + half a bin, ``DD.DD``."""
    half = len(LATERAL_BINS) // 2
    low, high = lateral_range()
    v = min(max(float(v), low), high)
    b = min(max(int(round(v / LATERAL_BIN_M)), -half), half)
    r = min(max(v - LATERAL_BIN_M * b, -LATERAL_BIN_M / 2), LATERAL_BIN_M / 2) + LATERAL_BIN_M / 2
    return LATERAL_BINS[b + half] + f"{r:0{MAX_INT_DIGITS + WAYPOINT_DECIMALS}.{WAYPOINT_DECIMALS}f}"


def _lateral_value(text: str) -> float:
    return LATERAL_BIN_M * (LATERAL_BINS.index(text[0]) - len(LATERAL_BINS) // 2) + float(text[1:]) - LATERAL_BIN_M / 2


def _fixed(v: float) -> str:
    """Fixed width (version 3's x, the route line): 3 integer places, zero-padded; a minus sign takes the first."""
    text = _num(v)
    if text.startswith("-"):
        return "-" + text[1:].rjust(MAX_INT_DIGITS + WAYPOINT_DECIMALS, "0")
    return text.rjust(MAX_INT_DIGITS + 1 + WAYPOINT_DECIMALS, "0")


def format_waypoints(waypoints: np.ndarray, version: int = FORMAT_VERSION) -> str:
    if np.isnan(np.asarray(waypoints, dtype=np.float64)).any():
        raise ValueError("waypoints contain NaN")
    low, high = waypoint_range(version)
    arr = np.clip(np.asarray(waypoints, dtype=np.float64).reshape(NUM_WAYPOINTS, 2), low, high)
    if version == 1:
        return ",".join(_num(v) for v in arr.reshape(-1))
    return ",".join(f"{_fixed(x)},{_lateral(y)}" for x, y in arr)


def waypoint_text_version(text: str) -> int | None:
    """3 when a valid answer writes its y as sideways bins (its x then have the fixed width), 1 when it parses
    otherwise, None when invalid."""
    parsed = parse_waypoints(text)
    if not parsed.valid:
        return None
    return 3 if _LATERAL_NUMBER.match(_strip_answer(text).split(",")[1].strip()) else 1


@dataclass(frozen=True, slots=True)
class Box:
    label: str
    x1: float
    y1: float
    x2: float
    y2: float
    score: float = 1.0


def format_boxes(boxes: list[Box]) -> str:
    if not boxes:
        return NO_BOXES
    return ";".join(
        f"{b.label}:{int(round(b.x1))},{int(round(b.y1))},{int(round(b.x2))},{int(round(b.y2))}" for b in boxes
    )


@dataclass(frozen=True, slots=True)
class WaypointParse:
    waypoints: np.ndarray  # (8, 2) float32, zeros when invalid
    valid: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BoxParse:
    boxes: list[Box] = field(default_factory=list)
    valid: bool = True
    reason: str = ""


_NUMBER = re.compile(r"^-?[0-9]{1,%d}\.[0-9]{%d}$" % (MAX_INT_DIGITS, WAYPOINT_DECIMALS))
_FIXED_NUMBER = re.compile(r"^(?:-[0-9]{%d}|[0-9]{%d})\.[0-9]{%d}$"
                           % (MAX_INT_DIGITS - 1, MAX_INT_DIGITS, WAYPOINT_DECIMALS))
_LATERAL_NUMBER = re.compile(r"^[%s][0-9]{%d}\.[0-9]{%d}$" % (LATERAL_BINS, MAX_INT_DIGITS - 1, WAYPOINT_DECIMALS))
_BOX_ITEM = re.compile(r"^\s*([A-Za-z][\w \-]*)\s*:\s*(-?[0-9]+(?:\.[0-9]+)?)\s*,\s*(-?[0-9]+(?:\.[0-9]+)?)\s*,"
                       r"\s*(-?[0-9]+(?:\.[0-9]+)?)\s*,\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$", re.ASCII)


def _strip_answer(text: str) -> str:
    if not isinstance(text, str):
        return ""
    return text.split(CHAT_END, 1)[0].strip()


def parse_waypoints(text: str) -> WaypointParse:
    """Parse ``x1,y1,...,x8,y8`` in any version (version 3: every y a sideways bin). Never raises; an invalid answer
    carries the reason."""
    zeros = np.zeros((NUM_WAYPOINTS, 2), dtype=np.float32)
    body = _strip_answer(text)
    if not body:
        return WaypointParse(zeros, False, "empty answer")
    parts = [p.strip() for p in body.split(",")]
    if len(parts) != 2 * NUM_WAYPOINTS:
        return WaypointParse(zeros, False, f"expected {2 * NUM_WAYPOINTS} numbers, got {len(parts)}")
    binned = bool(_LATERAL_NUMBER.match(parts[1]))  # version 3: every y a sideways bin, every x fixed width
    for i, part in enumerate(parts):
        if binned and i % 2 == 1:
            if not _LATERAL_NUMBER.match(part):
                return WaypointParse(zeros, False, f"number {i + 1} {part[:20]!r} is not a sideways bin like d01.83")
        elif binned and not _FIXED_NUMBER.match(part):
            return WaypointParse(zeros, False, f"number {i + 1} {part[:20]!r} is not like -12.34 in fixed width")
        elif not _NUMBER.match(part):
            return WaypointParse(zeros, False, f"number {i + 1} {part[:20]!r} is not like -12.34")
    values = np.array([_lateral_value(p) if binned and i % 2 else float(p) for i, p in enumerate(parts)],
                      dtype=np.float32).reshape(NUM_WAYPOINTS, 2)
    return WaypointParse(values, True, "")


def parse_boxes(text: str) -> BoxParse:
    """Parse ``label:x1,y1,x2,y2;...`` on the 0-1000 grid. Never raises."""
    body = _strip_answer(text)
    if body == NO_BOXES:
        return BoxParse([], True, "")
    if not body:
        return BoxParse([], False, "empty answer")
    boxes: list[Box] = []
    for i, item in enumerate(body.split(";")):
        m = _BOX_ITEM.match(item)
        if m is None:
            return BoxParse(boxes, False, f"box {i + 1} {item[:30]!r} is not like car:10,20,30,40")
        x1, y1, x2, y2 = (float(g) for g in m.groups()[1:])
        if not all(math.isfinite(v) and 0 <= v <= BOX_GRID for v in (x1, y1, x2, y2)):
            return BoxParse(boxes, False, f"box {i + 1} leaves the 0-{BOX_GRID} grid")
        if x2 <= x1 or y2 <= y1:
            return BoxParse(boxes, False, f"box {i + 1} has no area")
        boxes.append(Box(m.group(1).strip(), x1, y1, x2, y2))
    return BoxParse(boxes, True, "")


def parse_text(text: str) -> str:
    return _strip_answer(text)


# ----------------------------------------------------------------------------------------------------------------
# Character grammar of the planning answer, for the decoder's vocabulary constraint.
# States: number k in [0, 16) times a position inside the number, then DONE (answer complete, EOS next).
# Inside a number: 0 start, 1 after '-', 2..1+MAX_INT_DIGITS after that many integer digits, then '.', then
# the decimals. Version 3 counts a leading '-' as an integer place (0 -> 2) and allows '.' only after all
# MAX_INT_DIGITS places, so state 1 is unused there, and starts every y (odd k) with a bin letter, which takes the
# first integer place as the minus sign does. The decoder lifts this to tokens; the parser above accepts both versions.

_SUB_START, _SUB_SIGN = 0, 1
_SUB_DOT = 2 + MAX_INT_DIGITS  # states 2 .. 1+MAX_INT_DIGITS count integer digits
_SUB_STATES = _SUB_DOT + 1 + WAYPOINT_DECIMALS
_NUMBERS = 2 * NUM_WAYPOINTS
WAYPOINT_GRAMMAR_STATES = _NUMBERS * _SUB_STATES
WAYPOINT_GRAMMAR_START = 0


def waypoint_grammar_step(state: int, char: str, version: int = FORMAT_VERSION) -> int:
    """Next state after ``char``, or -1 where ``version``'s grammar forbids it."""
    if not 0 <= state < WAYPOINT_GRAMMAR_STATES:
        return -1
    k, sub = divmod(state, _SUB_STATES)
    base = k * _SUB_STATES
    digit = len(char) == 1 and "0" <= char <= "9"
    fixed = check_format_version(version) == 3
    if fixed and k % 2 == 1 and sub == _SUB_START:
        return base + 2 if len(char) == 1 and char in LATERAL_BINS else -1
    if sub == _SUB_START:
        if char == "-":
            return base + (2 if fixed else _SUB_SIGN)
        return base + 2 if digit else -1
    if sub == _SUB_SIGN:
        return base + 2 if digit and not fixed else -1
    if sub < _SUB_DOT:
        if char == ".":
            return base + _SUB_DOT if not fixed or sub == _SUB_DOT - 1 else -1
        return base + sub + 1 if digit and sub + 1 < _SUB_DOT else -1
    if sub < _SUB_STATES - 1:
        return base + sub + 1 if digit else -1
    return base + _SUB_STATES if char == "," and k + 1 < _NUMBERS else -1


def waypoint_grammar_run(state: int, text: str, version: int = FORMAT_VERSION) -> int:
    for ch in text:
        state = waypoint_grammar_step(state, ch, version)
        if state < 0:
            return -1
    return state


def waypoint_grammar_complete(state: int) -> bool:
    """True when all 16 numbers are written: the answer may end (EOS) here."""
    return state == WAYPOINT_GRAMMAR_STATES - 1
