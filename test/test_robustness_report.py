"""``wamdiff-eval robustness``: the cells (clean + each perturbation at both severities) × answers off / on, paired by
seed; episodes kept in episodes.jsonl, so a run resumes; the report's tables and picture."""

from __future__ import annotations

import json

import pytest

from wamdiff_ros.world.evaluate import main
from wamdiff_ros.world.perturb import Perturbation
from wamdiff_ros.world.robustness import EpisodeStore, default_cells


def test_default_cells_are_clean_then_each_perturbation_at_both_severities():
    cells = default_cells(["gnss", "latency"])
    assert cells == [(), (Perturbation("gnss", 1),), (Perturbation("gnss", 2),), (Perturbation("latency", 1),),
                     (Perturbation("latency", 2),)]
    assert len(default_cells()) == 11


def test_report_runs_pairs_and_resumes(tmp_path, short_scenario_file, capsys):
    out = tmp_path / "rb"
    argv = ["robustness", "--model", "none", "--baselines", "expert", "--scenarios", "highway,merge", "--episodes",
            "1", "--perturbations", "latency,speed", "--workers", "1", "--no-progress", "--out", str(out),
            "--scenario-file", str(short_scenario_file)]
    assert main(argv) == 0
    summary = json.loads((out / "robustness.json").read_text())
    rows = {(r["answers"], r["cell"]): r for r in summary["rows"]}
    assert len(rows) == 2 * 5 and all(r["episodes"] == 2 for r in rows.values())  # 2 scenarios x 1 seed
    assert "vs_clean" not in rows[(False, "clean")] and rows[(True, "speed=2")]["vs_clean_episodes"] == 2
    assert {r["cell"] for r in summary["answers"]} == {"clean", "latency=1", "latency=2", "speed=1", "speed=2"}
    assert (out / "robustness.png").stat().st_size > 10_000
    assert "| expert | paused | on | speed=2 | 2 |" in (out / "robustness.md").read_text()
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 20
    # a killed run: the last line cut in half, one episode lost; the rerun runs only that one
    (out / "episodes.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert len(EpisodeStore(out / "episodes.jsonl").records) == 19
    capsys.readouterr()
    assert main(argv) == 0
    assert "20 episodes in 5 cells x answers both; 19 already in" in capsys.readouterr().out
    assert len(EpisodeStore(out / "episodes.jsonl").records) == 20


def test_argument_errors(tmp_path, capsys):
    for extra, needle in ((["--perturbations", "fog"], "fog"), (["--modes", "slow"], "modes"),
                          (["--model", "none", "--baselines", "none"], "nothing to run")):
        with pytest.raises(SystemExit) as info:
            main(["robustness", "--out", str(tmp_path), *extra])
        assert info.value.code == 2 and needle in capsys.readouterr().err
