"""Plan blending (wamdiff_ros.control.blend) and the follower's use of it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from wamdiff_ros.control import FollowerGains, GainsError, TrackedPlan, WaypointFollower
from wamdiff_ros.control.blend import PlanBlender
from wamdiff_ros.geometry import Pose2D

HIGHWAY = FollowerGains.for_world("highway_env")
T = 0.5 * np.arange(1, 9)


def line(y: float, speed: float = 10.0) -> np.ndarray:
    """Waypoints at ``speed`` along the ego-frame line at lateral offset ``y``."""
    return np.stack([speed * T, np.full(8, y)], axis=1)


def test_tau_zero_and_invalid_plans_pass_through_unchanged() -> None:
    plan = TrackedPlan(line(1.0), Pose2D(0.0, 0.0, 0.0), 0.0)
    assert PlanBlender(0.0)(plan) is plan
    blender = PlanBlender(0.5)
    invalid = TrackedPlan(np.zeros((8, 2)), Pose2D(0.0, 0.0, 0.0), 0.0, valid=False)
    assert blender(invalid) is invalid
    first = TrackedPlan(line(0.0), Pose2D(0.0, 0.0, 0.0), 0.5)
    assert np.array_equal(blender(first).waypoints, first.waypoints)  # the invalid plan was not remembered


def test_plans_that_agree_in_the_world_blend_into_the_same_plan() -> None:
    blender, speed = PlanBlender(0.5), 10.0
    for k in range(4):  # driving east along y = 2 at 10 m/s, a plan every 0.5 s, each from where the car is
        pose = Pose2D(speed * 0.5 * k, 2.0, 0.0)
        world = np.stack([pose.x + speed * T, np.full(8, 2.0)], axis=1)
        plan = TrackedPlan(pose.to_ego(world), pose, 0.5 * k)
        assert blender(plan).waypoints == pytest.approx(plan.waypoints, abs=1e-9)


def test_disagreeing_plans_average_with_exponential_age_weights() -> None:
    blender, origin = PlanBlender(0.5), Pose2D(0.0, 0.0, 0.0)
    blender(TrackedPlan(line(2.0, speed=4.0), origin, 0.0))  # the old plan keeps 2 m to the left, at 4 m/s
    new = TrackedPlan(line(0.0), origin, 0.5)  # the new one, from the same pose, goes straight at 10 m/s
    out = blender(new)
    w = math.exp(-1.0)  # age 0.5 s, tau 0.5 s
    # waypoints at 1.0 ... 4.0 s lie inside the old plan's horizon (it ends at 4.0 s), where the old plan puts the
    # ego at 4 (t + 0.5) m ahead, 2 m left (nearer than the new plan: no pull-back)
    assert out.waypoints[:7, 1] == pytest.approx(2 * w / (1 + w))
    assert out.waypoints[:7, 0] == pytest.approx(((4 * (T + 0.5)) * w + 10 * T)[:7] / (1 + w))
    assert out.waypoints[7] == pytest.approx(new.waypoints[7])  # 4.5 s: beyond the old horizon, the new plan alone
    assert (out.origin, out.stamp, out.dt, out.valid) == (new.origin, new.stamp, new.dt, True)
    assert not out.waypoints.flags.writeable


def test_a_plan_that_stops_is_followed_at_the_blends_speed() -> None:
    """The price of blending: a sudden stop is softened by the faster plans before it, until they fade."""
    blender, origin = PlanBlender(0.5), Pose2D(0.0, 0.0, 0.0)
    blender(TrackedPlan(line(0.0, speed=10.0), origin, 0.0))
    stop = TrackedPlan(np.zeros((8, 2)), origin, 0.5)  # at rest, from the same pose
    w = math.exp(-1.0)
    assert blender(stop).waypoints[:7, 0] == pytest.approx(10 * (T[:7] + 0.5) * w / (1 + w))
    later = TrackedPlan(np.zeros((8, 2)), origin, 3.5)  # 3 s on, the cruising plan weighs e^-7
    assert np.abs(blender(later).waypoints).max() < 0.1


def test_the_blend_is_made_in_the_world_frame() -> None:
    blender = PlanBlender(0.5)
    blender(TrackedPlan(line(0.0), Pose2D(0.0, 0.0, 0.0), 0.0))  # east along y = 0 at 10 m/s
    facing_north = Pose2D(5.0, 0.0, math.pi / 2)  # half a second later, yawed: the same path is to its right
    plan = TrackedPlan(facing_north.to_ego(np.stack([5.0 + 10.0 * T, np.zeros(8)], axis=1)), facing_north, 0.5)
    assert plan.waypoints[:, 1] == pytest.approx(-10.0 * T)
    assert blender(plan).waypoints == pytest.approx(plan.waypoints, abs=1e-9)


def test_old_plans_fade_out() -> None:
    blender, origin = PlanBlender(0.1), Pose2D(0.0, 0.0, 0.0)
    blender(TrackedPlan(line(3.0), origin, 0.0))
    new = TrackedPlan(line(0.0), origin, 1.0)  # 10 tau later: weight e^-10 < MIN_WEIGHT
    assert blender(new).waypoints == pytest.approx(new.waypoints)


@pytest.mark.parametrize("tau", [-0.1, math.inf, math.nan])
def test_bad_tau_is_refused(tau: float) -> None:
    with pytest.raises(ValueError, match="tau_s"):
        PlanBlender(tau)


def test_follower_blends_each_new_plan_once() -> None:
    gains = dataclasses.replace(HIGHWAY, plan_blend_tau_s=0.5)
    pose = Pose2D(0.0, 0.0, 0.0)
    old, new = TrackedPlan(line(2.0), pose, 0.0), TrackedPlan(line(-2.0), pose, 0.5)
    blending, plain = WaypointFollower(gains), WaypointFollower(dataclasses.replace(gains, plan_blend_tau_s=0.0))
    for follower in (blending, plain):
        follower.step(old, pose, 10.0, 0.0)
    first = blending.step(new, pose, 10.0, 0.5)
    again = blending.step(new, pose, 10.0, 0.55)  # the same plan object: not blended a second time
    alone = plain.step(new, pose, 10.0, 0.5)
    assert alone.aim[1] < first.aim[1] < 0  # pulled towards the old plan's left, still right of the line
    assert again.aim == pytest.approx(first.aim, abs=1e-9)
    blending.reset()  # forgets the earlier plans
    assert blending.step(new, pose, 10.0, 0.5).aim == pytest.approx(alone.aim)


@pytest.mark.parametrize("tau", [-1.0, math.inf])
def test_bad_blend_gain_is_named(tau: float) -> None:
    values = {f.name: getattr(HIGHWAY, f.name) for f in dataclasses.fields(HIGHWAY)} | {"plan_blend_tau_s": tau}
    with pytest.raises(GainsError, match="plan_blend_tau_s"):
        FollowerGains.from_dict(values, name="highway_env")
