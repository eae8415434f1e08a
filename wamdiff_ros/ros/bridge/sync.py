"""The simulator bridges' plain parts, free of rclpy: the ego-pose history that gives a plan its origin, the plan
tracker that keeps the newest plan, and the tick gate (synchronous / free-running stepping on a wall clock).

Plans from the planner node carry waypoints in the ego frame *at the plan's stamp* (the camera image's stamp); the
follower needs that frame's pose in the world, so the bridges keep the ego poses of the last seconds by stamp.
Times are seconds of the simulation clock unless a name says ``wall``; tests drive everything with plain numbers.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wamdiff_ros.control import TrackedPlan
from wamdiff_ros.geometry import Pose2D, wrap_angle


@dataclass(frozen=True, slots=True, eq=False)
class ReceivedPlan:
    """A PlannerOutput as plain data: ``waypoints`` (N, 2) in the ego frame at ``stamp`` (s); ``fallback`` marks the
    node's comfortable stop (``valid`` is False then, but the stop is meant to be driven)."""

    stamp: float
    waypoints: np.ndarray
    valid: bool
    fallback: bool = False
    forward_calls: int = 0
    new_tokens: int = 0

    @property
    def trackable(self) -> bool:
        return self.valid or self.fallback


class PoseHistory:
    """Ego poses by stamp over the last ``horizon_s`` seconds. ``at(stamp)`` interpolates between the two samples
    around ``stamp`` (heading on the circle); outside the stored span it answers only within ``tolerance_s`` of the
    nearest end. A repeated stamp replaces its pose; an older one means the clock jumped back: the history starts
    over."""

    def __init__(self, horizon_s: float = 10.0) -> None:
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {horizon_s}")
        self.horizon_s = float(horizon_s)
        self._stamps: deque[float] = deque()
        self._poses: deque[Pose2D] = deque()

    def __len__(self) -> int:
        return len(self._stamps)

    def clear(self) -> None:
        self._stamps.clear()
        self._poses.clear()

    def add(self, stamp: float, pose: Pose2D) -> None:
        if self._stamps and stamp == self._stamps[-1]:
            self._poses[-1] = pose
            return
        if self._stamps and stamp < self._stamps[-1]:
            self.clear()
        self._stamps.append(float(stamp))
        self._poses.append(pose)
        while self._stamps[-1] - self._stamps[0] > self.horizon_s:
            self._stamps.popleft()
            self._poses.popleft()

    def latest(self) -> tuple[float, Pose2D] | None:
        return (self._stamps[-1], self._poses[-1]) if self._stamps else None

    def at(self, stamp: float, tolerance_s: float = 1e-6) -> Pose2D | None:
        if not self._stamps:
            return None
        stamps = self._stamps
        if stamp <= stamps[0] or stamp >= stamps[-1]:
            end = 0 if stamp <= stamps[0] else -1
            return self._poses[end] if abs(stamps[end] - stamp) <= tolerance_s else None
        i = bisect_left(stamps, stamp)  # stamps[i - 1] < stamp <= stamps[i]
        t0, t1, a, b = stamps[i - 1], stamps[i], self._poses[i - 1], self._poses[i]
        w = (stamp - t0) / (t1 - t0)
        return Pose2D(a.x + w * (b.x - a.x), a.y + w * (b.y - a.y),
                      wrap_angle(a.heading + w * wrap_angle(b.heading - a.heading)))


@dataclass(slots=True)
class PlanCounters:
    received: int = 0
    applied: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def drop(self, reason: str) -> str:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return reason


class PlanTracker:
    """Keeps the newest plan as a ``TrackedPlan`` whose origin is the ego pose at the plan's stamp. A plan older than
    the one in use, or one whose stamp the pose history no longer (or never) held, is dropped with a reason."""

    def __init__(self, history: PoseHistory, tolerance_s: float = 1e-6) -> None:
        self.history, self.tolerance_s = history, float(tolerance_s)
        self.active: TrackedPlan | None = None
        self.counters = PlanCounters()

    def reset(self) -> None:
        self.active = None

    def offer(self, plan: ReceivedPlan) -> str | None:
        """Adopt ``plan``; returns None when it is now the active plan, else why it was dropped."""
        self.counters.received += 1
        if self.active is not None and plan.stamp <= self.active.stamp:
            return self.counters.drop("older than the plan in use")
        origin = self.history.at(plan.stamp, self.tolerance_s)
        if origin is None:
            return self.counters.drop("no ego pose at its stamp")
        self.active = TrackedPlan(plan.waypoints, origin, plan.stamp, valid=plan.trackable)
        self.counters.applied += 1
        return None


class TickGate:
    """When the simulator may take its next step, on a wall clock the caller passes in.

    ``sync``: after a camera frame the world waits for the plan of that frame (a plan stamped at or after it) up to
    ``timeout_s`` wall seconds, then steps on (counted in ``timeouts``), so results do not depend on CPU speed.
    ``period_s`` > 0 paces the steps at most one per ``period_s`` wall seconds (sim dt / real-time factor); 0 steps as
    fast as allowed. A pacing debt larger than ``max_lag_s`` is forgiven rather than caught up in a burst."""

    def __init__(self, sync: bool, timeout_s: float, period_s: float = 0.0, max_lag_s: float = 0.5) -> None:
        if not (timeout_s > 0 and period_s >= 0 and max_lag_s >= 0):
            raise ValueError(f"need timeout_s > 0, period_s >= 0, max_lag_s >= 0; got {timeout_s}, {period_s}, "
                             f"{max_lag_s}")
        self.sync, self.timeout_s, self.period_s, self.max_lag_s = bool(sync), float(timeout_s), float(period_s), \
            float(max_lag_s)
        self.awaiting: float | None = None  # the stamp of the frame whose plan the world waits for
        self._deadline = math.inf
        self._next_due = -math.inf
        self.timeouts = 0

    def frame_sent(self, stamp: float, wall: float) -> None:
        if self.sync:
            self.awaiting, self._deadline = float(stamp), wall + self.timeout_s

    def plan_arrived(self, stamp: float) -> bool:
        """True when this plan releases the world."""
        if self.awaiting is not None and stamp >= self.awaiting - 1e-9:
            self.awaiting = None
            return True
        return False

    def release(self) -> None:
        self.awaiting = None

    def ready(self, wall: float) -> bool:
        if self.awaiting is not None:
            if wall < self._deadline:
                return False
            self.timeouts += 1
            self.awaiting = None
        return self.period_s == 0.0 or wall >= self._next_due

    def ticked(self, wall: float) -> None:
        if self.period_s > 0.0:
            due = wall if self._next_due == -math.inf else self._next_due
            self._next_due = max(due, wall - self.max_lag_s) + self.period_s


def bicycle_yaw_rate(speed: float, steer: float, wheelbase_m: float) -> float:
    """Yaw rate (rad/s, positive left) of a kinematic bicycle at ``speed`` with front-wheel angle ``steer``."""
    return float(speed * math.tan(steer) / wheelbase_m)
