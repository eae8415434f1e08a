"""Tests for ``wamdiff-eval compare`` (``wamdiff_ros.world.summary.compare``): episodes pair by mode, scenario and
seed; the rows give both means, the paired difference with its CI, collisions and completions per scenario and over
all; unpaired episodes are counted, not used; bad reports and planners are refused with the file named."""

from __future__ import annotations

import json

import pytest

from wamdiff_ros.world.evaluate import main
from wamdiff_ros.world.metrics import EpisodeScore
from wamdiff_ros.world.summary import compare


def score(scenario: str, seed: int, ds: float, planner: str = "model", mode: str = "paused", collisions: int = 0,
          end_reason: str = "timeout", start_moved_m: float | None = None) -> EpisodeScore:
    return EpisodeScore(scenario, seed, planner, mode, route_completion=ds, infraction_penalty=1.0, driving_score=ds,
                        success=False, collisions=collisions, at_fault_collisions=collisions, rear_ended=0,
                        offlane_m=0.0, comfort=100.0, plan_latency_mean_s=None, plan_latency_p50_s=None,
                        plan_latency_p90_s=None, end_reason=end_reason, duration_s=10.0, start_moved_m=start_moved_m)


def test_compare_pairs_by_mode_scenario_and_seed():
    ref = [score("highway", s, 50.0 + s) for s in range(4)] + [score("merge", s, 40.0) for s in range(4)]
    new = [score("highway", s, 60.0 + s, collisions=1, end_reason="completed") for s in range(4)]
    new += [score("merge", s, 40.0 - 2 * s) for s in range(4)]
    new += [score("merge", 9, 99.0), score("highway", 0, 99.0, mode="realtime")]  # no partner: left out
    out = compare(list(reversed(new)), ref)  # order does not matter
    assert out["episodes"] == 8 and out["only_new"] == 2 and out["only_ref"] == 0
    rows = {(r["mode"], r["scenario"]): r for r in out["rows"]}
    assert list(rows) == [("paused", "highway"), ("paused", "merge"), ("paused", "all")]
    hw = rows[("paused", "highway")]
    assert hw["episodes"] == 4 and hw["new_ds"] == pytest.approx(61.5) and hw["ref_ds"] == pytest.approx(51.5)
    assert hw["ds_diff"] == hw["ds_diff_lo"] == hw["ds_diff_hi"] == pytest.approx(10.0)  # the same +10 each time
    assert hw["new_collisions_per_ep"] == 1.0 and hw["ref_collisions_per_ep"] == 0.0
    assert (hw["new_completed"], hw["ref_completed"]) == (4, 0)
    merge = rows[("paused", "merge")]
    assert merge["ds_diff"] == pytest.approx(-3.0) and merge["ds_diff_lo"] < -3.0 < merge["ds_diff_hi"]
    overall = rows[("paused", "all")]
    assert overall["episodes"] == 8 and overall["ds_diff"] == pytest.approx((40.0 - 12.0) / 8)
    assert compare(new, [])["rows"] == [] and compare(new, [])["only_new"] == len(new)


def test_compare_keeps_modes_apart():
    ref = [score("highway", 0, 50.0, mode=m) for m in ("paused", "realtime")]
    new = [score("highway", 0, 55.0), score("highway", 0, 45.0, mode="realtime")]
    rows = {(r["mode"], r["scenario"]): r["ds_diff"] for r in compare(new, ref)["rows"]}
    assert rows == {("paused", "highway"): 5.0, ("paused", "all"): 5.0, ("realtime", "highway"): -5.0,
                    ("realtime", "all"): -5.0}


def test_compare_pools_named_groups_and_counts_starts_from_rest():
    # a v2 run: two v1 scenarios that start moving, one that starts at rest (start_moved_m set)
    ref = [score("highway", s, 60.0) for s in range(3)] + [score("merge", s, 50.0) for s in range(3)]
    ref += [score("start_clear", s, 10.0, start_moved_m=2.0 if s else 12.0) for s in range(3)]
    new = [score("highway", s, 58.0) for s in range(3)] + [score("merge", s, 53.0) for s in range(3)]
    new += [score("start_clear", s, 90.0, start_moved_m=20.0) for s in range(3)]
    out = compare(new, ref, groups={"v1": ["highway", "merge", "roundabout"], "none": ["nowhere"]})
    rows = {r["scenario"]: r for r in out["rows"]}
    assert list(rows) == ["highway", "merge", "start_clear", "v1", "all"]  # an empty group has no row
    assert rows["v1"]["episodes"] == 6 and rows["v1"]["ds_diff"] == pytest.approx(0.5)
    assert rows["v1"]["rest_starts"] == 0 and rows["all"]["episodes"] == 9
    sc = rows["start_clear"]
    assert (sc["rest_starts"], sc["new_rest_starts_ok"], sc["ref_rest_starts_ok"]) == (3, 3, 1)
    assert rows["all"]["rest_starts"] == 3 and rows["all"]["ds_diff"] == pytest.approx((3 * -2 + 3 * 3 + 3 * 80) / 9)


def test_cli_groups_rows_and_refuses_a_bad_group(tmp_path, capsys):
    ref = _report(tmp_path / "ref", [score("highway", 0, 50.0), score("start_clear", 0, 0.0, start_moved_m=0.0)])
    new = _report(tmp_path / "new", [score("highway", 0, 52.0), score("start_clear", 0, 80.0, start_moved_m=30.0)])
    assert main(["compare", new, ref, "--group", "v1=highway,merge"]) == 0
    text = capsys.readouterr().out
    assert "| paused | v1 | 1 | 52.0 | 50.0 | +2.0 [+2.0, +2.0] | 0.00, 0.00 | 0, 0 | - |" in text
    assert ("| paused | start_clear | 1 | 80.0 | 0.0 | +80.0 [+80.0, +80.0] | 0.00, 0.00 | 0, 0 | 1/1 (100 %), "
            "0/1 (0 %) |") in text
    for bad in ("v1", "=highway", "all=highway"):
        with pytest.raises(SystemExit):
            main(["compare", new, ref, "--group", bad])
        assert "--group: expected NAME=SCENARIO" in capsys.readouterr().err


def _report(path, scores) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text(json.dumps({"episodes": [s.to_json() for s in scores], "summary": {}}))
    return str(path)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    ref = _report(tmp_path / "ref", [score("highway", s, 50.0) for s in range(3)]
                  + [score("highway", s, 100.0, planner="expert") for s in range(3)])
    new = _report(tmp_path / "new", [score("highway", s, 56.0) for s in range(3)] + [score("merge", 0, 10.0)])
    out = tmp_path / "cmp.json"
    assert main(["compare", new, f"{ref}/report.json", "--json", str(out)]) == 0  # a folder or its report.json
    text = capsys.readouterr().out
    assert "| paused | highway | 3 | 56.0 | 50.0 | +6.0 [+6.0, +6.0] | 0.00, 0.00 | 0, 0 |" in text
    assert "| completed (new, ref) | starts from rest ok (new, ref) |" in text
    assert "| paused | highway | 3 | 56.0 | 50.0 | +6.0 [+6.0, +6.0] | 0.00, 0.00 | 0, 0 | - |" in text
    assert "| paused | all | 3 |" in text and "1 episodes only in new, 0 only in ref" in text
    assert json.loads(out.read_text())["rows"][0]["ds_diff"] == pytest.approx(6.0)
    # the reference's expert against the new model: another planner on one side
    assert main(["compare", new, ref, "--ref-planner", "expert"]) == 0
    assert "| paused | highway | 3 | 56.0 | 100.0 | -44.0 [-44.0, -44.0] |" in capsys.readouterr().out


def test_cli_refuses_bad_reports_planners_and_disjoint_runs(tmp_path, capsys):
    good = _report(tmp_path / "good", [score("highway", 0, 50.0)])
    other = _report(tmp_path / "other", [score("highway", 7, 50.0)])
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text(json.dumps({"summary": {}}))
    cases = [([str(tmp_path / "missing.json"), good], "missing.json"),
             ([str(tmp_path / "bad.json"), good], "bad.json: not a wamdiff-eval closed-loop report"),
             ([str(tmp_path / "empty.json"), good], "empty.json: not a wamdiff-eval closed-loop report"),
             ([good, good, "--planner", "expert"], "no episodes of planner 'expert' (it holds: model)"),
             ([good, other], "share no episode")]
    for argv, needle in cases:
        with pytest.raises(SystemExit):
            main(["compare", *argv])
        assert needle in capsys.readouterr().err
