"""Tests for wamdiff_ros.world.expert: the privileged expert's plan format, and its closed-loop driving through
``run_episode`` (completes every scenario, merges into the main road, overtakes the slow lead car on the highway)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.geometry import wrap_angle
from wamdiff_ros.world.closed_loop import ExpertPlanner, LoopConfig, Observation, PlanResult, run_episode
from wamdiff_ros.world.expert import Expert, ExpertPlan
from wamdiff_ros.world.metrics import COLLISIONS, score_episode
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, load_scenarios
from wamdiff_ros.world.sim import World, mirror
from wamdiff_training.world.demonstrations import recording_gains

SEED = SPLIT_SEED_BASE["test"]
EXIT_DEG = {"left": 90.0, "right": -90.0, "straight": 0.0}
# the test-split seed each scenario is driven on (all four complete with DS 100 at SEED + 0..3)
SEEDS = {"highway": SEED, "merge": SEED, "roundabout": SEED, "intersection": SEED}


@pytest.fixture(scope="module")
def scenarios():
    return load_scenarios()


@pytest.fixture(scope="module")
def expert_run(scenarios):
    """One closed-loop expert episode per scenario (cached for the module): (RecordingExpert, EpisodeResult)."""
    cache = {}

    def run(name: str):
        if name not in cache:
            rec = RecordingExpert()
            gains = recording_gains()  # the expert followed as it drives for the data
            cache[name] = rec, run_episode(scenarios.get(name), SEEDS[name], rec, LoopConfig(), scenarios, gains)
        return cache[name]

    return run


class RecordingExpert(ExpertPlanner):
    """The expert, keeping its world and every ExpertPlan (with the ego's lane and the lead car at that time)."""

    def reset(self, world: World) -> None:
        super().reset(world)
        self.world = world
        self.lead = world.road.vehicles[1] if world.spec.kind == "highway" else None
        self.plans: list[tuple[float, ExpertPlan, tuple, np.ndarray | None]] = []

    def plan(self, obs: Observation, route=None) -> PlanResult:
        p = self._expert.plan()
        lead = None if self.lead is None else self.lead.position.copy()
        self.plans.append((obs.world.t, p, obs.world.ego.lane_index, lead))
        return PlanResult(p.waypoints)


@pytest.mark.parametrize("seed", [SEED, SEED + 1, SEED + 2])
def test_expert_plan_format_on_the_highway(scenarios, seed):
    w = World(scenarios.get("highway"), seed, scenarios)
    plan = Expert(w).plan()
    assert isinstance(plan, ExpertPlan)
    wp = np.asarray(plan.waypoints)
    assert wp.shape == (fmt.NUM_WAYPOINTS, 2) == (8, 2)
    assert np.isfinite(wp).all()
    assert np.all(np.diff(wp[:, 0]) > 0) and wp[0, 0] > 0  # advancing along x (ego frame: forward)
    # 0.5 s apart at about the ego's 24 m/s (it may brake for the lead, never exceeds the desired 28 m/s + a bit)
    steps = np.linalg.norm(np.diff(np.vstack([[0.0, 0.0], wp]), axis=0), axis=1)
    assert np.all(steps < 0.5 * (w.spec.desired_speed + 2.0))
    assert np.all(np.abs(wp[:, 1]) < 4.5)  # at most one lane to either side
    assert plan.lane_id in range(w.spec.lanes)
    assert isinstance(plan.reason, str) and plan.reason
    assert plan.accel <= 1.5


def test_expert_waypoints_advance_through_a_highway_episode(expert_run):
    rec, result = expert_run("highway")
    assert result.log.end_reason == "completed"
    wps = np.array([p.waypoints for _, p, _, _ in rec.plans])
    assert wps.shape == (len(rec.plans), 8, 2)
    assert len(rec.plans) == len(result.log.plan_latency_s)
    assert np.isfinite(wps).all()
    assert np.all(np.diff(wps[:, :, 0], axis=1) > 0)  # every plan, lane changes included, moves forward
    assert np.all(wps[:, 0, 0] > 0)
    assert any(p.reason.startswith("lane change") for _, p, _, _ in rec.plans)


@pytest.mark.parametrize("name", list(SEEDS))
def test_expert_completes_each_scenario(scenarios, expert_run, name):
    spec = scenarios.get(name)
    rec, result = expert_run(name)
    assert result.log.planner == "expert" and result.log.seed == SEEDS[name]
    log, score = result.log, score_episode(result.log)
    assert log.end_reason == "completed", (name, log.end_reason, [e.to_json() for e in log.events])
    assert not [e for e in log.events if e.kind in COLLISIONS]
    assert score.route_completion == pytest.approx(100.0, abs=1e-6)
    assert score.driving_score >= 95.0, (name, score)
    assert log.t[-1] < spec.duration_s
    assert log.progress_m[-1] >= log.route_length_m - 1e-6
    if name in ("roundabout", "intersection"):  # it left by the commanded exit
        change = math.degrees(wrap_angle(log.heading[-1] - log.heading[0]))
        assert abs(change - EXIT_DEG[rec.world.exit_direction]) < 45.0, (rec.world.exit_direction, change)


def test_expert_merges_into_the_main_road(expert_run):
    rec, result = expert_run("merge")
    w = rec.world
    assert result.log.end_reason == "completed"
    a, b, lane = w.ego.lane_index
    assert (a, b) == ("c", "d") and lane in (0, 1)  # the main road's two lanes; the ramp lane was ("b", "c", 2)
    main = [mirror(w.road.network.get_lane(("c", "d", i)).position(50.0, 0.0))[1] for i in (0, 1)]
    assert min(abs(w.ego_pose.y - y) for y in main) < 0.5
    assert any(p.reason.startswith("lane change") for _, p, _, _ in rec.plans)
    assert ("b", "c", 2) in {lane for _, _, lane, _ in rec.plans}  # it did come down the ramp lane


def test_expert_overtakes_the_slow_lead_car(scenarios, expert_run):
    spec = scenarios.get("highway")
    rec, result = expert_run("highway")
    w, log = rec.world, result.log
    assert log.end_reason == "completed"
    lead_speed0 = float(spec.traffic["lead_speed"][1])
    lead_x0 = rec.plans[0][3][0]
    assert lead_x0 > w.spec.traffic["lead_gap_m"][0] + log.x[0]  # the lead starts ahead, in the ego's lane
    # ahead of the lead car at the end, by more than a car that never exceeded the lead's top speed could be
    assert w.ego.position[0] > rec.lead.position[0] + 20.0
    assert log.x[-1] > lead_x0 + lead_speed0 * log.t[-1]
    # at some plan the lead was ahead, later behind
    ego_x = np.interp([t for t, _, _, _ in rec.plans], log.t, log.x)  # x is not mirrored: same in both frames
    ahead = [lead[0] > x for (_, _, _, lead), x in zip(rec.plans, ego_x)]
    assert ahead[0] and not ahead[-1]
    assert len({lane[2] for _, _, lane, _ in rec.plans}) >= 2  # it changed lanes to do it
