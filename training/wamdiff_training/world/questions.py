"""Questions about the scene answered exactly from the world's privileged state: the ``ask`` task of the dataset.

A small fixed set of templates (``QUESTIONS``); answers are short sentences, distances rounded to 1 m. Definitions:
- **lanes** are the lanes of the ego's current road segment (all run in its direction), counted from the left;
- the **lead vehicle** is the nearest road user ahead whose centre lies within ``LANE_HALF_WIDTH_M`` of the ego's lane
  corridor (its current lane, continued along the route) within ``LEAD_RANGE_M``, driving along it (heading within
  45 deg; a static obstacle always counts); its distance is the bumper-to-bumper gap along the corridor;
- a **lane change** to a side is free when that lane exists and every road user in it keeps a bumper gap to the
  ego of at least ``MIN_GAP_M + HEADWAY_S * v_follower + CLOSING_S * max(0, v_follower - v_leader)``, where the
  follower is the ego for a vehicle ahead and the other vehicle for one behind. Only the gap counts, not the
  lane markings.

Works in highway-env coordinates (the world's privileged view), where a positive lateral lane coordinate is on the
right of the driving direction.
"""

from __future__ import annotations

import math
import re

import numpy as np
from highway_env.vehicle.objects import Obstacle

from wamdiff_ros import format as fmt
from wamdiff_ros.world.sim import World

LEAD_RANGE_M = 100.0
LANE_HALF_WIDTH_M = 2.0
CORRIDOR_STEP_M = 1.0
MIN_GAP_M = 5.0
HEADWAY_S = 1.0
CLOSING_S = 2.0
_ALIGNED = math.cos(math.radians(45.0))

QUESTIONS: dict[str, str] = {
    "lead": "How far ahead is the vehicle in front of us in our lane?",
    "lane": "Which lane are we driving in?",
    "left_free": "Is a lane change to the left free now?",
    "right_free": "Is a lane change to the right free now?",
    "command": "What does the navigation command require?",
}
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


def _metres(value: float) -> int:
    return int(math.floor(value + 0.5))  # half up, not Python's half-to-even


def _others(world: World) -> list:
    return [*world.road.vehicles[1:], *world.road.objects]


def lanes_from_left(world: World) -> tuple[list[int], int]:
    """The lane ids of the ego's road segment ordered from the left, and the position of the ego's lane in it."""
    a, b, lane_id = world.ego.lane_index
    lanes = world.road.network.graph[a][b]
    lateral = [float(lane.local_coordinates(world.ego.position)[1]) for lane in lanes]
    order = sorted(range(len(lanes)), key=lambda i: -lateral[i])  # the ego is furthest right of the leftmost lane
    return order, order.index(lane_id)


def _corridor(world: World, length_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Points (N, 2) every CORRIDOR_STEP_M along the ego's lane, continued along the route, from the ego on, and the
    lane heading at each."""
    net, ego, segments = world.road.network, world.ego, world.route.segments
    lanes = [net.get_lane(ego.lane_index)]
    if ego.lane_index[:2] in segments:
        for a, b in segments[segments.index(ego.lane_index[:2]) + 1:]:
            end = lanes[-1].position(lanes[-1].length, 0.0)
            lanes.append(min(net.graph[a][b], key=lambda ln: np.linalg.norm(ln.position(0.0, 0.0) - end)))
    s = float(lanes[0].local_coordinates(ego.position)[0])
    points, headings, i, d = [], [], 0, 0.0
    while d <= length_m:
        while s > lanes[i].length and i + 1 < len(lanes):
            s -= lanes[i].length
            i += 1
        if s > lanes[i].length:
            break
        points.append(lanes[i].position(s, 0.0))
        headings.append(lanes[i].heading_at(s))
        s, d = s + CORRIDOR_STEP_M, d + CORRIDOR_STEP_M
    return np.asarray(points).reshape(-1, 2), np.asarray(headings)


def lead_gap(world: World, range_m: float = LEAD_RANGE_M) -> float | None:
    """Bumper gap (m) to the lead vehicle in the ego's lane, or None when there is none within ``range_m``."""
    ego = world.ego
    points, headings = _corridor(world, range_m + ego.LENGTH)
    if len(points) < 2:
        return None
    best = None
    for v in _others(world):
        if np.linalg.norm(v.position - ego.position) > range_m + 2 * ego.LENGTH + v.LENGTH:
            continue
        dist = np.linalg.norm(points - v.position, axis=1)
        j = int(np.argmin(dist))
        tangent = np.array([math.cos(headings[j]), math.sin(headings[j])])
        rel = v.position - points[j]
        lateral = abs(rel[0] * tangent[1] - rel[1] * tangent[0])
        static = isinstance(v, Obstacle)
        aligned = math.cos(v.heading - headings[j]) >= _ALIGNED
        along = j * CORRIDOR_STEP_M + float(rel @ tangent)
        if lateral > LANE_HALF_WIDTH_M or not (aligned or static) or along <= 0.0:
            continue
        gap = max(0.0, along - (ego.LENGTH + v.LENGTH) / 2)
        if gap <= range_m and (best is None or gap < best):
            best = gap
    return best


def lane_change_blocker(world: World, side: str) -> tuple[bool, float | None]:
    """(lane exists, signed bumper gap of the nearest road user that makes the change unsafe: + ahead, - behind,
    0 alongside; None when the change is free)."""
    order, pos = lanes_from_left(world)
    target_pos = pos - 1 if side == "left" else pos + 1
    if not 0 <= target_pos < len(order):
        return False, None
    a, b, _ = world.ego.lane_index
    target = world.road.network.graph[a][b][order[target_pos]]
    ego = world.ego
    s_ego = float(target.local_coordinates(ego.position)[0])
    blocker = None
    for v in _others(world):
        s, r = target.local_coordinates(v.position)
        if abs(r) > target.width_at(s) / 2:
            continue
        d = float(s) - s_ego
        gap = max(0.0, abs(d) - (ego.LENGTH + v.LENGTH) / 2)
        follower, leader = (ego.speed, v.speed) if d >= 0 else (v.speed, ego.speed)
        needed = MIN_GAP_M + HEADWAY_S * max(follower, 0.0) + CLOSING_S * max(0.0, follower - leader)
        if gap < needed and (blocker is None or gap < abs(blocker)):
            blocker = math.copysign(gap, d) if gap > 0 else 0.0
    return True, blocker


LEAD_AT = "The vehicle ahead in our lane is {} m away."
NO_LEAD = "There is no vehicle ahead in our lane within {:.0f} m."
_LEAD_READ = re.compile("|".join((re.escape(LEAD_AT).replace(r"\{\}", r"(?P<gap>\d+)"),
                                  re.escape(NO_LEAD).replace(r"\{:\.0f\}", r"(?P<range>\d+)"))))


def lead_answer(gap_m: float | None) -> str:
    """The lead-vehicle answer for a bumper gap (m), or for none within ``LEAD_RANGE_M``."""
    return NO_LEAD.format(LEAD_RANGE_M) if gap_m is None else LEAD_AT.format(_metres(gap_m))


def read_lead_answer(text: str) -> float | None:
    """The distance a lead-vehicle answer states (m); "none within R m" reads as R; None when it states neither."""
    m = _LEAD_READ.search(text)
    return None if m is None else float(m["gap"] or m["range"])


def _lead_answer(world: World) -> str:
    return lead_answer(lead_gap(world))


def _lane_answer(world: World) -> str:
    order, pos = lanes_from_left(world)
    return f"Lane {pos + 1} of {len(order)}, counted from the left."


def _lane_change_answer(world: World, side: str) -> str:
    exists, blocker = lane_change_blocker(world, side)
    if not exists:
        return f"No, there is no lane to the {side}."
    if blocker is None:
        return f"Yes, the lane to the {side} is free."
    if _metres(abs(blocker)) == 0:
        return f"No, a vehicle is beside us in the lane to the {side}."
    where = "ahead" if blocker > 0 else "behind"
    return f"No, a vehicle in the lane to the {side} is {_metres(abs(blocker))} m {where}."


def exit_number(world: World) -> int:
    """Roundabouts: the route's exit counted from the entry (each ring node with a branch off it is an exit)."""
    graph = world.road.network.graph
    ring = [b for a, b in world.route.segments[1:] if len(graph.get(b, {})) > 1]
    return max(len(ring), 1)


def command_answer(world: World) -> str:
    command, kind = world.command, world.spec.kind
    if command == fmt.Command.FOLLOW:
        return "Follow the lane."
    if kind == "roundabout":
        n = exit_number(world)
        ordinal = _ORDINALS[n - 1] if n <= len(_ORDINALS) else f"{n}th"
        what = {fmt.Command.LEFT: "turn left at", fmt.Command.RIGHT: "turn right at",
                fmt.Command.STRAIGHT: "go straight through"}[command]
        return f"Take the {ordinal} exit: {what} the roundabout."
    if kind == "intersection":
        return {fmt.Command.LEFT: "Turn left at the intersection.",
                fmt.Command.RIGHT: "Turn right at the intersection.",
                fmt.Command.STRAIGHT: "Go straight across the intersection."}[command]
    return {fmt.Command.LEFT: "Turn left.", fmt.Command.RIGHT: "Turn right.",
            fmt.Command.STRAIGHT: "Go straight."}[command]


def applicable(world: World) -> list[str]:
    """The question keys that make sense now: lane changes only on a road segment with more than one lane."""
    multi_lane = len(lanes_from_left(world)[0]) > 1
    return [k for k in QUESTIONS if multi_lane or k not in ("left_free", "right_free")]


def answer(world: World, key: str) -> str:
    if key == "lead":
        return _lead_answer(world)
    if key == "lane":
        return _lane_answer(world)
    if key in ("left_free", "right_free"):
        return _lane_change_answer(world, key.split("_")[0])
    if key == "command":
        return command_answer(world)
    raise KeyError(f"unknown question {key!r}; known: {', '.join(QUESTIONS)}")


def ask(world: World, rng: np.random.Generator, count: int) -> list[tuple[str, str, str]]:
    """``count`` distinct applicable questions drawn with ``rng``, as (key, question, answer), in template order."""
    keys = applicable(world)
    picked = sorted(rng.choice(len(keys), size=min(count, len(keys)), replace=False)) if count > 0 else []
    return [(keys[i], QUESTIONS[keys[i]], answer(world, keys[i])) for i in picked]
