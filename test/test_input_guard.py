"""The answers to imperfect inputs (``wamdiff_ros/input_guard.py``) and the follower's actuation-delay compensation,
on synthetic readings with known truth."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest

from wamdiff_ros.control import FollowerGains, TrackedPlan, WaypointFollower
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.input_guard import EgoFilterSettings, EgoStateFilter, RepeatedFrameGate

DT = 0.05


def test_a_repeated_frame_is_recognised_while_moving_only():
    gate = RepeatedFrameGate(min_speed_mps=0.5)
    a = np.zeros((4, 6, 3), np.uint8)
    b = a.copy()
    b[1, 2, 0] = 1  # one sensor count differs: a new frame
    assert not gate.repeated(a, 10.0)
    assert gate.repeated(a.copy(), 10.0)  # same bytes, new buffer (a new message)
    assert not gate.repeated(a, 0.2)  # at rest a still scene looks the same: planned
    assert not gate.repeated(b, 10.0) and gate.repeated(b, 10.0)
    assert not gate.repeated(b.reshape(6, 4, 3), 10.0)  # same bytes, another shape
    assert (gate.frames, gate.repeated_frames) == (6, 2)
    gate.reset()
    assert not gate.repeated(b.reshape(6, 4, 3), 10.0)
    with pytest.raises(ValueError):
        RepeatedFrameGate(-1.0)


def _drive(seconds: float, gnss_sigma: float = 0.0, speed_mean: float = 1.0, speed_std: float = 0.0,
           jump_at: float | None = None, seed: int = 0):
    """A car accelerating and braking gently along a curve; readings perturbed as Bench2Drive-Robust does. ->
    (filter, position errors of the raw readings and of the estimate, speed errors of both), after 5 s."""
    rng = np.random.default_rng(seed)
    f = EgoStateFilter()
    x = y = heading = 0.0
    raw_err, est_err, raw_v, est_v = [], [], [], []
    for k in range(int(seconds / DT)):
        t = k * DT
        v = 10.0 + 3.0 * math.sin(t / 2.0)
        heading += 0.02 * v * DT  # a 50 m radius
        x, y = x + v * DT * math.cos(heading), y + v * DT * math.sin(heading)
        zx, zy = x + rng.normal(0, gnss_sigma) if gnss_sigma else x, y + rng.normal(0, gnss_sigma) if gnss_sigma else y
        if jump_at is not None and abs(t - jump_at) < DT / 2:
            zx += 30.0
        zv = v * (rng.normal(speed_mean, speed_std) if speed_std else speed_mean)
        e = f.update(t, zx, zy, heading, zv)
        if t > 5.0:
            raw_err.append(math.hypot(zx - x, zy - y))
            est_err.append(math.hypot(e.x - x, e.y - y))
            raw_v.append(zv - v)
            est_v.append(e.speed - v)
    rms = lambda a: float(np.sqrt(np.mean(np.square(a))))  # noqa: E731
    return f, rms(raw_err), rms(est_err), rms(raw_v), rms(est_v)


def test_clean_readings_pass_through_the_filter_nearly_unchanged():
    f, _, pos, _, speed = _drive(30.0)
    assert pos < 0.15 and speed < 0.05 and f.jumps == 0 and f.scaled == 0 and f.smoothed == 0


@pytest.mark.parametrize("sigma", [5.0, 15.0])
def test_gnss_noise_is_smoothed_by_an_order_of_magnitude_and_reported(sigma):
    f, raw, est, _, _ = _drive(30.0, gnss_sigma=sigma)
    assert raw == pytest.approx(sigma * math.sqrt(2), rel=0.1)
    assert est < raw / 5
    assert f.jumps > 0.5 * f.readings and f.scaled == 0  # noisy positions never set a speed scale


def test_one_jump_is_refused_beyond_the_gate():
    f, _, _, _, _ = _drive(20.0, jump_at=10.0)
    assert f.jumps == 1
    _, _, est, _, _ = _drive(10.3, jump_at=10.0)  # the error just after the jump stays near the gain's share of it
    assert est < 0.5


@pytest.mark.parametrize("mean, std", [(1.0, 0.1), (0.5, 0.2)])
def test_speed_noise_is_smoothed_and_a_biased_speedometer_corrected(mean, std):
    f, _, pos, raw_v, est_v = _drive(40.0, speed_mean=mean, speed_std=std)
    assert est_v < 0.5 * raw_v
    assert (f.scaled > 0) == (mean != 1.0) and f.smoothed > 0.9 * f.readings
    assert pos < 1.0


def test_filter_settings_are_checked():
    with pytest.raises(ValueError, match="jump_gate_m"):
        EgoFilterSettings(jump_gate_m=0.0)
    f = EgoStateFilter()
    f.update(1.0, 0.0, 0.0, 0.0, 5.0)
    e = f.update(0.5, 3.0, 0.0, 0.0, 5.0)  # time went back: start over from this reading
    assert (e.x, e.speed, e.jump) == (3.0, 5.0, False)


# --------------------------------------------------------------------------------------------------------------
# the follower under a known actuation delay


def _track(delay_ticks: int, compensate: bool) -> tuple[float, float]:
    """A highway-env-like bicycle behind a FIFO of ``delay_ticks`` follows a plan that changes lane (3.5 m left) at
    15 m/s. -> (RMS lateral error from the lane, m; peak overshoot beyond the new lane, m)."""
    gains = FollowerGains.for_world("highway_env")
    if compensate:
        gains = dataclasses.replace(gains, actuation_delay_s=delay_ticks * DT)
    follower = WaypointFollower(gains)
    fifo = deque([(0.0, 0.0)] * delay_ticks)
    x = y = heading = 0.0
    v = 15.0
    xs = np.linspace(0, 400, 801)
    lane = 3.5 / (1 + np.exp(-(xs - 40.0) / 6.0))  # a smooth lane change 40 m ahead
    errors, ys = [], []
    for k in range(int(12.0 / DT)):
        t = k * DT
        pose = Pose2D(x, y, heading)
        ahead = x + v * (np.arange(1, 9)[:, None] * 0.5)
        world_pts = np.concatenate([ahead, np.interp(ahead, xs, lane)], axis=1)
        plan = TrackedPlan(pose.to_ego(world_pts), pose, t)
        c = follower.step(plan, pose, v, t)
        fifo.append((c.acceleration, c.steer))
        acceleration, steer = fifo.popleft()
        beta = math.atan(0.5 * math.tan(steer))
        x, y = x + v * DT * math.cos(heading + beta), y + v * DT * math.sin(heading + beta)
        heading += v * math.sin(beta) / 2.5 * DT
        v = max(v + acceleration * DT, 0.0)
        errors.append(y - float(np.interp(x, xs, lane)))
        ys.append(y)
    return float(np.sqrt(np.mean(np.square(errors)))), max(ys) - 3.5


def test_delay_compensation_tracks_a_lane_change_as_if_there_were_no_delay():
    """500 ms (Bench2Drive-Robust's longest latency, 10 ticks) makes the plain follower weave through the lane change
    (about 1 m RMS, 3 m past the new lane); predicting the state at actuation brings it back to the undelayed
    follower's track."""
    plain_rms, plain_overshoot = _track(10, compensate=False)
    rms, overshoot = _track(10, compensate=True)
    undelayed_rms, undelayed_overshoot = _track(0, compensate=False)
    assert plain_rms > 0.5 and plain_overshoot > 1.5
    assert rms < 0.2 * plain_rms and overshoot < 0.2 * plain_overshoot
    assert rms < undelayed_rms + 0.05 and overshoot < undelayed_overshoot + 0.05


def test_without_a_delay_the_follower_is_unchanged():
    gains = FollowerGains.for_world("highway_env")
    assert gains.actuation_delay_s == 0.0 and gains.wheelbase_m == 5.0
    a, b = WaypointFollower(gains), WaypointFollower(dataclasses.replace(gains, actuation_delay_s=0.01))  # < 1 tick
    plan = TrackedPlan(np.stack([np.arange(1, 9) * 5.0, np.arange(1, 9) * 0.3], axis=1), Pose2D(0, 0, 0), 0.0)
    for k in range(10):
        assert a.step(plan, Pose2D(k * 0.5, 0, 0), 10.0, k * DT) == b.step(plan, Pose2D(k * 0.5, 0, 0), 10.0, k * DT)


def test_prediction_applies_the_commands_still_on_their_way():
    gains = dataclasses.replace(FollowerGains.for_world("highway_env"), actuation_delay_s=4 * DT)
    follower = WaypointFollower(gains)
    pose, speed = follower.predict(Pose2D(10.0, 0.0, 0.0), 10.0)
    assert (pose.x, pose.y, speed) == pytest.approx((12.0, 0.0, 10.0))  # nothing sent yet: coasting
    follower._in_flight.extend([(2.0, 0.0)] * 4)
    _, speed = follower.predict(Pose2D(0.0, 0.0, 0.0), 10.0)
    assert speed == pytest.approx(10.4)
    follower._in_flight.extend([(0.0, 0.3)] * 4)
    pose, _ = follower.predict(Pose2D(0.0, 0.0, 0.0), 10.0)
    assert pose.heading > 0.05 and pose.y > 0
