"""The agent's pose in our world frame from GNSS, compass and speedometer (stdlib only, Python 3.7 syntax).

The leaderboard's GNSS has 0.000005 deg of noise per axis (about 0.5 m): used raw, the server's ego-motion
compensation would move the plan by that much every frame. So the position is dead-reckoned from the speedometer and
the compass and pulled toward the GNSS fix by ``gnss_gain`` per step (a first-order filter: with 0.05 at 20 Hz the
time constant is 1 s and the 0.5 m noise shrinks to about 0.1 m). The first fix is taken as is, and so is a
teleport (a new route): ``snap_after`` fixes in a row further than ``snap_m`` away that agree with one another (within
``snap_m`` / 2 of their mean). A lone fix that far is noise (Bench2Drive-Robust's GPS noise is N(0, 5 m) or
N(0, 15 m) per axis on every fix; snapped to, it threw the pose tens of metres a tick): it pulls like any fix, by at
most ``gnss_gain`` x ``snap_m`` (counted in ``far_fixes``).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from wamdiff_ros.carla_bridge.frames import wrap_angle


class PoseFilter(object):
    def __init__(self, gnss_gain: float = 0.05, snap_m: float = 10.0, max_step_s: float = 0.5,
                 snap_after: int = 3) -> None:
        if not 0.0 < gnss_gain <= 1.0:
            raise ValueError("gnss_gain: must be in (0, 1], got %r" % gnss_gain)
        if snap_after < 1:
            raise ValueError("snap_after: must be >= 1, got %r" % snap_after)
        self.gnss_gain, self.snap_m, self.max_step_s, self.snap_after = gnss_gain, snap_m, max_step_s, snap_after
        self.far_fixes = 0
        self.reset()

    def reset(self) -> None:
        self._pose = None  # type: Optional[Tuple[float, float, float]]
        self._t = None  # type: Optional[float]
        self._far = []  # type: List[Tuple[float, float]]

    @property
    def pose(self) -> Optional[Tuple[float, float, float]]:
        return self._pose

    def update(self, position: Optional[Tuple[float, float]], heading: Optional[float], speed: float,
               t: float) -> Tuple[float, float, float]:
        """``position``: the GNSS fix in our world frame (None or NaN when missing); ``heading``: from the compass
        (None or NaN keeps the last); ``speed``: signed, m/s; ``t``: sim time, s."""
        fix = position if position is not None and all(math.isfinite(v) for v in position) else None
        if heading is None or not math.isfinite(heading):
            heading = self._pose[2] if self._pose is not None else 0.0
        speed = speed if math.isfinite(speed) else 0.0
        if self._pose is None or self._t is None:
            x, y = fix if fix is not None else (0.0, 0.0)
        else:
            dt = t - self._t
            dt = dt if 0.0 < dt <= self.max_step_s else 0.0
            mid = self._pose[2] + 0.5 * wrap_angle(heading - self._pose[2])
            x = self._pose[0] + speed * dt * math.cos(mid)
            y = self._pose[1] + speed * dt * math.sin(mid)
            if fix is not None:
                distance = math.hypot(fix[0] - x, fix[1] - y)
                if distance > self.snap_m:
                    self.far_fixes += 1
                    self._far = (self._far + [fix])[-self.snap_after:]
                if distance > self.snap_m and self._agree():
                    (x, y), self._far = fix, []
                else:
                    if distance <= self.snap_m:
                        self._far = []
                    pull = self.gnss_gain * min(1.0, self.snap_m / distance) if distance > 0 else 0.0
                    x += pull * (fix[0] - x)
                    y += pull * (fix[1] - y)
        self._pose, self._t = (float(x), float(y), wrap_angle(heading)), float(t)
        return self._pose

    def _agree(self) -> bool:
        """The last ``snap_after`` fixes were all far and lie within ``snap_m`` / 2 of their mean: a teleport."""
        if len(self._far) < self.snap_after:
            return False
        mx = sum(p[0] for p in self._far) / len(self._far)
        my = sum(p[1] for p in self._far) / len(self._far)
        return all(math.hypot(p[0] - mx, p[1] - my) <= 0.5 * self.snap_m for p in self._far)
