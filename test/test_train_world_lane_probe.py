"""Tests for wamdiff_training.world.lane_probe (``wamdiff-train probe lane``): the ego lands where a case puts it on an
empty road, the expert's reference is pure lane keeping with the right signs, the summary scores the expert 1 and
constant velocity 0, bad cases are refused, the vision probe fits, and the CLI writes its report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from wamdiff_ros.world.closed_loop import ConstantVelocityPlanner, ExpertPlanner, PlanResult
from wamdiff_training.cli import main
from wamdiff_training.world import lane_probe as lp

SMALL = lp.cases(offsets=(-1.0, 0.5), headings=(0.0, 0.05), lanes=(1,), along=(0.0,))


@pytest.mark.parametrize("offset,heading", [(0.8, 0.0), (-0.6, 0.04), (0.0, -0.07)])
def test_place_puts_the_ego_at_the_case_pose_on_an_empty_road(offset, heading):
    world = lp.place(lp.ProbeCase(2, 6.0, offset, heading))
    lane = world.ego.lane
    s, lat = lane.local_coordinates(world.ego.position)
    assert world.ego.lane_index[2] == 2
    assert lat == pytest.approx(-offset)  # highway-env: positive lateral is right
    # world frame is mirrored: the ego's heading relative to the lane, counter-clockwise positive
    lane_heading_world = -lane.heading_at(s)
    assert world.ego_pose.heading - lane_heading_world == pytest.approx(heading)
    assert world.road.vehicles == [world.ego] and world.road.objects == []
    assert world.others() == []


def test_expert_reference_is_lane_keeping_back_to_the_centre():
    rows = lp.probe(ConstantVelocityPlanner(), lp.cases(offsets=(-1.0, 0.5), headings=(0.0,), lanes=(0, 2),
                                                        along=(0.0,)))
    for r in rows:  # heading 0: by 2 s the expert is back on the centre line, i.e. -offset sideways
        assert r.expert_y == pytest.approx(-r.case.offset_m, abs=0.05)
    (row,) = lp.probe(ConstantVelocityPlanner(), [lp.ProbeCase(1, 0.0, 0.0, 0.05)])
    assert row.expert_y < -1.0  # pointing left of the lane: the lane lies to the right (y < 0)


def test_summary_scores_the_expert_one_and_constant_velocity_zero():
    expert = lp.summarize(lp.probe(ExpertPlanner(), SMALL))
    assert expert["gain"] == pytest.approx(1.0) and expert["correlation"] == pytest.approx(1.0)
    assert expert["side_agreement"] == 1.0 and expert["mean_abs_gap_m"] == 0.0
    assert expert["clear_cases"] == expert["cases"] == len(SMALL)
    cv = lp.summarize(lp.probe(ConstantVelocityPlanner(), SMALL))
    assert cv["gain"] == 0.0 and cv["correlation"] == 0.0 and cv["side_agreement"] == 0.0
    assert cv["mean_abs_gap_m"] > 0.5


class _Mirror:
    """A planner that steers the wrong way: the expert's plan mirrored sideways, or an invalid answer."""

    name, needs_camera = "mirror", True

    def __init__(self, invalid_every: int = 0) -> None:
        self.calls, self.invalid_every = 0, invalid_every

    def reset(self, world) -> None:
        self.expert = ExpertPlanner()
        self.expert.reset(world)

    def plan(self, obs, route=None) -> PlanResult:
        self.calls += 1
        assert obs.frame is not None and obs.frame.image.shape[-1] == 3
        wp = self.expert.plan(obs).waypoints * np.array([1.0, -1.0])
        invalid = bool(self.invalid_every) and self.calls % self.invalid_every == 0
        return PlanResult(wp.astype(np.float32), valid=not invalid)


def test_summary_of_a_wrong_way_planner_and_invalid_answers():
    rows = lp.probe(_Mirror(invalid_every=2), SMALL)
    assert [r.planner_y is None for r in rows] == [False, True, False, True]
    s = lp.summarize(rows)
    assert s["valid"] == 2 and s["gain"] == pytest.approx(-1.0) and s["side_agreement"] == 0.0
    assert lp.summarize(lp.probe(_Mirror(invalid_every=1), SMALL[:1]))["gain"] is None
    json.dumps([r.to_json() for r in rows])


@pytest.mark.parametrize("case,needle", [(lp.ProbeCase(3, 0.0, 0.0, 0.0), "lanes 0..2"),
                                         (lp.ProbeCase(1, 0.0, 2.5, 0.0), "offset"),
                                         (lp.ProbeCase(1, 0.0, 0.0, 0.5), "heading")])
def test_bad_cases_are_refused(case, needle):
    with pytest.raises(lp.LaneProbeError, match=needle):
        lp.place(case)


def test_no_cases_and_too_few_vision_frames_are_refused():
    with pytest.raises(lp.LaneProbeError, match="no probe cases"):
        lp.cases(offsets=())
    with pytest.raises(lp.LaneProbeError, match="too few"):
        lp.vision_probe(None, SMALL)


def test_random_cases_are_seeded_and_in_range():
    a, b = lp.random_cases(50, seed=3), lp.random_cases(50, seed=3)
    assert a == b and a != lp.random_cases(50, seed=4)
    assert all(abs(c.offset_m) <= 1.8 and abs(c.heading_rad) <= 0.08 and c.lane in lp.LANES for c in a)


def test_vision_probe_fits_on_the_tiny_random_model():
    from wamdiff_ros.model import tiny_random

    out = lp.vision_probe(tiny_random(), lp.random_cases(30, seed=1), held_out=0.3)
    assert out["frames"] == 30 and out["held_out"] == 9
    assert all(math.isfinite(out[k]) and out[k] <= 1.0 for k in ("offset_r2", "heading_r2"))


def test_cli_writes_rows_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lp, "cases", lambda: SMALL)
    out = tmp_path / "probe.json"
    assert main(["probe", "lane", "--model", "tiny-random", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-random" and report["waypoint"] == lp.WAYPOINT
    assert len(report["rows"]) == len(SMALL) and report["summary"]["cases"] == len(SMALL)
    assert "vision" not in report
    text = capsys.readouterr().out
    assert "| offset (m) | heading (rad) | expert y | model y |" in text and "summary: cases 4" in text


def test_cli_argument_errors(tmp_path):
    with pytest.raises(SystemExit):
        main(["probe", "lane", "--model", str(tmp_path / "missing")])
    for bad in ("-1", "5"):
        with pytest.raises(SystemExit):
            main(["probe", "lane", "--model", "tiny-random", "--vision", bad])
