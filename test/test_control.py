"""The waypoint follower in small closed loops with a kinematic bicycle, and the actuator adapters."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from wamdiff_ros.control import (
    CarlaActuator,
    Control,
    FollowerGains,
    GainsError,
    HighwayEnvActuator,
    TrackedPlan,
    WaypointFollower,
    aim_point,
    forward_path,
)
from wamdiff_ros.geometry import Pose2D

DT = 0.05  # highway-env / CARLA step
LENGTH = 5.0
# the control law alone: plan blending, on in the highway gains, has its own tests (test_control_blend.py)
HIGHWAY = dataclasses.replace(FollowerGains.for_world("highway_env"), plan_blend_tau_s=0.0)
CARLA = FollowerGains.for_world("carla")


@dataclass(slots=True)
class Bicycle:
    """highway-env's kinematic bicycle about the box centre (length 5 m), or with ``wheelbase`` set the textbook one
    about the rear axle. Speed is NOT clipped at zero: a follower that over-brakes drives backwards."""

    pose: Pose2D
    speed: float
    wheelbase: float | None = None

    def step(self, acceleration: float, steer: float) -> None:
        h = self.pose.heading
        if self.wheelbase is None:
            beta = math.atan(0.5 * math.tan(steer))
            heading_rate = self.speed * math.sin(beta) / (LENGTH / 2)
        else:
            beta, heading_rate = 0.0, self.speed / self.wheelbase * math.tan(steer)
        self.pose = Pose2D(
            self.pose.x + self.speed * math.cos(h + beta) * DT,
            self.pose.y + self.speed * math.sin(h + beta) * DT,
            h + heading_rate * DT,
        )
        self.speed += acceleration * DT


@dataclass(slots=True)
class Run:
    poses: list[Pose2D] = field(default_factory=list)
    speeds: list[float] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)


def drive(
    car: Bicycle,
    planner: Callable[[Pose2D, float], np.ndarray],
    seconds: float,
    gains: FollowerGains = HIGHWAY,
    replan_s: float = 0.2,
) -> Run:
    """Close the loop: ``planner(pose, speed)`` gives ego-frame waypoints every ``replan_s``; the follower and the
    highway-env actuator run every step."""
    follower, actuator, run = WaypointFollower(gains), HighwayEnvActuator(gains), Run()
    plan: TrackedPlan | None = None
    every = round(replan_s / DT)
    for i in range(round(seconds / DT)):
        t = i * DT
        if i % every == 0:
            plan = TrackedPlan(planner(car.pose, car.speed), car.pose, t)
        control = follower.step(plan, car.pose, car.speed, t)
        car.step(*actuator(control))
        run.poses.append(car.pose)
        run.speeds.append(car.speed)
        run.controls.append(control)
    return run


def along_line(y_line: float, speed: float) -> Callable[[Pose2D, float], np.ndarray]:
    """A planner that sees the world line y = ``y_line`` (heading east) and drives it at ``speed``."""

    def plan(pose: Pose2D, _: float) -> np.ndarray:
        xs = pose.x + speed * 0.5 * np.arange(1, 9)
        return pose.to_ego(np.stack([xs, np.full(8, y_line)], axis=1))

    return plan


def along_circle(radius: float, speed: float, left: bool) -> Callable[[Pose2D, float], np.ndarray]:
    """A planner that sees a circle through the origin, tangent to +x, turning left (centre (0, R)) or right."""
    side = 1.0 if left else -1.0

    def plan(pose: Pose2D, _: float) -> np.ndarray:
        theta = math.atan2(pose.x, radius - side * pose.y)
        thetas = theta + speed * 0.5 * np.arange(1, 9) / radius
        return pose.to_ego(np.stack([radius * np.sin(thetas), side * radius * (1 - np.cos(thetas))], axis=1))

    return plan


def stop_at(x_stop: float) -> Callable[[Pose2D, float], np.ndarray]:
    """A planner that brakes evenly from the current speed to rest at x = ``x_stop`` on the line y = 0."""

    def plan(pose: Pose2D, speed: float) -> np.ndarray:
        gap = max(x_stop - pose.x, 0.0)
        taus = 0.5 * np.arange(1, 9)
        if gap < 0.3 or speed < 0.05:
            xs = np.full(8, pose.x)
        else:
            decel = speed**2 / (2 * gap)
            xs = pose.x + np.where(taus < speed / decel, speed * taus - 0.5 * decel * taus**2, gap)
        return pose.to_ego(np.stack([xs, np.zeros(8)], axis=1))

    return plan


def crawl(speed: float) -> Callable[[Pose2D, float], np.ndarray]:
    """A planner that keeps asking for ``speed`` straight ahead, whatever the car does."""
    return lambda pose, _: np.stack([speed * 0.5 * np.arange(1, 9), np.zeros(8)], axis=1)


def plan_at_rest(origin: Pose2D, stamp: float) -> TrackedPlan:
    return TrackedPlan(np.zeros((8, 2)), origin, stamp)


# --- closed loops -------------------------------------------------------------------------------------------------


def test_straight_converges_onto_the_line_and_holds_the_speed() -> None:
    run = drive(Bicycle(Pose2D(0.0, 0.5, 0.0), 10.0), along_line(0.0, 10.0), seconds=8.0)
    after = round(5.0 / DT)
    assert max(abs(p.y) for p in run.poses[after:]) < 0.1
    assert max(abs(v - 10.0) for v in run.speeds[after:]) < 0.5
    assert min(p.y for p in run.poses) > -0.1  # no big overshoot through the line
    assert all(not c.brake and c.reason == "track" for c in run.controls)


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_constant_radius_turn_stays_on_the_circle(left: bool) -> None:
    radius, speed = 30.0, 8.0
    run = drive(Bicycle(Pose2D(0.0, 0.0, 0.0), speed), along_circle(radius, speed, left), seconds=12.0)
    centre_y = radius if left else -radius
    cross_track = [abs(math.hypot(p.x, p.y - centre_y) - radius) for p in run.poses]
    assert max(cross_track) < 0.5
    assert run.poses[-1].x < 0.0  # went round more than half the circle
    steady = [c.steer for c in run.controls[round(2.0 / DT):]]
    assert all(s > 0 for s in steady) if left else all(s < 0 for s in steady)
    assert max(abs(v - speed) for v in run.speeds) < 0.5


def test_plan_ending_at_rest_stops_near_its_end_without_reversing() -> None:
    run = drive(Bicycle(Pose2D(0.0, 0.0, 0.0), 10.0), stop_at(30.0), seconds=10.0)
    xs = [p.x for p in run.poses]
    assert abs(xs[-1] - 30.0) < 0.5 and max(xs) < 30.5
    assert run.speeds[-1] == pytest.approx(0.0, abs=1e-9)
    assert min(run.speeds) > -1e-9 and all(b >= a for a, b in zip(xs, xs[1:]))
    assert all(c.brake for c in run.controls if c.target_speed < HIGHWAY.brake_speed_mps)
    assert not any(c.creeping for c in run.controls)


def test_creeps_when_stopped_behind_a_plan_that_wants_to_inch_forward() -> None:
    g = HIGHWAY
    run = drive(Bicycle(Pose2D(0.0, 0.0, 0.0), 0.0), crawl(0.2), seconds=g.creep_after_s + g.creep_s + 1.5)
    creeping = [i for i, c in enumerate(run.controls) if c.creeping]
    assert creeping, "never crept"
    first, last = creeping[0], creeping[-1]
    assert creeping == list(range(first, last + 1))  # one creep in this window
    # Before the creep: held at rest, braking. The 0.2 m/s plan alone never moves the car.
    assert all(c.brake and c.reason.startswith("brake") for c in run.controls[:first])
    assert max(abs(v) for v in run.speeds[:first]) == 0.0
    assert first * DT == pytest.approx(g.creep_after_s, abs=1.5 * DT)
    # The creep: drives towards creep_speed, for creep_s, then brakes to rest again.
    assert (last - first + 1) * DT == pytest.approx(g.creep_s, abs=1.5 * DT)
    assert {c.target_speed for c in run.controls[first:last + 1]} == {g.creep_speed_mps}
    assert 0.9 * g.creep_speed_mps < max(run.speeds[first:last + 1]) <= 1.05 * g.creep_speed_mps
    assert run.controls[last + 1].brake and not run.controls[last + 1].creeping
    assert run.speeds[-1] == pytest.approx(0.0, abs=1e-9) and min(run.speeds) > -1e-9
    assert run.poses[-1].x > 0.5


def test_creeps_again_after_the_stop_timer_restarts() -> None:
    g = HIGHWAY
    run = drive(Bicycle(Pose2D(0.0, 0.0, 0.0), 0.0), crawl(0.2), seconds=3 * (g.creep_after_s + g.creep_s + 1.0))
    starts = [i for i, c in enumerate(run.controls) if c.creeping and not run.controls[i - 1].creeping]
    assert len(starts) >= 2


def test_a_blocked_car_waits_between_creeps() -> None:
    """The creep does not move the car (say, a kerb): it still waits creep_after_s before trying again."""
    g, follower, pose = HIGHWAY, WaypointFollower(HIGHWAY), Pose2D(0.0, 0.0, 0.0)
    times = np.arange(0.0, 12.0, DT)
    creeping = np.array([follower.step(TrackedPlan(crawl(0.2)(pose, 0.0), pose, t), pose, 0.0, t).creeping
                         for t in times])
    starts = np.flatnonzero(creeping[1:] & ~creeping[:-1]) + 1
    assert len(starts) >= 2 and times[starts[0]] == pytest.approx(g.creep_after_s, abs=1.5 * DT)
    assert np.diff(starts) * DT == pytest.approx(g.creep_after_s + g.creep_s, abs=1.5 * DT)


def test_a_plan_that_starts_from_rest_drives_off_at_once() -> None:
    def launch(pose: Pose2D, speed: float) -> np.ndarray:  # 2 m/s^2 up to 6 m/s, straight ahead
        taus = 0.5 * np.arange(1, 9)
        reach = (6.0 - speed) / 2.0
        xs = np.where(taus < reach, speed * taus + taus**2, speed * reach + reach**2 + 6.0 * (taus - reach))
        return np.stack([xs, np.zeros(8)], axis=1)

    run = drive(Bicycle(Pose2D(0.0, 0.0, 0.0), 0.0), launch, seconds=5.0)
    assert run.controls[0].target_speed == 0.0 and not run.controls[0].brake  # wants 0 m/s now, more soon
    assert not any(c.brake or c.creeping for c in run.controls)
    assert run.speeds[round(1.0 / DT)] == pytest.approx(2.0, abs=0.3)
    assert run.speeds[-1] == pytest.approx(6.0, abs=0.3)


def test_never_creeps_behind_a_plan_at_rest() -> None:
    follower, pose = WaypointFollower(HIGHWAY), Pose2D(0.0, 0.0, 0.0)
    controls = [follower.step(plan_at_rest(pose, t), pose, 0.0, t) for t in np.arange(0.0, 20.0, DT)]
    assert all(c.brake and not c.creeping and c.acceleration == 0.0 for c in controls)


# --- ego-motion compensation and time alignment ---------------------------------------------------------------


def test_plan_from_a_second_ago_steers_like_the_equivalent_fresh_plan() -> None:
    radius, speed = 30.0, 8.0
    circle = along_circle(radius, speed, left=True)

    def on_circle(t: float, offset: float = 0.0) -> Pose2D:
        theta = speed * t / radius
        r = radius - offset
        return Pose2D(r * math.sin(theta), radius - r * math.cos(theta), theta)

    then = on_circle(1.0)
    old = TrackedPlan(circle(then, speed), then, stamp=1.0)
    now = on_circle(2.0, offset=0.3)  # the car drifted 0.3 m outwards since
    fresh = TrackedPlan(circle(on_circle(2.0), speed), on_circle(2.0), stamp=2.0)  # same path, made from the line
    from_old = WaypointFollower(HIGHWAY).step(old, now, speed, t=2.0)
    from_fresh = WaypointFollower(HIGHWAY).step(fresh, now, speed, t=2.0)
    assert from_old.steer == pytest.approx(from_fresh.steer, abs=1e-9)
    assert from_old.aim == pytest.approx(from_fresh.aim, abs=1e-9)
    assert from_old.target_speed == pytest.approx(from_fresh.target_speed, rel=1e-9)
    assert from_old.steer > 0  # steers back in, towards the centre
    # The old plan read as if it were fresh (no compensation) would aim elsewhere.
    naive = WaypointFollower(HIGHWAY).step(TrackedPlan(old.waypoints, now, stamp=2.0), now, speed, t=2.0)
    assert abs(naive.steer - from_fresh.steer) > 0.02


def test_speed_profile_is_timed_from_the_image_stamp() -> None:
    # 4 s of braking from 8 m/s to rest: segment speeds 7, 5, 3, 1, 0, 0, 0, 0.
    xs = np.cumsum(0.5 * np.array([7.0, 5.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    plan = TrackedPlan(np.stack([xs, np.zeros(8)], axis=1), Pose2D(0.0, 0.0, 0.0), stamp=10.0)
    assert plan.profile_at(10.25) == pytest.approx((7.0, -4.0))  # first segment's mid-time
    assert plan.profile_at(10.5) == pytest.approx((6.0, -4.0))
    assert plan.profile_at(10.0) == pytest.approx((8.0, -4.0))  # extrapolated back to the stamp
    assert plan.profile_at(12.0)[0] == pytest.approx(0.5)
    assert plan.profile_at(30.0) == (0.0, 0.0)  # beyond the horizon: the plan's last speed, at rest
    assert plan.peak_speed_after(11.2) == pytest.approx(3.0)  # segments not yet over at 11.2 s
    assert plan.peak_speed_after(30.0) == 0.0


def test_tracked_plan_from_a_planner_plan() -> None:
    origin = Pose2D(3.0, 4.0, 0.5)
    waypoints = np.stack([np.arange(1, 9, dtype=np.float32), np.zeros(8, np.float32)], axis=1)
    plan = TrackedPlan.from_plan(SimpleNamespace(waypoints=waypoints, valid=True), origin, stamp=7)
    assert plan.waypoints.dtype == np.float64 and plan.waypoints.shape == (8, 2) and plan.valid
    assert (plan.origin, plan.stamp, plan.dt) == (origin, 7.0, 0.5)
    assert not plan.waypoints.flags.writeable
    invalid = TrackedPlan.from_plan(SimpleNamespace(waypoints=np.zeros((8, 2), np.float32), valid=False), origin, 7.0)
    assert not invalid.valid
    with pytest.raises(ValueError, match="finite"):
        TrackedPlan(np.full((8, 2), np.nan), origin, 0.0)


def test_aim_point_extends_the_last_segment_and_holds_straight_on_an_empty_path() -> None:
    path = np.array([[-1.0, 0.5], [0.0, 0.5], [1.0, 0.5]])
    assert aim_point(path, 5.0) == pytest.approx([5.0, 0.5])
    assert aim_point(np.zeros((9, 2)), 4.0) == pytest.approx([4.0, 0.0])


def test_a_plan_that_steps_back_at_its_end_is_followed_to_its_farthest_point_not_turned_around() -> None:
    # A trained planner's plan at 17.8 m/s on a straight highway (held-out seed 2000003): straight ahead, then 0.7 m
    # and 0.3 m back at its end. Its last segment, extended, ran back through the car: 0.9 m later the ego projected
    # onto that extension, aimed 13.8 m behind itself and steered full lock off the road.
    x = np.array([8.69, 16.44, 24.18, 32.28, 41.74, 51.58, 50.89, 50.59])
    path = np.vstack([[0.0, 0.0], np.stack([x, np.zeros(8)], axis=1)])
    assert forward_path(path).tolist() == path[:7].tolist()
    assert aim_point(path - [0.9, 0.0], 13.8) == pytest.approx([13.8, 0.0])
    origin = Pose2D(0.0, 0.0, 0.0)
    plan = TrackedPlan(path[1:], origin, stamp=10.0)
    follower = WaypointFollower(HIGHWAY)
    for k in range(10):  # half a second at 20 Hz, the car going straight at 17.8 m/s
        control = follower.step(plan, Pose2D(0.89 * k, 0.0, 0.0), 17.8, 10.0 + 0.05 * k)
        assert control.aim[0] > 0 and control.steer == pytest.approx(0.0, abs=1e-9)


def test_a_first_waypoint_behind_a_stopped_car_does_not_turn_it_around() -> None:
    path = np.array([[0.0, 0.0], [-0.1, 0.0], [0.3, 0.0], [1.0, 0.0]])  # noise about a stop, then a start
    assert forward_path(path).tolist() == [[0.0, 0.0], [0.3, 0.0], [1.0, 0.0]]
    assert aim_point(path, 5.0) == pytest.approx([5.0, 0.0])


# --- missing, invalid and stale plans ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda pose, t: None, "no plan"),
        (lambda pose, t: TrackedPlan(np.zeros((8, 2)), pose, t, valid=False), "invalid plan"),
        (lambda pose, t: TrackedPlan(along_line(0.0, 10.0)(pose, 10.0), pose, t - 2.5), "stale plan"),
    ],
    ids=["none", "invalid", "stale"],
)
def test_unusable_plan_brakes_to_a_stop(make: Callable, reason: str) -> None:
    car, follower = Bicycle(Pose2D(0.0, 0.0, 0.0), 10.0), WaypointFollower(HIGHWAY)
    for i in range(round(4.0 / DT)):
        t = 10.0 + i * DT
        control = follower.step(make(car.pose, t), car.pose, car.speed, t)
        assert control.brake and reason in control.reason and not control.creeping
        car.step(*HighwayEnvActuator(HIGHWAY)(control))
    assert car.speed == pytest.approx(0.0, abs=1e-9)
    assert car.pose.x == pytest.approx(10.0**2 / (2 * HIGHWAY.max_decel_mps2), abs=0.5)


def test_stale_plan_keeps_steering_along_the_last_valid_path() -> None:
    follower, pose = WaypointFollower(HIGHWAY), Pose2D(0.0, 0.0, 0.0)
    fresh = TrackedPlan(along_circle(30.0, 8.0, left=True)(pose, 8.0), pose, stamp=0.0)
    assert not follower.step(fresh, pose, 8.0, t=0.0).brake
    control = follower.step(None, pose, 8.0, t=0.05)
    assert control.brake and control.steer > 0.05


def test_reset_forgets_the_last_valid_path() -> None:
    follower, pose = WaypointFollower(HIGHWAY), Pose2D(0.0, 0.0, 0.0)
    follower.step(TrackedPlan(along_circle(30.0, 8.0, left=True)(pose, 8.0), pose, 0.0), pose, 8.0, t=0.0)
    follower.reset()
    control = follower.step(None, pose, 8.0, t=0.05)
    assert control.steer == 0.0 and control.aim == (control.lookahead, 0.0)


# --- actuators ----------------------------------------------------------------------------------------------------


def test_highway_env_actuator_keeps_our_sign_and_clips_to_the_world_limits() -> None:
    act, g = HighwayEnvActuator(HIGHWAY), HIGHWAY
    assert act(Control(1.0, 0.1, False)) == (1.0, 0.1)
    assert act(Control(99.0, 9.0, False)) == (g.max_accel_mps2, g.max_steer_rad)
    assert act(Control(-99.0, -9.0, True)) == (-g.max_decel_mps2, -g.max_steer_rad)


def test_carla_actuator_maps_left_to_negative_steer_and_never_throttles_while_braking() -> None:
    act, g = CarlaActuator(CARLA), CARLA
    throttle, steer, brake = act(Control(1.0, 0.2, False))
    assert steer == pytest.approx(-0.2 / g.max_steer_rad) and steer < 0
    assert throttle == pytest.approx(1.0 * g.throttle_per_mps2) and brake == 0.0
    assert act(Control(2.0, 0.0, True)) == (0.0, 0.0, 1.0)
    assert act(Control(-2.0, -0.1, False))[1:] == pytest.approx((0.1 / g.max_steer_rad, 2.0 * g.brake_per_mps2))
    rng = np.random.default_rng(0)
    for acceleration, wheel, flag in zip(rng.uniform(-20, 20, 500), rng.uniform(-3, 3, 500), rng.random(500) < 0.3):
        throttle, steer, brake = act(Control(float(acceleration), float(wheel), bool(flag)))
        assert 0.0 <= throttle <= g.max_throttle and -1.0 <= steer <= 1.0 and 0.0 <= brake <= 1.0
        assert throttle == 0.0 or brake == 0.0
        assert steer * wheel <= 0.0


def test_follower_and_carla_actuator_outputs_in_range_in_a_closed_loop() -> None:
    """CARLA's gains on a car-sized rear-axle bicycle: a sanity check that they are stable, not a CARLA model."""
    car = Bicycle(Pose2D(0.0, 0.5, 0.0), 5.0, wheelbase=2.85)
    follower, act, plan = WaypointFollower(CARLA), CarlaActuator(CARLA), along_line(0.0, 8.0)
    for i in range(round(8.0 / DT)):
        t = i * DT
        control = follower.step(TrackedPlan(plan(car.pose, car.speed), car.pose, t), car.pose, car.speed, t)
        throttle, steer, brake = act(control)
        assert 0.0 <= throttle <= CARLA.max_throttle and -1.0 <= steer <= 1.0 and 0.0 <= brake <= 1.0
        assert throttle == 0.0 or brake == 0.0
        car.step(control.acceleration, control.steer)
    assert abs(car.pose.y) < 0.15 and car.speed == pytest.approx(8.0, abs=0.5)


# --- gains --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", ["highway_env", "carla"])
def test_gains_file_loads_for_both_worlds(world: str) -> None:
    g = FollowerGains.for_world(world)
    assert 0 < g.lookahead_min_m <= g.lookahead_max_m and g.max_steer_rad > 0 and g.brake_ratio > 1
    assert g.lookahead_m(0.0) == g.lookahead_min_m and g.lookahead_m(100.0) == g.lookahead_max_m


def _carla_values() -> dict:
    return {f.name: getattr(CARLA, f.name) for f in dataclasses.fields(CARLA)}


def test_unknown_gain_key_is_named() -> None:
    with pytest.raises(GainsError, match="lateral_kq") as err:
        FollowerGains.from_dict({**_carla_values(), "lateral_kq": 1.0}, name="carla")
    assert err.value.field == "carla.lateral_kq"


def test_missing_gain_key_is_named() -> None:
    values = _carla_values()
    del values["creep_s"]
    with pytest.raises(GainsError, match="creep_s.*missing"):
        FollowerGains.from_dict(values)


@pytest.mark.parametrize(
    ("key", "value"), [("lateral_window", 2.5), ("speed_kp", "fast"), ("lookahead_max_m", 1.0), ("speed_ki", -1.0)]
)
def test_bad_gain_value_is_named(key: str, value: object) -> None:
    with pytest.raises(GainsError, match=key):
        FollowerGains.from_dict({**_carla_values(), key: value})


def test_unknown_world_lists_the_known_ones(tmp_path) -> None:
    with pytest.raises(GainsError, match="carla.*highway_env"):
        FollowerGains.for_world("mars")
    path = tmp_path / "gains.yaml"
    path.write_text("carla:\n  lateral_kp: 1.0\n")
    with pytest.raises(GainsError, match="missing"):
        FollowerGains.for_world("carla", path)


def test_control_imports_no_ros_torch_or_simulators() -> None:
    code = "import sys, wamdiff_ros.control; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in ("torch", "rclpy", "carla", "highway_env", "gymnasium", "transformers"):
        assert f"'{name}'" not in loaded
