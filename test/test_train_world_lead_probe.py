"""Tests for wamdiff_training.world.lead_probe (``wamdiff-train probe lead``): the row lands where a case puts it, the
expert brakes for a near row and not on an empty road, the summary scores the expert 1 and constant velocity 0, bad
cases are refused, the vision probe fits, and the CLI writes its report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from wamdiff_ros.world.closed_loop import ConstantVelocityPlanner, ExpertPlanner, PlanResult
from wamdiff_training.cli import main
from wamdiff_training.world import lead_probe as ld

SMALL = ld.cases(lanes=(1,), gaps=(10.0, 50.0, None), speeds=(20.0, 26.0))


@pytest.mark.parametrize("lane,gap", [(0, 10.0), (2, 35.0), (1, None)])
def test_place_puts_the_ego_and_a_row_across_the_road(lane, gap):
    world = ld.place(ld.LeadCase(lane, gap, 22.0))
    ego = world.ego
    assert ego.lane_index[2] == lane and ego.speed == 22.0 and world.road.objects == []
    others = world.road.vehicles[1:]
    if gap is None:
        assert world.road.vehicles == [ego] and world.others() == []
        return
    assert sorted(v.lane_index[2] for v in others) == [0, 1, 2]  # one car per lane: no lane change gets round
    s_ego = ego.lane.local_coordinates(ego.position)[0]
    for v in others:
        ahead = v.lane.local_coordinates(v.position)[0] - s_ego
        assert ahead == pytest.approx(gap + (0.0 if v.lane_index[2] == lane else ld.ROW_STAGGER_M))
        assert v.speed == ld.ROW_SPEED
    assert len(world.others()) == 3


def test_the_expert_brakes_for_a_near_row_and_not_on_an_empty_road():
    rows = {(r.case.gap_m, r.case.ego_speed): r.expert_slowdown for r in ld.probe(ConstantVelocityPlanner(), SMALL)}
    assert rows[(10.0, 20.0)] >= ld.BRAKE_M and rows[(10.0, 26.0)] >= ld.BRAKE_M
    assert rows[(None, 20.0)] < 0 and rows[(None, 26.0)] < 0  # an empty road: it speeds up to the wanted 28 m/s
    assert rows[(10.0, 26.0)] > rows[(50.0, 26.0)]  # nearer: harder
    held = np.array([[k * 10.0, 0.0] for k in range(1, 9)])  # 20 m/s held
    assert ld.slowdown(held, 20.0) == pytest.approx(0.0) and ld.slowdown(held, 25.0) == pytest.approx(10.0)


def test_summary_scores_the_expert_one_and_constant_velocity_zero():
    expert = ld.summarize(ld.probe(ExpertPlanner(), SMALL))
    assert expert["gain"] == pytest.approx(1.0) and expert["correlation"] == pytest.approx(1.0)
    assert expert["mean_abs_gap_m"] == 0.0 and expert["brake_recall"] == 1.0 and expert["false_brakes"] == 0.0
    assert 0 < expert["braking_cases"] < len(SMALL)
    cv = ld.summarize(ld.probe(ConstantVelocityPlanner(), SMALL))
    assert cv["gain"] == 0.0 and cv["correlation"] == 0.0 and cv["brake_recall"] == 0.0
    assert cv["false_brakes"] == 0.0 and cv["mean_abs_gap_m"] > 5.0


class _Reckless:
    """A planner that speeds up where the expert brakes (the expert's slow-down negated), or answers invalidly."""

    name, needs_camera = "reckless", True

    def __init__(self, invalid_every: int = 0) -> None:
        self.calls, self.invalid_every = 0, invalid_every

    def reset(self, world) -> None:
        self.expert = ExpertPlanner()
        self.expert.reset(world)
        self.speed = world.ego_speed

    def plan(self, obs, route=None) -> PlanResult:
        self.calls += 1
        assert obs.frame is not None and obs.frame.image.shape[-1] == 3
        wp = np.array(self.expert.plan(obs).waypoints, dtype=np.float64)
        wp[ld.WAYPOINT - 1, 0] = 2 * self.speed * ld.HORIZON_S - wp[ld.WAYPOINT - 1, 0]
        invalid = bool(self.invalid_every) and self.calls % self.invalid_every == 0
        return PlanResult(wp.astype(np.float32), valid=not invalid)


def test_summary_of_a_reckless_planner_and_invalid_answers():
    rows = ld.probe(_Reckless(invalid_every=2), SMALL)
    assert [r.planner_slowdown is None for r in rows] == [False, True] * 3
    s = ld.summarize(rows)
    assert s["valid"] == 3 and s["gain"] == pytest.approx(-1.0, abs=1e-3) and s["brake_recall"] == 0.0
    assert ld.summarize(ld.probe(_Reckless(invalid_every=1), SMALL[:1]))["gain"] is None
    json.dumps([r.to_json() for r in rows])


@pytest.mark.parametrize("case,needle", [(ld.LeadCase(3, 20.0, 20.0), "lanes 0..2"),
                                         (ld.LeadCase(1, 5.0, 20.0), "gap"),
                                         (ld.LeadCase(1, 150.0, 20.0), "gap"),
                                         (ld.LeadCase(1, 20.0, 0.0), "speeds"),
                                         (ld.LeadCase(1, 20.0, 20.0, -1.0), "speeds")])
def test_bad_cases_are_refused(case, needle):
    with pytest.raises(ld.LeadProbeError, match=needle):
        ld.place(case)


def test_no_cases_and_too_few_vision_frames_are_refused():
    with pytest.raises(ld.LeadProbeError, match="no probe cases"):
        ld.cases(gaps=())
    with pytest.raises(ld.LeadProbeError, match="too few"):
        ld.vision_probe(None, SMALL * 4)  # 24 cases, but only 16 with a row


def test_random_cases_are_seeded_and_in_range():
    a, b = ld.random_cases(50, seed=3), ld.random_cases(50, seed=3)
    assert a == b and a != ld.random_cases(50, seed=4)
    assert all(8.0 <= c.gap_m <= 80.0 and c.lane in ld.LANES for c in a)


def test_vision_probe_fits_on_the_tiny_random_model():
    from wamdiff_ros.model import tiny_random

    out = ld.vision_probe(tiny_random(), ld.random_cases(30, seed=1) + [ld.LeadCase(0, None, 20.0)], held_out=0.3)
    assert out["frames"] == 30 and out["held_out"] == 9  # the case without a row is left out
    assert all(math.isfinite(out[k]) and out[k] <= 1.0 for k in ("gap_r2", "inverse_gap_r2"))


def test_cli_writes_rows_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ld, "cases", lambda: SMALL)
    out = tmp_path / "probe.json"
    assert main(["probe", "lead", "--model", "tiny-random", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-random" and report["brake_m"] == ld.BRAKE_M and report["waypoint"] == ld.WAYPOINT
    assert len(report["rows"]) == len(SMALL) and report["summary"]["cases"] == len(SMALL)
    assert "vision" not in report
    text = capsys.readouterr().out
    assert "| row ahead (m) | ego speed (m/s) | expert slow-down | model slow-down |" in text
    assert "| 10 | 20 |" in text and "| none | 26 |" in text and "summary: cases 6" in text


def test_cli_argument_errors(tmp_path):
    with pytest.raises(SystemExit):
        main(["probe", "lead", "--model", str(tmp_path / "missing")])
    for bad in ("-1", "5"):
        with pytest.raises(SystemExit):
            main(["probe", "lead", "--model", "tiny-random", "--vision", bad])
