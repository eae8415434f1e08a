"""Tests for wamdiff_ros.world.evaluate (``wamdiff-eval closed-loop``): the report files of a baselines-only run, both
modes, the tiny default model end to end with a video, and argument errors. Scenarios come from a copy of the v1 file
with 3 s durations so that every run stays short; one worker (no process pool)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conftest import SHORT_SCENARIO_S as SHORT_S

from wamdiff_ros.cli import add_decode_settings_args, decode_overrides
from wamdiff_ros.world.evaluate import DEFAULT_SEED, main
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE

@pytest.fixture(scope="module")
def short_yaml(short_scenario_file) -> str:
    return str(short_scenario_file)


def run(out: Path, short_yaml: str, *extra: str, model: str | None = "none", scenarios: str = "highway,roundabout",
        videos: str = "0") -> tuple[dict, str]:
    """``model=None`` leaves --model out (the default model, tiny-random)."""
    argv = ["closed-loop", *(["--model", model] if model is not None else []), "--scenarios", scenarios,
            "--episodes", "1", "--workers", "1", "--videos", videos, "--out", str(out), "--no-progress",
            "--scenario-file", short_yaml, *extra]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def rows(md: str) -> set[tuple[str, str]]:
    """(planner, mode) of the main table's rows."""
    out = set()
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 11 and cells[0] not in ("planner", "---"):
            out.add((cells[0], cells[1]))
    return out


def test_baselines_report(tmp_path, short_yaml, capsys):
    report, md = run(tmp_path / "a", short_yaml)
    assert DEFAULT_SEED == SPLIT_SEED_BASE["test"]
    episodes = report["episodes"]
    assert len(episodes) == 2 * 2  # 2 scenarios x (expert, constant_velocity) x 1 episode x paused
    assert {(e["scenario"], e["planner"], e["mode"]) for e in episodes} == {
        (s, p, "paused") for s in ("highway", "roundabout") for p in ("expert", "constant_velocity")}
    assert {e["seed"] for e in episodes} == {DEFAULT_SEED}
    for e in episodes:
        assert 0.0 <= e["driving_score"] <= 100.0 and 0.0 <= e["route_completion"] <= 100.0
        assert e["duration_s"] <= SHORT_S + 1e-6
        assert e["forward_calls_per_token"] is None
    summary = report["summary"]
    assert {(g["planner"], g["mode"]) for g in summary["groups"]} == {("expert", "paused"),
                                                                      ("constant_velocity", "paused")}
    assert all(g["episodes"] == 2 for g in summary["groups"])
    r = report["run"]
    assert r["model"] is None and r["modes"] == ["paused"]
    assert r["planners"] == ["expert", "constant_velocity"]
    assert r["scenario_set"] == short_yaml and r["scenario_version"] == 1
    assert r["episodes_per_scenario"] == 1 and r["first_seed"] == DEFAULT_SEED and r["workers"] == 1
    assert set(r["throughput"]) == {"expert/paused", "constant_velocity/paused"}
    for t in r["throughput"].values():
        assert t["sim_steps"] > 0 and t["wall_s"] >= 0 and t["sim_steps_per_s"] > 0
    # two 3 s episodes at 20 Hz per planner, unless one ended early
    assert r["throughput"]["expert/paused"]["sim_steps"] <= 2 * 60
    assert rows(md) == {("expert", "paused"), ("constant_velocity", "paused")}
    assert "## Throughput" in md and "expert/paused" in md
    assert sorted(p.name for p in (tmp_path / "a" / "bev").iterdir()) == [
        f"highway_seed{DEFAULT_SEED}.png", f"roundabout_seed{DEFAULT_SEED}.png"]
    assert not list((tmp_path / "a").glob("*.mp4"))
    assert "report:" in capsys.readouterr().out


def test_realtime_flag_gives_both_modes(tmp_path, short_yaml):
    report, md = run(tmp_path / "b", short_yaml, "--realtime", "--baselines", "constant_velocity",
                     scenarios="highway")
    assert {(e["planner"], e["mode"]) for e in report["episodes"]} == {("constant_velocity", "paused"),
                                                                       ("constant_velocity", "realtime")}
    assert report["run"]["modes"] == ["paused", "realtime"]
    assert set(report["run"]["throughput"]) == {"constant_velocity/paused", "constant_velocity/realtime"}
    assert rows(md) == {("constant_velocity", "paused"), ("constant_velocity", "realtime")}


def test_perturbations_are_recorded_per_episode_and_in_the_run(tmp_path, short_yaml):
    report, _ = run(tmp_path / "p", short_yaml, "--perturb", "latency=2,frame_drop", "--baselines", "expert",
                    scenarios="highway")
    assert report["run"]["perturb"] == "latency=2+frame_drop=1"
    (episode,) = report["episodes"]
    assert episode["perturbation"]["label"] == "latency=2+frame_drop=1" and episode["perturbation"]["camera_ticks"] > 0


def test_explicit_modes(tmp_path, short_yaml):
    report, _ = run(tmp_path / "c", short_yaml, "--modes", "realtime", "--baselines", "expert", scenarios="merge")
    assert {(e["planner"], e["mode"], e["scenario"]) for e in report["episodes"]} == {("expert", "realtime", "merge")}


def test_default_model_end_to_end_with_video(tmp_path, short_yaml):  # the shipped wamdiff-tiny
    out = tmp_path / "m"
    json_copy = tmp_path / "copy" / "r.json"
    report, md = run(out, short_yaml, "--realtime", "--baselines", "none", "--json", str(json_copy),
                     model=None, scenarios="highway", videos="1")
    assert report["run"]["model"] == "wamdiff-tiny" and report["run"]["planners"] == ["model"]
    assert {(e["planner"], e["mode"]) for e in report["episodes"]} == {("model", "paused"), ("model", "realtime")}
    for e in report["episodes"]:
        assert e["forward_calls_per_token"] is not None and e["forward_calls_per_token"] > 0
        assert e["plan_latency_p50_s"] is not None and e["plan_latency_p50_s"] > 0
    assert rows(md) == {("model", "paused"), ("model", "realtime")}
    assert json.loads(json_copy.read_text()) == report
    video = out / f"video_highway_model_seed{DEFAULT_SEED}.mp4"
    data = video.read_bytes()
    assert len(data) > 1000
    assert data[4:8] == b"ftyp"  # an ISO-BMFF (MP4) file starts with its ftyp box


@pytest.mark.parametrize("extra, needle", [
    (["--scenarios", "highway,nowhere"], "nowhere"),
    (["--model", "/nonexistent"], "/nonexistent"),
    (["--modes", "bogus"], "bogus"),
    (["--baselines", "oracle"], "oracle"),
    (["--episodes", "0"], "--episodes"),
    (["--model", "none", "--baselines", "none"], "nothing to run"),
], ids=["unknown-scenario", "missing-model", "bad-mode", "bad-baseline", "zero-episodes", "nothing-to-run"])
def test_argument_errors_exit_2_naming_the_problem(tmp_path, short_yaml, capsys, extra, needle):
    argv = ["closed-loop", "--workers", "1", "--videos", "0", "--no-progress", "--out", str(tmp_path / "e"),
            "--scenario-file", short_yaml, *extra]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "e").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("extra, needle", [(["--plan-hz", "0"], "plan"), (["--hardware-factor", "-1"], "hardware"),
                                           (["--blend-tau", "-1"], "blend"), (["--perturb", "fog"], "fog"),
                                           (["--perturb", "gnss=3"], "severity")],
                         ids=["zero-plan-hz", "negative-hardware-factor", "negative-blend-tau", "unknown-perturbation",
                              "bad-severity"])
def test_bad_loop_settings_are_argument_errors(tmp_path, short_yaml, capsys, extra, needle):
    """Like every other bad argument, these should exit 2 before any episode runs; main lets LoopConfig's
    ValueError escape from the first job instead (a traceback for a command-line user)."""
    argv = ["closed-loop", "--model", "none", "--scenarios", "highway", "--episodes", "1", "--workers", "1",
            "--videos", "0", "--no-progress", "--out", str(tmp_path / "e"), "--scenario-file", short_yaml, *extra]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_unknown_scenario_in_the_frozen_set(capsys):
    with pytest.raises(SystemExit) as info:
        main(["closed-loop", "--scenarios", "motorway", "--model", "none", "--no-progress"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "motorway" in err and "scenarios_v1.yaml" in err


def test_missing_scenario_file_is_an_argument_error(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as info:
        main(["closed-loop", "--model", "none", "--no-progress", "--scenario-file", str(missing)])
    assert info.value.code == 2
    assert str(missing) in capsys.readouterr().err


def test_decode_flags_become_the_planner_overrides():
    parser = argparse.ArgumentParser()
    add_decode_settings_args(parser)
    assert decode_overrides(parser.parse_args([])) == {}  # the rest take the planner's defaults
    assert decode_overrides(parser.parse_args(["--threshold", "0.6", "--schedule", "static"])) == {
        "threshold": 0.6, "schedule": "static"}
    assert decode_overrides(parser.parse_args(["--steps", "8", "--block-size", "16", "--no-constraint"])) == {
        "steps": 8, "block_size": 16, "constrain": False}
