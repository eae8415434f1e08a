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
