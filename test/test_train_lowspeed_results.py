"""The low-speed comparison as a logged result: ``wamdiff-eval compare --group ... --json
training/results/lowspeed.json`` -> RESULTS.md's (g) table, the model card's measured line and stages, and the score
``wamdiff-demo`` quotes (eval_summary.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros.world.evaluate import main as eval_main
from wamdiff_ros.world.metrics import EpisodeScore
from wamdiff_training import export, render
from wamdiff_training.cli import main as train_main

LOWSPEED_PLAN = Path(export.__file__).parent.parent / "configs" / "tiny_lowspeed.yaml"


def _score(scenario: str, seed: int, ds: float, moved: float | None = None) -> EpisodeScore:
    return EpisodeScore(scenario, seed, "model", "paused", route_completion=ds, infraction_penalty=1.0,
                        driving_score=ds, success=False, collisions=0, at_fault_collisions=0, rear_ended=0,
                        offlane_m=0.0, comfort=100.0, plan_latency_mean_s=None, plan_latency_p50_s=None,
                        plan_latency_p90_s=None, end_reason="completed" if ds == 100 else "timeout", duration_s=10.0,
                        start_moved_m=moved)


def _report(path: Path, scores: list[EpisodeScore], model: str) -> Path:
    path.mkdir(parents=True)
    run = {"argv": ["closed-loop", "--model", model, "--scenario-file", "v2"], "model": model,
           "scenario_set": "scenarios_v2.yaml", "scenario_version": 2, "modes": ["paused"],
           "episodes_per_scenario": 4, "first_seed": 1000000, "plan_hz": 5.0, "wall_s": 12.0,
           "host": {"cpu": "test", "cores": 2, "commit": "abc"}}
    (path / "report.json").write_text(json.dumps({"episodes": [s.to_json() for s in scores], "summary": {},
                                                  "run": run}))
    return path


def _lowspeed(tmp_path: Path) -> Path:
    new = [_score("highway", s, 80.0 + s) for s in range(4)]
    new += [_score("start_clear", s, 100.0, moved=25.0) for s in range(4)]
    ref = [_score("highway", s, 80.0) for s in range(4)]
    ref += [_score("start_clear", s, 5.0, moved=12.0 if s == 0 else 0.0) for s in range(4)]
    results = tmp_path / "results"
    out = results / render.LOWSPEED
    assert eval_main(["compare", str(_report(tmp_path / "new", new, "out/low")),
                      str(_report(tmp_path / "ref", ref, "wamdiff-tiny")), "--group", "v1=highway,merge",
                      "--group", "new=start_clear,start_queue", "--json", str(out)]) == 0
    return results


def test_the_comparison_renders_as_results_g(tmp_path, capsys):
    results = _lowspeed(tmp_path)
    capsys.readouterr()
    lines = render.render_lowspeed(json.loads((results / render.LOWSPEED).read_text()))
    text = "\n".join(lines)
    assert lines[0] == "## (g) Driving from standstill: scenarios v2"
    assert "new `out/low` against ref `wamdiff-tiny`, 4 held-out seeds per scenario from 1000000" in text
    assert "| start_clear | paused | 4 | 100.0 | 5.0 | +95.0 [+95.0, +95.0] | 4/4 (100 %) | 1/4 (25 %) |" in text
    assert "| **v1** | paused | 4 | 81.5 | 80.0 |" in text and "| **all** | paused | 8 |" in text
    assert "| highway | paused | 4 |" in text and "| - | - |" in text  # no starts from rest on the highway
    assert "- new: `wamdiff-eval closed-loop --model out/low --scenario-file v2` (test, 2 cores, commit abc" in text
    assert "not run" in render.render_lowspeed(None)[2]
    md = tmp_path / "RESULTS.md"
    assert train_main(["results", "render", "--results", str(results), "--out", str(md)]) == 0
    assert "## (g) Driving from standstill: scenarios v2" in md.read_text()


def test_card_and_demo_score_quote_the_shipped_model_on_v2(tmp_path):
    results = _lowspeed(tmp_path)
    assert render.card_metrics(results) == ["- No results logged yet: run `make results-eval`."]  # not for the chain
    assert export.eval_summary(results) is None
    lines = render.card_metrics(results, lowspeed=True)
    assert lines[0].startswith("- closed loop on scenarios v2, paused (4 episodes per scenario, 90 % CI), this model "
                               "vs `wamdiff-tiny`: v1 scenarios 81.5 vs 80.0, paired +1.5")
    assert "new scenarios 100.0 vs 5.0, paired +95.0" in lines[0] and lines[0].endswith(
        "starts from rest that got going 4/4 (100 %) vs 1/4 (25 %)")
    summary = export.eval_summary(results, lowspeed=True)
    assert summary["driving_score"] == (sum(80.0 + s for s in range(4)) + 400.0) / 8 and summary["episodes"] == 8
    assert summary["ci90"][0] <= summary["driving_score"] <= summary["ci90"][1]
    assert summary["source"] == "training/RESULTS.md (g), scenario set v2" and summary["mode"] == "paused"
    # with the chain's closed loop logged too, its lines name the model they measured
    groups = [{"planner": "student", "mode": "paused", "episodes": 100, "ds": 50.0, "ds_lo": 45.5, "ds_hi": 54.5}]
    (results / "closed_loop.json").write_text(json.dumps({"settings": {"modes": ["paused"]}, "entries": {
        "student": {"status": "ok", "groups": groups, "episodes": []}}}))
    lines = render.card_metrics(results, lowspeed=True)
    assert lines[0].startswith("- closed loop on scenarios v2") and len(lines) == 2
    assert lines[1].startswith("- before the low-speed continuation, the chain's Stage III student: closed loop, "
                               "paused: driving score 50.0")
    assert export.eval_summary(results, lowspeed=True)["source"].endswith("scenario set v2")  # not the chain's
    assert render.card_metrics(results)[0].startswith("- closed loop, paused: driving score 50.0")  # the chain's card
    assert export.eval_summary(results)["source"] == "training/RESULTS.md"


def test_the_card_describes_the_low_speed_recipe():
    text = export.stages_text(str(LOWSPEED_PLAN))
    assert "Stage III cross-scale distillation" in text
    assert ("-> low-speed continuation at B = 32 from `wamdiff_ros/assets/wamdiff-tiny` (the chain's Stage III "
            "student, as shipped before this continuation) on scenario set v2: 30 expert episodes per scenario of "
            "start_clear, start_queue, stop_and_go, give_way_stop and 10 per scenario of the chain's set (replay), 800 steps, lr 0.0005 (sampling "
            "weights plan/rest_start 0.3, plan/rest_hold 0.2)") in text
    assert "then 3 DAgger rounds (15 episodes per new scenario driven by the model so far, expert share 0.3, 0.1, " \
           "0.1; 600 steps each on all its data)." in text


def test_export_of_the_low_speed_student_writes_its_card_and_score(tmp_path):
    import yaml

    from wamdiff_ros.model import DecodeMeta, tiny_random
    from wamdiff_training.checkpoint import save_checkpoint

    run = tmp_path / "student" / "lowspeed" / "dagger" / "r01"
    save_checkpoint(tiny_random(seed=3, meta=DecodeMeta(trained_block_size=32), hidden=64, layers=2),
                    run / "checkpoints" / "step-000002")
    (run / "checkpoints" / "latest").write_text("step-000002\n")
    data = tmp_path / "student" / "lowspeed" / "data"
    data.mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"scenario_set": {"version": 2}, "split_seed_base": {"train": 0}}))
    train = [str(data / "train.json"), str(run / "data" / "train.json")]
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"train": train}, "out": {"dir": str(run)}}))
    results = _lowspeed(tmp_path)
    out = tmp_path / "shipped"
    assert train_main(["export", "--checkpoint", str(run), "--out", str(out), "--results", str(results),
                       "--plan", str(LOWSPEED_PLAN)]) == 0
    card = (out / "README.md").read_text()
    assert "from the frozen scenario set v1 (highway overtaking" in card
    assert "Plus 6 DAgger round exports of the chain" in card  # 5 AR rounds + 1 at B = 32
    assert ("Then, for the low-speed continuation, scenario set v2 (`scenarios_v2.yaml`): starts from rest on a clear "
            "road and behind a standing queue") in card and "and 1 DAgger round export driven by the model." in card
    assert "-> low-speed continuation at B = 32" in card and "- closed loop on scenarios v2, paused" in card
    assert json.loads((out / "eval_summary.json").read_text())["source"].endswith("scenario set v2")
