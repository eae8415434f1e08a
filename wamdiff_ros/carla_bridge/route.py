"""The leaderboard route -> the planner's navigation command (stdlib only, Python 3.7 syntax).

A route is the leaderboard's global plan: points with a ``RoadOption`` each (the maneuver of the road piece the point
lies on: the points inside a junction carry LEFT / RIGHT / STRAIGHT, the others LANEFOLLOW or a lane change). The
command is the first junction option found from ``hold_m`` behind the ego's progress along the route to
``lookahead_m`` ahead of it, ``follow`` otherwise; lane changes are ``follow``. The defaults match the closed-loop
world's command (given from 60 m before a junction until about 10 m after it, ``wamdiff_ros.world.route``), so the
model sees commands as it did in the world's data.
"""

from __future__ import annotations

import bisect
import enum
import math
from typing import Any, List, Optional, Sequence, Tuple  # noqa: F401  (type comments)

from wamdiff_ros.errors import FieldError


class RoadOption(enum.IntEnum):
    """CARLA's ``agents.navigation.local_planner.RoadOption`` values."""

    VOID = -1
    LEFT = 1
    RIGHT = 2
    STRAIGHT = 3
    LANEFOLLOW = 4
    CHANGELANELEFT = 5
    CHANGELANERIGHT = 6


JUNCTION_COMMANDS = {RoadOption.LEFT: "left", RoadOption.RIGHT: "right", RoadOption.STRAIGHT: "straight"}
FOLLOW = "follow"


def road_option(value: Any) -> RoadOption:
    """An int, CARLA's RoadOption enum (its ``.value``) or a name ("LEFT", "RoadOption.LEFT") -> ``RoadOption``."""
    raw = getattr(value, "value", value)
    if isinstance(raw, str):
        name = raw.rsplit(".", 1)[-1].strip().upper()
        if name in RoadOption.__members__:
            return RoadOption[name]
        try:
            raw = int(name)
        except ValueError:
            raise FieldError("road_option", "unknown road option %r" % (value,)) from None
    try:
        return RoadOption(int(raw))
    except (TypeError, ValueError):
        raise FieldError("road_option", "unknown road option %r" % (value,)) from None


def command_for(option: Any) -> str:
    return JUNCTION_COMMANDS.get(road_option(option), FOLLOW)


class RouteCommands(object):
    """Progress along the route and the command at it. Progress only moves forward and is searched within
    ``search_m`` of the current point, so a route that passes the same place twice is followed in order."""

    def __init__(self, points: Sequence[Tuple[float, float]], options: Sequence[Any], lookahead_m: float = 60.0,
                 hold_m: float = 10.0, search_m: float = 50.0) -> None:
        if len(points) != len(options):
            raise FieldError("route", "%d points but %d road options" % (len(points), len(options)))
        self.points = [(float(x), float(y)) for x, y in points]
        self.options = [road_option(o) for o in options]
        self.lookahead_m, self.hold_m, self.search_m = float(lookahead_m), float(hold_m), float(search_m)
        self.arc = [0.0]  # type: List[float]
        for (x0, y0), (x1, y1) in zip(self.points, self.points[1:]):
            self.arc.append(self.arc[-1] + math.hypot(x1 - x0, y1 - y0))
        self._segment = 0
        self.progress_m = 0.0
        self.distance_m = 0.0  # from the route, at the last update

    def __len__(self) -> int:
        return len(self.points)

    def update(self, x: float, y: float) -> str:
        """Advance the progress to the ego at (x, y) (our world frame) and return the command there."""
        if not self.points:
            return FOLLOW
        if len(self.points) > 1:
            self._advance(x, y)
        else:
            self.distance_m = math.hypot(x - self.points[0][0], y - self.points[0][1])
        return self.command()

    def command(self) -> str:
        hi = self.progress_m + self.lookahead_m
        i = bisect.bisect_left(self.arc, self.progress_m - self.hold_m)
        while i < len(self.arc) and self.arc[i] <= hi:
            if self.options[i] in JUNCTION_COMMANDS:
                return JUNCTION_COMMANDS[self.options[i]]
            i += 1
        return FOLLOW

    def next_option(self) -> Optional[RoadOption]:
        """The option of the first route point ahead of the progress (None past the end)."""
        i = bisect.bisect_left(self.arc, self.progress_m)
        return self.options[i] if i < len(self.options) else None

    def _advance(self, x: float, y: float) -> None:
        best = None  # type: Optional[Tuple[float, int, float]]
        i = self._segment
        while i < len(self.points) - 1 and self.arc[i] <= self.arc[self._segment] + self.search_m:
            (x0, y0), (x1, y1) = self.points[i], self.points[i + 1]
            dx, dy = x1 - x0, y1 - y0
            length2 = dx * dx + dy * dy
            u = 0.0 if length2 == 0.0 else min(max(((x - x0) * dx + (y - y0) * dy) / length2, 0.0), 1.0)
            d = math.hypot(x0 + u * dx - x, y0 + u * dy - y)
            if best is None or d < best[0]:
                best = (d, i, u)
            i += 1
        if best is None:
            return
        d, i, u = best
        progress = self.arc[i] + u * (self.arc[i + 1] - self.arc[i])
        if progress >= self.progress_m:
            self._segment, self.progress_m = i, progress
        self.distance_m = d

    def points_between(self, start_m: float, end_m: float) -> List[Tuple[float, float]]:
        """The route's points whose progress lies in [``start_m``, ``end_m``] (clamped to the route), with the route
        interpolated at both ends, so the slice covers the range exactly; [] for an empty route or range."""
        if not self.points:
            return []
        if len(self.points) == 1:
            return list(self.points)
        start = min(max(float(start_m), 0.0), self.arc[-1])
        end = min(max(float(end_m), 0.0), self.arc[-1])
        if end < start:
            return []
        out = [self._at(start)]
        i = bisect.bisect_right(self.arc, start)
        while i < len(self.arc) and self.arc[i] < end:
            out.append(self.points[i])
            i += 1
        if end > start:
            out.append(self._at(end))
        return out

    def points_around(self, behind_m: float = 5.0, ahead_m: float = 45.0,
                      max_points: int = 100) -> List[Tuple[float, float]]:
        """The route from ``behind_m`` behind the progress to ``ahead_m`` ahead of it (``points_between``), at most
        ``max_points`` (>= 2) of them: evenly subsampled, first and last kept."""
        return subsample(self.points_between(self.progress_m - behind_m, self.progress_m + ahead_m), max_points)

    def _at(self, s: float) -> Tuple[float, float]:
        """The route's point at progress ``s`` (within [0, arc[-1]]), interpolated."""
        i = min(max(bisect.bisect_right(self.arc, s) - 1, 0), len(self.points) - 2)
        length = self.arc[i + 1] - self.arc[i]
        u = 0.0 if length <= 0.0 else min(max((s - self.arc[i]) / length, 0.0), 1.0)
        (x0, y0), (x1, y1) = self.points[i], self.points[i + 1]
        return x0 + u * (x1 - x0), y0 + u * (y1 - y0)


def subsample(points: Sequence[Tuple[float, float]], max_points: int) -> List[Tuple[float, float]]:
    """At most ``max_points`` (>= 2) of ``points``, evenly spaced by index, the first and the last kept."""
    if max_points < 2:
        raise FieldError("max_points", "must be >= 2, got %r" % (max_points,))
    n = len(points)
    if n <= max_points:
        return list(points)
    return [points[int(round(k * (n - 1) / float(max_points - 1)))] for k in range(max_points)]


def to_ego_frame(points: Sequence[Tuple[float, float]],
                 pose: Sequence[float]) -> List[List[float]]:
    """``points`` (world frame, right-handed) in the ego frame of ``pose`` (x, y, heading: radians, counter-clockwise
    from the world's x axis): x forward, y left, as [x, y] lists (a plan request's ``route_xy``)."""
    x0, y0, heading = float(pose[0]), float(pose[1]), float(pose[2])
    c, s = math.cos(heading), math.sin(heading)
    return [[c * (x - x0) + s * (y - y0), -s * (x - x0) + c * (y - y0)] for x, y in points]
