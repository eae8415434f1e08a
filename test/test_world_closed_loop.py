"""Tests for wamdiff_ros.world.closed_loop: LoopConfig validation, paused vs realtime plan timing (with a fake planner
of known latency and an instrumented follower), the EpisodeLog it returns, kept camera frames, and the tiny random
model driving a few seconds in both modes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from conftest import SHORT_SCENARIO_S

from wamdiff_ros.control import FollowerGains
from wamdiff_ros.world import closed_loop
from wamdiff_ros.world.camera import CameraConfig
from wamdiff_ros.world.closed_loop import (
    ClosedLoopPlanner,
    ConstantVelocityPlanner,
    ExpertPlanner,
    LoopConfig,
    ModelPlanner,
    Observation,
    PlanResult,
    run_episode,
)
from wamdiff_ros.world.metrics import EpisodeLog
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, load_scenarios
from wamdiff_ros.world.sim import World

SEED = SPLIT_SEED_BASE["test"]
SHORT_S = SHORT_SCENARIO_S
SLEEP_S = 0.1
HW_FACTOR = 3.0


@pytest.fixture(scope="module")
def short_set(short_scenario_file):
    """The v1 scenarios with every duration cut to 3 s."""
    return load_scenarios(short_scenario_file)


class SleepyStraight:
    """A ClosedLoopPlanner that takes (at least) SLEEP_S per plan and always answers 'straight on at 20 m/s'."""

    name, needs_camera = "sleepy", False

    def reset(self, world: World) -> None:
        self.requests: list[float] = []  # world.t at each plan call
        self.resets = getattr(self, "resets", 0) + 1

    def plan(self, obs: Observation, route=None) -> PlanResult:
        self.requests.append(obs.world.t)
        time.sleep(SLEEP_S)
        t = np.arange(1, fmt.NUM_WAYPOINTS + 1) * fmt.WAYPOINT_DT_S
        return PlanResult(np.stack([20.0 * t, np.zeros_like(t)], axis=1).astype(np.float32))


@pytest.fixture
def follower_calls(monkeypatch):
    """Instrument the follower run_episode builds: (sim time, stamp of the plan it was given or None) per step."""
    calls: list[tuple[float, float | None]] = []

    class Recording(closed_loop.WaypointFollower):
        def step(self, plan, pose, speed, t):
            calls.append((t, None if plan is None else plan.stamp))
            return super().step(plan, pose, speed, t)

    monkeypatch.setattr(closed_loop, "WaypointFollower", Recording)
    return calls


def test_loop_config_validation():
    assert LoopConfig().mode == "paused" and LoopConfig().plan_hz == 5.0
    assert LoopConfig(mode="realtime", plan_hz=2.0, hardware_factor=0.5).mode == "realtime"
    with pytest.raises(ValueError, match="mode"):
        LoopConfig(mode="bogus")
    for hz in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="plan_hz"):
            LoopConfig(plan_hz=hz)
    with pytest.raises(ValueError, match="hardware_factor"):
        LoopConfig(hardware_factor=0.0)
    for tau in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="plan_blend_tau_s"):
            LoopConfig(plan_blend_tau_s=tau)


def test_planners_implement_the_protocol():
    for planner in (SleepyStraight(), ExpertPlanner(), ConstantVelocityPlanner()):
        assert isinstance(planner.name, str) and isinstance(planner.needs_camera, bool)
        assert callable(planner.reset) and callable(planner.plan)
    p: ClosedLoopPlanner = SleepyStraight()  # structural: the fake needs no base class
    assert p.name == "sleepy"


class Zigzag:
    """Plans that swap sides of the lane, 1.5 m left then right, at 10 m/s: a small model's jitter, caricatured."""

    name, needs_camera = "zigzag", False

    def reset(self, world) -> None:
        self.side = 1.0

    def plan(self, obs, route=None) -> PlanResult:
        self.side = -self.side
        t = 0.5 * np.arange(1, 9)
        return PlanResult(np.stack([10.0 * t, np.full(8, 1.5 * self.side)], axis=1).astype(np.float32))


def test_plan_blending_is_the_gains_default_and_loop_config_overrides_it(short_set):
    def sway(tau: float | None) -> float:
        log = run_episode(short_set.get("highway"), SEED, Zigzag(), LoopConfig(plan_blend_tau_s=tau), short_set).log
        return float(np.std(np.diff(log.heading)))

    default, off, on = sway(None), sway(0.0), sway(0.5)
    assert FollowerGains.for_world("highway_env").plan_blend_tau_s == 0.5
    assert default == on
    assert on < 0.7 * off  # blended, the swaps of side largely cancel


def test_paused_mode_applies_each_plan_at_its_image_time(short_set, follower_calls):
    planner = SleepyStraight()
    result = run_episode(short_set.get("highway"), SEED, planner, LoopConfig(mode="paused"), short_set)
    log = result.log
    assert log.end_reason == "timeout" and log.t[-1] == pytest.approx(SHORT_S)
    # a request every 1 / plan_hz = 0.2 s of sim time, whatever the planner's latency
    assert len(planner.requests) == round(SHORT_S * 5.0) == 15
    np.testing.assert_allclose(np.diff(planner.requests), 0.2, atol=1e-9)
    assert len(log.plan_latency_s) == len(planner.requests)
    assert min(log.plan_latency_s) >= SLEEP_S
    # the follower gets each plan at the very step its image was taken (stamp == t), none before the first
    stamps = {round(s, 6) for s in planner.requests}
    for t, stamp in follower_calls:
        if round(t, 6) in stamps:
            assert stamp == pytest.approx(t)
        assert stamp is not None
    assert len(follower_calls) == result.sim_steps == log.steps - 1


def test_realtime_mode_applies_plans_latency_times_factor_later(short_set, follower_calls):
    planner = SleepyStraight()
    config = LoopConfig(mode="realtime", hardware_factor=HW_FACTOR)
    result = run_episode(short_set.get("highway"), SEED, planner, config, short_set)
    log = result.log
    assert log.mode == "realtime" and log.end_reason == "timeout"
    requests, latencies = planner.requests, log.plan_latency_s
    assert len(latencies) == len(requests) >= 2
    step_times = np.array([t for t, _ in follower_calls])
    first_seen = {}
    for t, stamp in follower_calls:
        if stamp is not None:
            first_seen.setdefault(round(stamp, 6), t)
    # no plan before the first one lands; each lands at the first sim step >= its image time + latency x factor
    assert follower_calls[0][1] is None
    for stamp, latency in zip(requests, latencies):
        due = stamp + latency * HW_FACTOR
        if due > step_times[-1]:  # still in flight when the episode ended
            assert round(stamp, 6) not in first_seen
            continue
        landed = first_seen[round(stamp, 6)]
        assert landed == step_times[step_times >= due - 1e-9][0]
        assert landed - stamp >= SLEEP_S * HW_FACTOR - 1e-9  # ~0.3 s of sim time after its image
    # meanwhile the previous plan is followed: the stamps the follower sees never go backwards
    seen = [s for _, s in follower_calls if s is not None]
    assert seen == sorted(seen)
    # one request in flight: the next is asked only once the previous landed, so they are >= 0.3 s apart
    assert np.all(np.diff(requests) >= SLEEP_S * HW_FACTOR - 1e-9)
    for stamp, nxt in zip(requests, requests[1:]):
        assert nxt == pytest.approx(first_seen[round(stamp, 6)])


def test_realtime_mode_asks_for_fewer_plans_than_paused(short_set):
    counts = {}
    for mode in ("paused", "realtime"):
        planner = SleepyStraight()
        result = run_episode(short_set.get("highway"), SEED, planner,
                             LoopConfig(mode=mode, hardware_factor=HW_FACTOR), short_set)
        assert result.log.t[-1] == pytest.approx(SHORT_S)  # same sim duration
        counts[mode] = len(planner.requests)
        assert len(result.log.plan_latency_s) == counts[mode]
    assert counts["paused"] == 15
    assert counts["realtime"] <= 9 < counts["paused"]  # a request at most every 0.35 s (0.3 s rounded up to steps)


def test_episode_log_is_consistent(short_set):
    spec = short_set.get("roundabout")
    result = run_episode(spec, SEED, ConstantVelocityPlanner(), LoopConfig(), short_set)
    log = result.log
    assert isinstance(log, EpisodeLog)
    n = log.steps
    assert n == result.sim_steps + 1  # the initial state, then one record per step
    for name in ("t", "x", "y", "heading", "speed", "progress_m", "on_route_lanes"):
        assert len(getattr(log, name)) == n, name
    assert log.t[0] == 0.0
    np.testing.assert_allclose(np.diff(log.t), 1.0 / short_set.sim_hz, atol=1e-9)
    assert log.dt == pytest.approx(0.05)
    assert (log.scenario, log.seed, log.planner, log.mode) == ("roundabout", SEED, "constant_velocity", "paused")
    assert log.time_limit_s == SHORT_S
    assert log.route_length_m > 0
    assert log.end_reason in ("completed", "timeout", "route_deviation", "blocked")
    assert log.forward_calls_per_token is None  # no model ran
    # one latency per request: paused at 5 Hz over the episode's sim time
    assert len(log.plan_latency_s) == int(np.ceil(log.t[-1] * 5.0 - 1e-9))
    assert all(v >= 0 for v in log.plan_latency_s)
    # constant velocity on a straight approach at 8 m/s
    assert log.speed[-1] == pytest.approx(8.0, abs=0.5)
    assert log.progress_m[-1] == pytest.approx(8.0 * log.t[-1], rel=0.1)
    # and it round-trips through JSON as the evaluator ships it
    again = EpisodeLog.from_json(log.to_json())
    np.testing.assert_array_equal(again.x, log.x)
    assert again.plan_latency_s == pytest.approx(log.plan_latency_s)


@pytest.mark.parametrize("camera", [CameraConfig(), CameraConfig(width=96, height=48)])
def test_keep_frames_returns_camera_sized_images(short_set, camera):
    config = LoopConfig(keep_frames=True, camera=camera)
    result = run_episode(short_set.get("intersection"), SEED, ConstantVelocityPlanner(), config, short_set)
    frames = result.frames
    assert len(frames) == len(result.log.plan_latency_s) > 0
    for image, waypoints, boxes, text in frames:
        assert image.shape == (camera.height, camera.width, 3) and image.dtype == np.uint8
        assert np.asarray(waypoints).shape == (8, 2)
        assert isinstance(boxes, list)
        assert text.startswith("intersection t=")
    assert len({frames[0][0].tobytes(), frames[-1][0].tobytes()}) == 2  # the view changes as the ego drives
    # without keep_frames nothing is kept
    assert run_episode(short_set.get("intersection"), SEED, ConstantVelocityPlanner(), LoopConfig(),
                       short_set).frames == []


@pytest.fixture(scope="module")
def tiny_planner():
    from wamdiff_ros.planner import Planner

    return Planner.from_pretrained("tiny-random")


@pytest.mark.parametrize("mode", ["paused", "realtime"])
def test_model_planner_tiny_random_runs_both_modes(short_set, tiny_planner, mode):
    planner = ModelPlanner(tiny_planner)
    assert planner.name == "model" and planner.needs_camera
    result = run_episode(short_set.get("highway"), SEED, planner, LoopConfig(mode=mode), short_set)
    log = result.log
    assert log.planner == "model" and log.mode == mode
    assert log.end_reason in ("completed", "timeout", "route_deviation", "blocked")
    assert log.steps == result.sim_steps + 1 >= 2
    assert len(log.plan_latency_s) >= 1
    assert log.forward_calls_per_token is not None and log.forward_calls_per_token > 0
    assert np.isfinite(log.x).all() and np.isfinite(log.y).all()


class StraightThenBack:
    """Straight on at the ego's speed 5 cm to the left, then two waypoints 0.7 m and 1.0 m back from the farthest, on
    the ego's own line: the shape of a trained student's plan that once turned the car round on a straight highway.
    Extended, its last segment runs back along that line, right through the car."""

    name, needs_camera = "straight_then_back", False

    def reset(self, world: World) -> None:
        pass

    def plan(self, obs: Observation, route=None) -> PlanResult:
        x = obs.world.ego_speed * np.arange(1, fmt.NUM_WAYPOINTS + 1) * fmt.WAYPOINT_DT_S
        y = np.full_like(x, 0.05)
        x[-2:], y[-2:] = x[-3] - np.array([0.7, 1.0]), 0.0
        return PlanResult(np.stack([x, y], axis=1).astype(np.float32))


def test_a_plan_that_steps_back_at_its_end_keeps_the_car_in_its_lane(short_set):
    result = run_episode(short_set.get("highway"), SEED, StraightThenBack(), LoopConfig(plan_hz=2.0), short_set)
    log = result.log
    assert log.end_reason == "timeout"  # the whole 3 s on the route, not a route deviation
    assert np.abs(log.heading).max() < 0.02  # it edges left, as asked, and never turns round
    assert np.ptp(log.y) < 0.5


class RouteRecorder:
    """Straight on at the ego's speed; keeps the route each plan request carried and the world's route points then."""

    name, needs_camera = "route_recorder", False

    def reset(self, world: World) -> None:
        self.seen = []

    def plan(self, obs: Observation, route=None) -> PlanResult:
        self.seen.append((route, obs.world.route_points()))
        x = obs.world.ego_speed * np.arange(1, fmt.NUM_WAYPOINTS + 1) * fmt.WAYPOINT_DT_S
        return PlanResult(np.stack([x, np.zeros_like(x)], axis=1).astype(np.float32))


def test_every_plan_request_carries_the_worlds_route_points(short_set):
    recorder = RouteRecorder()
    run_episode(short_set.get("intersection"), SEED, recorder, LoopConfig(plan_hz=2.0), short_set)
    assert len(recorder.seen) >= 2
    for route, expected in recorder.seen:
        assert route is not None and route.shape == (len(fmt.ROUTE_AHEAD_M), 2)
        np.testing.assert_array_equal(route, expected)
