"""The plan checker (``wamdiff_ros.plan_check``): each violation kind, moving vs standing, the token view reflection
uses, and the expert's own plans passing the default limits."""

from __future__ import annotations

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.plan_check import AnswerCheck, Limits, check_plan, failing_waypoints, steps_back, summary


def straight(speed: float, n: int = 8) -> np.ndarray:
    return np.stack([speed * fmt.WAYPOINT_DT_S * np.arange(1, n + 1), np.zeros(n)], axis=1)


def kinds(violations, waypoint: int | None = None) -> set[str]:
    return {v.kind for v in violations if waypoint is None or v.waypoint == waypoint}


def test_a_steady_plan_passes():
    for speed in (0.0, 2.0, 10.0, 27.0):
        assert check_plan(straight(speed), (speed, 0.0)) == []


def test_a_tens_digit_lost_steps_back_while_moving():
    wp = straight(10.0)
    wp[4, 0] -= 10.0  # 25.0 -> 15.0, behind waypoint 4 at 20.0
    v = check_plan(wp, (10.0, 0.0))
    assert "back" in kinds(v, 4)
    assert failing_waypoints(v)[0] == 4
    assert "behind" in summary(v) and summary(v).startswith("implausible: waypoint 5")
    assert steps_back(wp)


def test_standing_jitter_is_not_stepping_back():
    wp = np.zeros((8, 2))
    wp[:, 0] = [0.0, 0.01, -0.02, 0.0, -0.3, 0.0, 0.02, -0.01]
    assert check_plan(wp, (0.0, 0.0)) == []
    wp[4, 0] = -0.6  # beyond the tolerance, but the car is not moving forward: no violation
    assert "back" not in kinds(check_plan(wp, (0.0, 0.0)))
    assert "back" in kinds(check_plan(wp, (5.0, 0.0)))  # moving: the same plan steps back


def test_speed_limit():
    wp = straight(45.0)
    assert "speed" in kinds(check_plan(wp, (45.0, 0.0)), 0)
    assert "speed" not in kinds(check_plan(straight(39.0), (39.0, 0.0)))


def test_acceleration_against_the_ego_speed_first():
    # at rest, a first step of 11 m is 22 m/s reached in 0.5 s: 44 m/s²
    wp = straight(22.0)
    assert "accel" in kinds(check_plan(wp, (0.0, 0.0)), 0)
    assert "accel" not in kinds(check_plan(wp, (22.0, 0.0)))
    # braking from 20 m/s to a stand within one step: 40 m/s²
    stop = straight(20.0)
    stop[3:] = stop[2]
    assert "decel" in kinds(check_plan(stop, (20.0, 0.0)), 3)
    # the same stop from 12 m/s asks 24 m/s²: what the expert's give-way plans ask, allowed
    slow = straight(12.0)
    slow[3:] = slow[2]
    assert check_plan(slow, (12.0, 0.0)) == []


def test_lateral_and_curvature():
    wp = straight(10.0)
    wp[5:, 1] = 10.0  # a sideways bin off by one: 10 m aside in one step
    v = check_plan(wp, (10.0, 0.0))
    assert "lateral" in kinds(v, 5)
    assert "sideways" in [x for x in v if x.kind == "lateral"][0].reason
    crawl_turn = np.array([[1.0, 0.0], [2.0, 0.0], [2.0, 1.5], [2.0, 3.0], [2.0, 4.5], [2.0, 6.0], [2.0, 7.5],
                           [2.0, 9.0]])  # a right angle at 3 m/s: 1.5 m radius
    assert "radius" in [x for x in check_plan(crawl_turn, (2.0, 0.0)) if x.kind == "lateral"][0].reason
    # a gentle curve passes: 60 m radius at 10 m/s is 1.7 m/s²
    t = np.arange(1, 9) * 5.0 / 60.0
    arc = np.stack([60 * np.sin(t), 60 * (1 - np.cos(t))], axis=1)
    assert check_plan(arc, (10.0, 0.0)) == []
    # short steps (a stop) are not judged for curvature
    crawl = np.stack([np.linspace(0.1, 0.8, 8), [0, 0.3, 0, 0.3, 0, 0.3, 0, 0.3]], axis=1)
    assert "lateral" not in kinds(check_plan(crawl, (0.5, 0.0)))


def test_route_distance_only_when_asked():
    wp = straight(10.0)
    wp[:, 1] = 8.0
    route = np.array([[10.0, 0.0], [30.0, 0.0]])
    assert "route" not in kinds(check_plan(wp, (10.0, 0.0), route))
    v = check_plan(wp, (10.0, 0.0), route, Limits(max_route_offset_m=4.0, max_lateral_mps2=100, max_curvature=10))
    assert "route" in kinds(v, 0)


def test_upto_looks_only_at_the_waypoints_before():
    wp = straight(10.0)
    wp[6, 0] = 0.0
    assert check_plan(wp, (10.0, 0.0), upto=5) == []
    assert failing_waypoints(check_plan(wp, (10.0, 0.0), upto=6)) == [6]


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_decel_mps2"):
        Limits(max_decel_mps2=0.0)
    with pytest.raises(ValueError, match="max_route_offset_m"):
        Limits(max_route_offset_m=-1.0)


@pytest.mark.parametrize("version", fmt.FORMAT_VERSIONS)
def test_answer_check_on_tokens(version):
    """One character per token (the shipped tokenizer's answer): spans cover a waypoint's two numbers, no commas;
    what follows EOS is ignored; ``passes`` judges a waypoint given the ones before it."""
    wp = straight(10.0)
    wp[4, 0] -= 10.0
    text = fmt.format_waypoints(wp, version)
    eos = 0
    tokens = [ord(c) for c in text] + [eos, ord("9"), ord("9")]
    check = AnswerCheck(chr, eos, (10.0, 0.0))
    assert check.failing(tokens)[0] == 4
    span = check.span(tokens, 4)
    numbers = text.split(",")
    assert "".join(chr(tokens[p]) for p in span) == numbers[8] + numbers[9]
    assert check.passes(tokens, 3) and not check.passes(tokens, 4)
    fixed = fmt.format_waypoints(straight(10.0), version)
    assert check.failing([ord(c) for c in fixed] + [eos]) == []
    assert check.failing([ord(c) for c in "1.0,2.0"] + [eos]) == []  # does not parse: nothing to judge


def test_the_expert_plans_pass_the_default_limits():
    """Every plan the CPU world's expert makes on a cut episode of each scenario passes: the limits catch decoding
    errors, not the driving the model imitates (the limits' docstring quotes the full measurement)."""
    from wamdiff_ros.world.scenarios import load_scenarios
    from wamdiff_training.world.demonstrations import RolloutConfig, rollout

    scenarios = load_scenarios()
    seen = 0
    for spec in scenarios.select("all"):
        episode = rollout(spec, 3000, RolloutConfig(questions_per_frame=0, max_seconds=8.0), scenarios)
        for frame in episode.frames:
            seen += 1
            assert check_plan(frame.waypoints, frame.velocity) == [], (spec.name, frame.t, frame.waypoints)
    assert seen >= 50
