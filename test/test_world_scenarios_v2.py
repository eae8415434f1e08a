"""Scenarios v2 (driving from standstill and at low speed): the frozen set, the world's queue, stop-and-go lead and
stop line, the start-from-rest metric, and the expert driving the new scenarios."""

from __future__ import annotations

import dataclasses
from importlib import resources

import numpy as np
import pytest
import yaml

from wamdiff_ros.world.closed_loop import ExpertPlanner, LoopConfig, run_episode
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.metrics import START_MOVE_M, Infraction, score_episode
from wamdiff_ros.world.road_mesh import road_layers
from wamdiff_ros.world.scenarios import ScenarioError, load_scenarios
from wamdiff_ros.world.sim import STUCK_TRAFFIC_S, ScriptedVehicle, World
from wamdiff_ros.world.summary import summarize

NEW = ("start_clear", "start_queue", "stop_and_go", "give_way_stop")


@pytest.fixture(scope="module")
def v2():
    return load_scenarios(version=2)


def test_v2_keeps_every_v1_scenario_unchanged_and_adds_the_low_speed_ones(v2):
    v1 = load_scenarios(version=1)
    assert v2.version == 2 and (v2.sim_hz, v2.blocked_s, v2.deviation_m, v2.wrong_lane_s) == (
        v1.sim_hz, v1.blocked_s, v1.deviation_m, v1.wrong_lane_s)
    for name, spec in v1.scenarios.items():
        assert v2.get(name) == spec
    assert set(v2.scenarios) == set(v1.scenarios) | set(NEW)
    assert v2.get("start_clear").ego_speed == v2.get("start_queue").ego_speed == 0.0
    assert v2.get("give_way_stop").stop_line and not v2.get("intersection").stop_line
    assert load_scenarios("v2").scenarios == v2.scenarios  # --scenario-file v2


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["highway"].update(stop_line=True), "stop_line is for intersections"),
    (lambda s: s["start_queue"]["traffic"]["queue"].pop("release_s"), "lacks ['release_s']"),
    (lambda s: s["intersection"]["traffic"].update(queue=s["start_queue"]["traffic"]["queue"]), "straight road"),
    (lambda s: s["start_clear"].update(ego_speed=-1.0), "ego_speed must be >= 0"),
])
def test_v2_fields_are_validated(tmp_path, v2, mutate, message):
    raw = yaml.safe_load((resources.files("wamdiff_ros.world") / "scenarios_v2.yaml").read_text())
    mutate(raw["scenarios"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=str(path)) as err:
        load_scenarios(path)
    assert message in str(err.value)


def _hold_still(world: World, seconds: float) -> None:
    for _ in range(round(seconds / world.dt)):
        world.step(-3.0 if world.ego_speed > 0 else 0.0, 0.0)


def test_queue_stands_past_the_stuck_traffic_limit_then_pulls_away_front_first(v2):
    spec = dataclasses.replace(v2.get("start_queue"), traffic={"queue": {
        "vehicles": 3, "first_gap_m": [10.0, 10.0], "gap_m": [3.0, 3.0], "release_s": [7.0, 7.0],
        "stagger_s": [1.0, 1.0], "speed": [10.0, 10.0]}})
    world = World(spec, seed=3, scenarios=v2)
    queue = world.scripted
    assert len(queue) == 3 and all(isinstance(v, ScriptedVehicle) and v.speed == 0.0 for v in queue)
    gaps = np.diff([world.ego.position[0]] + [v.position[0] for v in queue])
    np.testing.assert_allclose(gaps, [10.0, 8.0, 8.0])  # centre to centre: 5 m cars, 3 m gaps
    assert world.start_free_s == pytest.approx(9.0)  # the car before the ego leaves last ...
    _hold_still(world, 6.9)
    assert world.t > STUCK_TRAFFIC_S and all(v in world.road.vehicles for v in queue)  # standing, not stuck
    assert max(v.speed for v in queue) < 0.05
    _hold_still(world, 1.5)  # t = 8.4: the front car went at 7 s, the next at 8 s, the one before the ego waits
    assert queue[2].speed > 1.0 and queue[0].speed < 0.05  # to 9 s
    _hold_still(world, 4.0)
    assert all(v.speed > 1.0 for v in queue), [v.speed for v in queue]
    assert 9.0 < world.start_free_s < 12.4  # ... and the ego's start window opens once it is seen moving


def test_stop_and_go_lead_brakes_to_a_stop_stands_and_goes_twice(v2):
    world = World(v2.get("stop_and_go"), seed=11, scenarios=v2)
    lead, = world.scripted
    stops = [p for p in lead.phases if p[1] == 0.0]
    assert len(stops) == 2 and all(2.5 <= p[2] <= 4.0 for p in stops)
    speeds = []
    while world.t < lead.phases[-1][0] + 3.0:
        world.step(-6.0 if world.ego_speed > 0 else 0.0, 0.0)  # the ego stays out of the way
        speeds.append(lead.speed)
    speeds = np.asarray(speeds)
    standing = speeds < 0.05
    starts = np.flatnonzero(np.diff(standing.astype(int)) == 1)
    assert len(starts) == 2  # two stops
    decel = -np.diff(speeds)[starts[0] - 10:starts[0] - 2].mean() / world.dt
    assert stops[0][2] - 0.2 <= decel <= 6.0  # brakes at least as hard as its timetable says
    assert speeds[-1] > 2.0  # going again


def _approach(world: World, speed: float, stop: bool) -> None:
    """Drive the straight approach at ``speed``; with ``stop`` brake to a full stop 5 m before the box first."""
    junction = world.route.junction_m
    stopped = not stop
    while world.progress_m < junction + 3.0:
        target = 0.0 if not stopped and world.progress_m > junction - 5.0 - speed ** 2 / 6.0 else speed
        if not stopped and world.ego_speed < 0.05 and world.progress_m > junction - 8.0:
            stopped, target = True, speed
        world.step(np.clip(2.0 * (target - world.ego_speed), -3.0, 2.0), 0.0)


@pytest.mark.parametrize("stop", [False, True])
def test_stop_line_entering_the_box_without_a_full_stop_is_a_stop_infraction(v2, stop):
    world = World(v2.get("give_way_stop"), seed=2, scenarios=v2)
    _approach(world, 6.0, stop)
    kinds = [e.kind for e in world.events]
    assert kinds.count(Infraction.STOP_SIGN) == (0 if stop else 1)
    assert world.stopped_at_line == stop
    assert score_episode(world.episode_log("x", "paused")).infraction_penalty == pytest.approx(1.0 if stop else 0.8)


def test_expert_labels_an_ego_standing_short_of_the_stop_line_to_roll_up_to_it(v2):
    """A driver the expert labels (DAgger) stopped 25 m before the box: the expert's plan rolls up to the line and stops
    there -- not a stop where the ego stands, which would label every later frame "stay" -- and followed, it makes
    its full stop at the line and goes on."""
    world = World(v2.get("give_way_stop"), seed=1000003, scenarios=v2)
    junction = world.route.junction_m
    while world.progress_m < junction - 25.0 - world.ego_speed ** 2 / 4.0:
        world.step(np.clip(2.0 * (6.0 - world.ego_speed), -3.0, 2.0), 0.0)
    while world.ego_speed > 0.0:
        world.step(-2.0, 0.0)
    assert junction - 30.0 < world.progress_m < junction - 20.0 and not world.stopped_at_line
    plan = Expert(world).plan()
    reach = float(plan.waypoints[-1, 0])
    assert 3.0 < reach and world.progress_m + reach <= junction  # forward, and not into the box
    start = world.progress_m
    for _ in range(round(30.0 / 0.5)):  # follow its plans, a new one every 0.5 s, until the full stop is made
        target = float(np.hypot(*Expert(world).plan().waypoints[0])) / 0.5
        for _ in range(round(0.5 / world.dt)):
            world.step(np.clip(2.0 * (target - world.ego_speed), -4.0, 2.0), 0.0)
        if world.stopped_at_line:
            break
    assert world.stopped_at_line and world.progress_m > start + 10.0
    assert not [e for e in world.events if e.kind == Infraction.STOP_SIGN]


def test_stop_line_is_painted_across_the_approach_only_where_the_scenario_has_one(v2):
    with_line = World(v2.get("give_way_stop"), seed=0, scenarios=v2).geometry
    without = World(v2.get("intersection"), seed=0, scenarios=v2).geometry
    assert len(with_line.stop_lines) == 1 and without.stop_lines == ()
    (a, b), = with_line.stop_lines
    assert np.linalg.norm(b - a) == pytest.approx(4.0, abs=0.1)  # one lane wide
    assert len(road_layers(with_line)[2].vertices) == len(road_layers(without)[2].vertices) + 1


def test_start_from_rest_metric(v2):
    world = World(v2.get("start_clear"), seed=0, scenarios=v2)
    for _ in range(round(6.0 / world.dt)):
        world.step(1.0, 0.0)
    score = score_episode(world.episode_log("x", "paused"))
    assert score.start_moved_m == pytest.approx(0.5 * 1.0 * 5.0 ** 2, abs=0.5) and score.start_ok
    moving = score_episode(World(v2.get("stop_and_go"), seed=0, scenarios=v2).episode_log("x", "paused"))
    assert moving.start_moved_m is None and moving.start_ok is None
    still = dataclasses.replace(score, start_moved_m=START_MOVE_M - 0.1)
    totals = summarize([score, still, moving])["groups"][0]
    assert (totals["rest_starts"], totals["rest_starts_ok"]) == (2, 1)


@pytest.mark.parametrize("name, seed", [("start_queue", 1000001), ("stop_and_go", 1000000), ("give_way_stop", 1000003)])
def test_expert_drives_the_low_speed_scenarios(v2, name, seed):
    result = run_episode(v2.get(name), seed, ExpertPlanner(), LoopConfig(), v2)
    score = score_episode(result.log)
    assert score.end_reason == "completed" and score.driving_score == 100.0
    if name == "start_queue":
        speed = np.asarray(result.log.speed)
        assert speed[0] == 0.0 and speed.max() > 8.0
    if name == "stop_and_go":  # it stopped behind the lead and went again
        speed = np.asarray(result.log.speed)
        assert (speed < 0.1).any() and speed[-1] > 5.0
