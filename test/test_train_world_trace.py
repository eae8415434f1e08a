"""Tests for wamdiff_training.world.trace (``wamdiff-train trace``): the expert traced against itself never parts,
constant velocity parts from the expert where a turn begins, every row carries the route points the planner was given
and a model's its plans under other route lines, and the CLI writes its JSON and PNG and refuses bad arguments."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.world.closed_loop import ConstantVelocityPlanner, ExpertPlanner, LoopConfig, ModelPlanner
from wamdiff_ros.world.scenarios import load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.cli import main as train_main
from wamdiff_training.world import trace as tr
from wamdiff_training.world.commands import trace_main

SCENARIOS = load_scenarios()
LEFT_TURN_SEED = 500100  # an intersection route that turns left (validation seeds)
CONFIG = LoopConfig(mode="paused", plan_hz=2.0, plan_blend_tau_s=0.0)


def test_the_expert_traced_against_itself_never_parts():
    rows, log = tr.trace(ExpertPlanner(), SCENARIOS.get("intersection"), LEFT_TURN_SEED, CONFIG, SCENARIOS)
    assert log.end_reason == "completed" and log.planner == "expert"
    assert len(rows) == pytest.approx(log.t[-1] * CONFIG.plan_hz, abs=1.5)  # a row per plan request
    assert np.allclose(np.diff([r.t for r in rows]), 1.0 / CONFIG.plan_hz)
    assert rows[0].command == "left" and all(r.route.shape == (len(fmt.ROUTE_AHEAD_M), 2) for r in rows)
    assert max(r.gap_m for r in rows) < 1e-6  # the labelling expert plans from the driving expert's state
    assert max(abs(r.expert[-1, 1]) for r in rows) > 10.0  # ... through the whole turn
    s = tr.summarize(rows)
    assert s["plans"] == len(rows) and s["invalid_plans"] == 0 and s["parts_at_s"] is None and s["max_gap_m"] < 1e-6


def test_constant_velocity_parts_from_the_expert_where_the_turn_begins(tmp_path):
    rows, log = tr.trace(ConstantVelocityPlanner(), SCENARIOS.get("intersection"), LEFT_TURN_SEED, CONFIG, SCENARIOS)
    assert log.end_reason != "completed"
    for r in rows:  # the planner's own plans, unchanged: the velocity held for 4 s
        t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
        assert np.allclose(r.planner, t * r.planner[0] / fmt.WAYPOINT_DT_S)
    s = tr.summarize(rows)
    assert s["parts_at_s"] is not None and 0.0 < s["parts_at_s"] <= log.t[-1]
    k = next(i for i, r in enumerate(rows) if round(r.t, 2) == s["parts_at_s"])
    first = rows[k]
    assert first.sideways_gap_m <= -tr.PARTS_M  # the expert turns left, constant velocity keeps straight on
    assert all(abs(r.sideways_gap_m) < tr.PARTS_M for r in rows[:k])
    row = json.loads(json.dumps(first.to_json()))
    assert row["gap_m"] == pytest.approx(first.gap_m, abs=0.01) and len(row["expert"]) == fmt.NUM_WAYPOINTS
    png = tr.plot(rows, log, tmp_path / "cv.png", road=World(SCENARIOS.get("intersection"), LEFT_TURN_SEED).geometry)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_row_carries_its_route_points_and_its_plans_under_other_routes(short_scenario_file):
    from wamdiff_ros.planner import Planner

    scenarios = load_scenarios(short_scenario_file)
    spec = scenarios.get("intersection")
    planner = ModelPlanner(Planner.from_pretrained("wamdiff-tiny"))  # the shipped student reads the route line
    rows, log = tr.trace(planner, spec, LEFT_TURN_SEED, CONFIG, scenarios, route_variants=("straight", "mirror"))
    assert len(rows) >= 5 and all(r.route.shape == (len(fmt.ROUTE_AHEAD_M), 2) for r in rows)
    assert np.allclose(rows[0].route, World(spec, LEFT_TURN_SEED, scenarios).route_points())
    assert all(set(r.variants) == {"straight", "mirror"} for r in rows)
    assert np.allclose(rows[0].route[:, 1], 0.0)  # the route starts straight ahead, so the straight variant's
    assert np.allclose(rows[0].variants["straight"], rows[0].planner)  # prompt is the real one: the same plan
    assert json.loads(json.dumps(rows[-1].to_json()))["variants"].keys() == {"straight", "mirror"}


def test_route_variants():
    route = np.array([[9.8, 1.3], [17.0, 18.5]])
    assert np.allclose(tr.route_variant("mirror", route), [[9.8, -1.3], [17.0, -18.5]])
    assert np.allclose(tr.route_variant("straight", route), [[d, 0.0] for d in fmt.ROUTE_AHEAD_M])
    with pytest.raises(ValueError, match="expected one of"):
        tr.route_variant("uphill", route)
    with pytest.raises(ValueError, match="expected some of straight, mirror, got uphill"):
        tr.TracingPlanner(ConstantVelocityPlanner(), ("uphill",))


def test_cli_writes_the_trace_and_refuses_bad_arguments(short_scenario_file, tmp_path, capsys):
    out = tmp_path / "trace"
    argv = ["--model", "expert", "--scenario", "highway", "--seed", "7", "--scenario-file",
            str(short_scenario_file), "--out", str(out)]
    assert train_main(["trace", *argv]) == 0  # wamdiff-train trace
    report = json.loads((out / "trace_highway_seed7.json").read_text())
    assert report["model"] == "expert" and report["summary"]["plans"] == len(report["rows"]) >= 5
    assert report["summary"]["max_gap_m"] == 0.0 and report["plan_hz"] == 2.0
    assert (out / "trace_highway_seed7.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "| t (s) | speed (m/s) |" in printed and "summary: plans" in printed
    for bad, needle in ((["--scenario", "nowhere"], "no scenario 'nowhere'"),
                        (["--model", str(tmp_path / "missing")], "neither a checkpoint folder"),
                        (["--plan-hz", "0"], "plan_hz"),
                        (["--route-variants", "mirror"], "does not read the route line"),
                        (["--route-variants", "uphill"], "expected some of straight, mirror")):
        with pytest.raises(SystemExit) as exc:
            trace_main([*argv, *bad])
        assert exc.value.code == 2 and needle in capsys.readouterr().err
