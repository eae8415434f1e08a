"""The waypoint follower: a timed plan + the current ego state -> a desired acceleration and front-wheel angle."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.control.blend import PlanBlender
from wamdiff_ros.control.gains import FollowerGains
from wamdiff_ros.geometry import Pose2D

if TYPE_CHECKING:
    from wamdiff_ros.planner import Plan

_MIN_SEGMENT_M = 1e-3


@dataclass(frozen=True, slots=True, eq=False)  # identity equality: it holds an array
class TrackedPlan:
    """Waypoints (N, 2) in the ego frame of ``origin`` (the ego pose when the camera image was taken, at sim time
    ``stamp``); waypoint k (0-based) is where the ego should be at ``stamp + (k + 1) * dt``."""

    waypoints: np.ndarray
    origin: Pose2D
    stamp: float
    dt: float = fmt.WAYPOINT_DT_S
    valid: bool = True

    def __post_init__(self) -> None:
        w = np.array(self.waypoints, dtype=np.float64)
        if w.ndim != 2 or w.shape[1] != 2 or len(w) == 0:
            raise ValueError(f"waypoints: expected shape (N, 2), got {w.shape}")
        if self.valid and not np.isfinite(w).all():
            raise ValueError("waypoints: a valid plan needs finite waypoints")
        if not self.dt > 0:
            raise ValueError(f"dt: must be > 0, got {self.dt}")
        w.flags.writeable = False
        object.__setattr__(self, "waypoints", w)

    @classmethod
    def from_plan(cls, plan: Plan, origin: Pose2D, stamp: float) -> TrackedPlan:
        """A planner ``Plan`` made from the image taken at ``origin`` at sim time ``stamp``."""
        return cls(plan.waypoints, origin, float(stamp), fmt.WAYPOINT_DT_S, bool(plan.valid))

    def path(self) -> np.ndarray:
        """(N + 1, 2): the origin, then the waypoints, in the origin's ego frame."""
        return np.vstack([np.zeros((1, 2)), self.waypoints])

    def path_in(self, pose: Pose2D) -> np.ndarray:
        """The path re-expressed in the ego frame of ``pose`` (ego-motion compensation)."""
        return pose.to_ego(self.origin.to_world(self.path()))

    def segment_speeds(self) -> np.ndarray:
        return np.linalg.norm(np.diff(self.path(), axis=0), axis=1) / self.dt

    def profile_at(self, t: float) -> tuple[float, float]:
        """Desired (speed m/s, acceleration m/s^2) at sim time ``t``: segment speeds placed at their mid-times and
        interpolated, extrapolated back to ``stamp`` from the first two (a fresh plan starts at the speed it was
        planned from, not at its first segment's mean) and held beyond the horizon."""
        speeds = self.segment_speeds()
        mid_times = self.stamp + (np.arange(len(speeds)) + 0.5) * self.dt
        if len(speeds) < 2 or t >= mid_times[-1]:
            return float(speeds[-1]), 0.0
        i = max(int(np.searchsorted(mid_times, t, side="right")) - 1, 0)
        slope = (speeds[i + 1] - speeds[i]) / self.dt
        return max(float(speeds[i] + slope * (t - mid_times[i])), 0.0), float(slope)

    def peak_speed_after(self, t: float) -> float:
        """The highest segment speed among the segments not yet over at ``t`` (the last one beyond the horizon)."""
        speeds = self.segment_speeds()
        ends = self.stamp + (np.arange(len(speeds)) + 1) * self.dt
        left = speeds[ends > t]
        return float(left.max()) if len(left) else float(speeds[-1])


@dataclass(frozen=True, slots=True)
class Control:
    """Desired acceleration (m/s^2) and front-wheel angle (rad, positive left), and why."""

    acceleration: float
    steer: float
    brake: bool
    target_speed: float = 0.0
    aim: tuple[float, float] = (0.0, 0.0)  # ego frame, metres
    lookahead: float = 0.0
    creeping: bool = False
    reason: str = ""


def forward_path(path: np.ndarray) -> np.ndarray:
    """The points of ``path`` (N, 2, ego frame) that take the car forwards: each one kept lies ahead of the one kept
    before it, along the direction the path has there (at the start: the ego's heading, +x). A car plan does not
    reverse: waypoints that step back are noise about a stop (0.7 m back after 51.6 m ahead, say). Kept, they turn
    the path back on itself, and the extended last segment then runs back through the car and aims behind it."""
    pts = np.asarray(path, dtype=np.float64)
    kept, direction = [pts[0]], np.array([1.0, 0.0])
    for point in pts[1:]:
        step = point - kept[-1]
        if float(step @ direction) > _MIN_SEGMENT_M:
            kept.append(point)
            direction = step / np.linalg.norm(step)
    return np.array(kept)


def aim_point(path: np.ndarray, lookahead: float) -> np.ndarray:
    """The point ``lookahead`` metres of arc beyond the ego's projection (the frame origin) onto the forward part of
    ``path`` (N, 2; ``forward_path``), its last segment extended; straight ahead when that has no length."""
    pts = forward_path(path)
    if len(pts) < 2:
        return np.array([lookahead, 0.0])
    end = pts[-1]
    direction = (end - pts[-2]) / np.linalg.norm(end - pts[-2])
    pts = np.vstack([pts, end + direction * (lookahead + np.linalg.norm(end) + 1.0)])
    starts, seg = pts[:-1], np.diff(pts, axis=0)
    lengths = np.linalg.norm(seg, axis=1)
    along = np.clip(-(starts * seg).sum(axis=1) / lengths**2, 0.0, 1.0)
    nearest = int(np.argmin(np.linalg.norm(starts + along[:, None] * seg, axis=1)))
    arc = np.concatenate([[0.0], np.cumsum(lengths)])
    target = arc[nearest] + along[nearest] * lengths[nearest] + lookahead
    i = min(int(np.searchsorted(arc, target, side="right")) - 1, len(seg) - 1)
    return starts[i] + seg[i] * (target - arc[i]) / lengths[i]


class _Pid:
    """The reference agents' discrete PID: integral = mean of the last ``window`` errors (no wind-up),
    derivative = change since the previous step."""

    def __init__(self, kp: float, ki: float, kd: float, window: int) -> None:
        self.kp, self.ki, self.kd = kp, ki, kd
        self._errors: deque[float] = deque(maxlen=window)

    def reset(self) -> None:
        self._errors.clear()

    def step(self, error: float) -> float:
        derivative = error - self._errors[-1] if self._errors else 0.0
        self._errors.append(error)
        return self.kp * error + self.ki * float(np.mean(self._errors)) + self.kd * derivative


class WaypointFollower:
    """Tracks a ``TrackedPlan``: lateral PID on the heading to an aim point on the ego-motion-compensated path,
    longitudinal PID on the plan's speed profile at the current time, brake thresholds, creep. Each new plan (a
    new ``TrackedPlan`` object) is first blended with the earlier ones (``PlanBlender``, ``plan_blend_tau_s``).

    Creep/stuck rule: stopped for ``creep_after_s`` while a fresh plan still wants to move but too slowly to leave the
    brake -> creep at ``creep_speed_mps`` for ``creep_s``; the stop timer then restarts, so a car that keeps being
    asked to inch forward creeps again instead of standing forever. A missing, invalid or stale plan, or one that
    no longer wants to move, never creeps: the car brakes to a stop, steering along the last valid path."""

    def __init__(self, gains: FollowerGains) -> None:
        self.gains = gains
        self._lateral = _Pid(gains.lateral_kp, gains.lateral_ki, gains.lateral_kd, gains.lateral_window)
        self._longitudinal = _Pid(gains.speed_kp, gains.speed_ki, gains.speed_kd, gains.speed_window)
        self._blender = PlanBlender(gains.plan_blend_tau_s)
        self.reset()

    def reset(self) -> None:
        self._lateral.reset()
        self._longitudinal.reset()
        self._blender.reset()
        self._received: TrackedPlan | None = None  # the last plan given to step, and what it blended into
        self._blended: TrackedPlan | None = None
        self._last_t: float | None = None
        self._last_valid: TrackedPlan | None = None
        self._stopped_since: float | None = None
        self._creep_until: float | None = None
        self._in_flight: deque[tuple[float, float]] = deque(maxlen=max(self._delay_steps(), 1))  # commands sent

    def predict(self, pose: Pose2D, speed: float) -> tuple[Pose2D, float]:
        """Where the car will be when a command sent now acts, ``actuation_delay_s`` (k control periods) later: after
        the k commands sent before it, each acting for one period (none known yet: coasting straight, as a FIFO
        filled with zero commands does), on a kinematic bicycle about the car's centre (``wheelbase_m``), as
        highway-env's."""
        g = self.gains
        k = self._delay_steps()
        commands = list(self._in_flight)[-k:] if k else []
        commands = [(0.0, 0.0)] * (k - len(commands)) + commands
        x = y = heading = 0.0
        v, dt = speed, g.control_period_s
        for acceleration, steer in commands:
            beta = math.atan(0.5 * math.tan(steer))
            x, y = x + v * dt * math.cos(heading + beta), y + v * dt * math.sin(heading + beta)
            heading += v * math.sin(beta) / (0.5 * g.wheelbase_m) * dt
            v = max(v + acceleration * dt, 0.0)
        (wx, wy), = pose.to_world(np.array([[x, y]]))
        return Pose2D(float(wx), float(wy), pose.heading + heading), v

    def _delay_steps(self) -> int:
        return int(round(self.gains.actuation_delay_s / self.gains.control_period_s))

    def step(self, plan: TrackedPlan | None, pose: Pose2D, speed: float, t: float) -> Control:
        """``speed``: signed speed along the heading (m/s); ``t``: sim time (s), the clock of ``plan.stamp``. With an
        ``actuation_delay_s`` the command is for the predicted state when it acts (``predict``)."""
        g = self.gains
        if self._delay_steps() == 0:
            return self._step(plan, pose, speed, t)
        pose, speed = self.predict(pose, speed)
        control = self._step(plan, pose, speed, t + g.actuation_delay_s)
        self._in_flight.append((control.acceleration, control.steer))
        return control

    def _step(self, plan: TrackedPlan | None, pose: Pose2D, speed: float, t: float) -> Control:
        g = self.gains
        period = t - self._last_t if self._last_t is not None and t > self._last_t else g.control_period_s
        self._last_t = t
        if speed >= g.stopped_speed_mps:
            self._stopped_since = None
        elif self._stopped_since is None:
            self._stopped_since = t

        if plan is not None and plan is not self._received:
            self._received, self._blended = plan, self._blender(plan)
        plan = self._blended if plan is not None else None
        problem = _problem(plan, t, g.max_plan_age_s)
        if plan is not None and plan.valid and (self._last_valid is None or plan.stamp >= self._last_valid.stamp):
            self._last_valid = plan
        track = plan if problem is None else self._last_valid
        lookahead = g.lookahead_m(speed)
        aim = aim_point(track.path_in(pose), lookahead) if track is not None else np.array([lookahead, 0.0])
        steer = _clip(self._lateral.step(math.atan2(aim[1], aim[0])), g.max_steer_rad)

        if problem is not None:
            self._creep_until = None
            target, plan_accel, creeping, brake, reason = 0.0, 0.0, False, True, problem
        else:
            desired, plan_accel = plan.profile_at(t)
            # Brake on the speed half a waypoint ahead too (a fresh plan's first segment mean, as the reference
            # agents test it): a plan that starts from rest wants 0 m/s now and must not be held on the brake.
            slow = max(desired, plan.profile_at(t + plan.dt / 2)[0], plan.profile_at(t + plan.dt)[0]) < g.brake_speed_mps
            creeping = self._creeping(plan, slow, t)
            target = g.creep_speed_mps if creeping else desired
            if slow and not creeping:
                brake, reason = True, "brake: plan speed below brake speed"
            elif speed > g.brake_ratio * target:
                brake, reason = True, "brake: overspeed"
            else:
                brake, reason = False, "creep" if creeping else "track"
        feedforward = 0.0 if creeping else g.accel_feedforward * plan_accel
        acceleration = self._longitudinal.step(target - speed) + feedforward
        acceleration = -g.max_decel_mps2 if brake else min(max(acceleration, -g.max_decel_mps2), g.max_accel_mps2)
        # Never ask for more deceleration than stops the car within one step: highway-env would drive backwards.
        acceleration = min(max(acceleration, -speed / period), g.max_accel_mps2)
        return Control(float(acceleration), float(steer), brake, float(target), (float(aim[0]), float(aim[1])),
                       float(lookahead), creeping, reason)

    def _creeping(self, plan: TrackedPlan, slow: bool, t: float) -> bool:
        g = self.gains
        asks_to_inch = slow and plan.peak_speed_after(t) > g.creep_min_plan_speed_mps
        if self._creep_until is not None:
            if t < self._creep_until and asks_to_inch:
                return True
            self._creep_until = None
            if self._stopped_since is not None:  # the stop timer restarts with the creep over
                self._stopped_since = t
        if asks_to_inch and self._stopped_since is not None and t - self._stopped_since >= g.creep_after_s:
            self._creep_until = t + g.creep_s
            return True
        return False


def _problem(plan: TrackedPlan | None, t: float, max_age: float) -> str | None:
    if plan is None:
        return "brake: no plan"
    if not plan.valid:
        return "brake: invalid plan"
    if t - plan.stamp > max_age:
        return f"brake: stale plan (age {t - plan.stamp:.2f} s > {max_age:.2f} s)"
    return None


def _clip(value: float, limit: float) -> float:
    return min(max(value, -limit), limit)
