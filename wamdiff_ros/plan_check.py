"""The plan checker: could a car follow this plan? Waypoints + the ego's motion (+ route points) -> per-waypoint
violations, each with its reason. No ROS, no torch: the planner's reflection (``decoding/reflect.py``), the node's
diagnostics and the evaluators share it.

Waypoints are the format's: ego frame at the current pose (x forward, y left), one every ``fmt.WAYPOINT_DT_S`` s.
A violation belongs to the *later* waypoint of the steps it is computed from, so waypoint i's violations depend only
on the ego and waypoints 0..i: checking "earliest first" then repairs a plan front to back, and a repaired waypoint
can be judged before what follows it is known.

Kinds (``Limits`` holds each limit with its reason):
- ``back``: x goes backwards by more than ``back_tolerance_m`` while the car moves forward (the ego, or the step
  into the waypoint before, faster than ``moving_mps``); a car on a lane does not reverse. Jitter at standstill
  (0.00, 0.01, -0.02) is not a violation.
- ``speed``: a step implies a speed above ``max_speed_mps``.
- ``accel`` / ``decel``: the change of speed between two steps (the first against the ego's current speed) above the
  vehicle's limits.
- ``lateral``: lateral acceleration v²·κ above ``max_lateral_mps2``, or curvature above ``max_curvature`` (the
  turning circle), from three consecutive points (the ego's position first) whose steps are long enough to measure
  a heading.
- ``route`` (only with route points and ``max_route_offset_m`` set): the waypoint lies further than that from the
  route line (the two route points, extended).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wamdiff_ros import format as fmt

KINDS = ("back", "speed", "accel", "decel", "lateral", "route")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a plan may ask of the car, each limit with its reason. A plan is a target the follower tracks within the
    actuators' limits, not the motion itself: the CPU world's expert plans ask for more than a car does (a give-way
    plan stops within one step), and the model imitates them. So every limit sits above the most any expert plan asks
    (1,088 expert frames, 6 seeds per scenario, measured once with a scratch rollout: accel 20.3 m/s², decel 25.2,
    lateral 15.7 m/s², curvature 0.16 1/m, speed 28.0 m/s; ``test_plan_check.py`` re-checks a cut episode of each) and below what one wrong digit makes: a tens digit of x
    off by one is a 10 m jump, 20 m/s in one step, 40 m/s²; a sideways bin off by one is a 10 m step aside."""

    back_tolerance_m: float = 0.5  # x may dither this much: the expert's own plans step back at most 0.11 m
    moving_mps: float = 1.0  # "moving forward": above walking pace; below it a stopped car's plan may jitter
    max_speed_mps: float = 40.0  # 144 km/h: above every speed limit of the CPU world (28 m/s) and Bench2Drive's towns
    max_accel_mps2: float = 25.0  # a real car manages ≈ 6 (0-100 km/h in 4.6 s); expert plans ask up to 20.3
    max_decel_mps2: float = 30.0  # braking is ≈ 0.8-1 g (8-10 m/s²); expert plans that stop in a step ask up to 25.2
    max_lateral_mps2: float = 20.0  # tyres hold ≈ 0.8 g; expert plans in the roundabout ask up to 15.7 (v²·κ)
    max_curvature: float = 0.25  # 1/m: a 4 m radius, tighter than a passenger car's lock (≈ 5 m); expert max 0.16
    min_turn_step_m: float = 1.0  # shorter steps give no measurable heading: curvature is not judged on them
    max_route_offset_m: float | None = None  # off by default: two route points give a straight line, not the lane

    def __post_init__(self) -> None:
        for name in ("back_tolerance_m", "moving_mps", "max_speed_mps", "max_accel_mps2", "max_decel_mps2",
                     "max_lateral_mps2", "max_curvature", "min_turn_step_m"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.max_route_offset_m is not None and not self.max_route_offset_m > 0:
            raise ValueError(f"Limits.max_route_offset_m must be positive or None, got {self.max_route_offset_m!r}")


@dataclass(frozen=True, slots=True)
class Violation:
    waypoint: int  # 0-based
    kind: str  # one of KINDS
    value: float  # what was measured (m, m/s, m/s², 1/m)
    limit: float
    reason: str  # e.g. "waypoint 5: x 4.80 m is 6.30 m behind waypoint 4 while moving forward (tolerance 0.5 m)"


def _route_distance(x: float, y: float, route: np.ndarray) -> float:
    (ax, ay), (bx, by) = (float(v) for v in route[0]), (float(v) for v in route[1])
    dx, dy = bx - ax, by - ay
    length = math.hypot(dx, dy)
    if length < 1e-6:
        return math.hypot(x - ax, y - ay)
    return abs(dx * (y - ay) - dy * (x - ax)) / length


def check_plan(waypoints: np.ndarray, velocity: Sequence[float] = (0.0, 0.0), route: np.ndarray | None = None,
               limits: Limits = Limits(), upto: int | None = None) -> list[Violation]:
    """Every violation of ``waypoints`` ((8, 2) ego frame) for an ego moving at ``velocity`` (m/s, ego frame), in
    waypoint order; ``upto``: only waypoints 0..upto (the later ones are not looked at). Plain Python on 8 points:
    reflection's search calls it for every candidate it tries."""
    flat = np.asarray(waypoints, dtype=np.float64).reshape(-1).tolist()
    n = len(flat) // 2 if upto is None else min(len(flat) // 2, upto + 1)
    dt = fmt.WAYPOINT_DT_S
    ego_speed = math.hypot(float(velocity[0]), float(velocity[1]))
    ego_forward = float(velocity[0]) > limits.moving_mps
    out: list[Violation] = []
    px, py, best_x, prev_speed, prev_length = 0.0, 0.0, 0.0, ego_speed, 0.0
    ppx = ppy = 0.0  # the point before the previous one
    for i in range(n):
        label = f"waypoint {i + 1}"
        x, y = flat[2 * i], flat[2 * i + 1]
        length = math.hypot(x - px, y - py)
        speed = length / dt
        moving = ego_forward or (i > 0 and prev_speed > limits.moving_mps)
        if moving and x < best_x - limits.back_tolerance_m:
            out.append(Violation(i, "back", best_x - x, limits.back_tolerance_m,
                                 f"{label}: x {x:.2f} m is {best_x - x:.2f} m behind an earlier point while moving "
                                 f"forward (tolerance {limits.back_tolerance_m:g} m)"))
        best_x = max(best_x, x)
        if speed > limits.max_speed_mps:
            out.append(Violation(i, "speed", speed, limits.max_speed_mps,
                                 f"{label}: {speed:.1f} m/s from the point before (limit {limits.max_speed_mps:g} m/s)"))
        change = (speed - prev_speed) / dt
        if change > limits.max_accel_mps2:
            out.append(Violation(i, "accel", change, limits.max_accel_mps2,
                                 f"{label}: speeds up {prev_speed:.1f} -> {speed:.1f} m/s in {dt:g} s "
                                 f"({change:.1f} m/s², limit {limits.max_accel_mps2:g})"))
        elif -change > limits.max_decel_mps2:
            out.append(Violation(i, "decel", -change, limits.max_decel_mps2,
                                 f"{label}: slows {prev_speed:.1f} -> {speed:.1f} m/s in {dt:g} s "
                                 f"({-change:.1f} m/s², limit {limits.max_decel_mps2:g})"))
        if i >= 1 and prev_length >= limits.min_turn_step_m and length >= limits.min_turn_step_m:
            cross = (px - ppx) * (y - ppy) - (py - ppy) * (x - ppx)
            chord = math.hypot(x - ppx, y - ppy)
            curvature = 2.0 * abs(cross) / max(prev_length * length * chord, 1e-9)  # Menger curvature
            v = 0.5 * (prev_speed + speed)
            if curvature > limits.max_curvature:
                out.append(Violation(i, "lateral", curvature, limits.max_curvature,
                                     f"{label}: turns on a {1 / curvature:.1f} m radius (tightest "
                                     f"{1 / limits.max_curvature:g} m)"))
            elif v * v * curvature > limits.max_lateral_mps2:
                out.append(Violation(i, "lateral", v * v * curvature, limits.max_lateral_mps2,
                                     f"{label}: {v * v * curvature:.1f} m/s² sideways at {v:.1f} m/s (limit "
                                     f"{limits.max_lateral_mps2:g})"))
        if route is not None and limits.max_route_offset_m is not None:
            off = _route_distance(x, y, np.asarray(route, dtype=np.float64))
            if off > limits.max_route_offset_m:
                out.append(Violation(i, "route", off, limits.max_route_offset_m,
                                     f"{label}: {off:.1f} m from the route line (limit "
                                     f"{limits.max_route_offset_m:g} m)"))
        ppx, ppy, px, py, prev_speed, prev_length = px, py, x, y, speed, length
    return out


def failing_waypoints(violations: Sequence[Violation]) -> list[int]:
    """The waypoints with a violation, earliest first."""
    return sorted({v.waypoint for v in violations})


def summary(violations: Sequence[Violation]) -> str:
    """One line for a log or a plan's reason: the first violation and how many more."""
    if not violations:
        return ""
    more = len(violations) - 1
    return "implausible: " + violations[0].reason + (f" (+{more} more)" if more else "")


def steps_back(waypoints: np.ndarray, tolerance_m: float = 0.5) -> bool:
    """Whether some waypoint's x lies more than ``tolerance_m`` behind the one before it (the evaluators' count, as
    the issue measures it; no ego speed condition)."""
    x = np.asarray(waypoints, dtype=np.float64).reshape(-1, 2)[:, 0]
    return bool((np.diff(x) < -tolerance_m).any())


class AnswerCheck:
    """The checker on an answer's tokens, for the decoder's reflection (``decoding/reflect.py``'s ``PlanCheck``):
    ``text_of(token_id)`` gives a token's text; tokens from ``eos_id`` on are ignored. An answer that does not parse
    has no failing waypoint here (the grammar makes plans parse; an unparsed one is invalid anyway)."""

    num_waypoints = fmt.NUM_WAYPOINTS

    def __init__(self, text_of, eos_id: int, velocity: Sequence[float], route: np.ndarray | None = None,
                 limits: Limits = Limits()) -> None:
        self._text_of, self._eos = text_of, eos_id
        self.velocity, self.route, self.limits = tuple(float(v) for v in velocity), route, limits

    def _cut(self, tokens: Sequence[int]) -> list[int]:
        tokens = list(tokens)
        return tokens[:tokens.index(self._eos)] if self._eos in tokens else tokens

    def waypoints(self, tokens: Sequence[int]) -> np.ndarray | None:
        parsed = fmt.parse_waypoints("".join(map(self._text_of, self._cut(tokens))))
        return parsed.waypoints if parsed.valid else None

    def violations(self, tokens: Sequence[int], upto: int | None = None) -> list[Violation]:
        wp = self.waypoints(tokens)
        return [] if wp is None else check_plan(wp, self.velocity, self.route, self.limits, upto)

    def failing(self, tokens: Sequence[int]) -> list[int]:
        return failing_waypoints(self.violations(tokens))

    def passes(self, tokens: Sequence[int], waypoint: int) -> bool:
        wp = self.waypoints(tokens)
        return wp is not None and not any(v.waypoint == waypoint
                                          for v in check_plan(wp, self.velocity, self.route, self.limits, waypoint))

    def span(self, tokens: Sequence[int], waypoint: int) -> list[int]:
        """The positions of the tokens that write waypoint ``waypoint``'s two numbers (not the commas)."""
        return [p for p, _ in self._span(tokens, waypoint)]

    def ranks(self, tokens: Sequence[int], waypoint: int) -> list[int]:
        """``span``'s significance: where in its number each token's first character stands (0: the first, x's
        hundreds or sign, y's sideways bin in the fixed width)."""
        return [r for _, r in self._span(tokens, waypoint)]

    def _span(self, tokens: Sequence[int], waypoint: int) -> list[tuple[int, int]]:
        out, number, place = [], 0, 0
        for position, token in enumerate(self._cut(tokens)):
            rank = None
            for ch in self._text_of(token):
                if ch == ",":
                    number, place = number + 1, 0
                    continue
                if number // 2 == waypoint and rank is None:
                    rank = place
                place += 1
            if rank is not None:
                out.append((position, rank))
        return out
