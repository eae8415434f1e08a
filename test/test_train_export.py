"""``wamdiff-train export``: a run's last checkpoint -> a shippable model folder with its model card; and the
package's default model name resolving to the shipped folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import model_names
from wamdiff_ros.model import DecodeMeta, tiny_random
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_training import export
from wamdiff_training.checkpoint import save_checkpoint
from wamdiff_training.cli import main as train_main


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "student" / "cross_scale"
    save_checkpoint(tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8), hidden=64, layers=2),
                    run / "checkpoints" / "step-000002")
    (run / "checkpoints" / "latest").write_text("step-000002\n")
    (run / "checkpoints" / "step-000002" / "train_state.pt").write_bytes(b"optimizer state, not shipped")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"scenario_set": {"version": 1}, "split_seed_base": {"train": 0}}))
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"train": [str(data / "train.json")]},
                                                     "out": {"dir": str(run)}}))
    return run


def test_export_copies_inference_files_writes_the_card_and_loads(tmp_path, capsys):
    out = tmp_path / "shipped"
    assert train_main(["export", "--checkpoint", str(_run(tmp_path)), "--out", str(out),
                       "--results", str(tmp_path / "no_results")]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*export.INFERENCE_FILES, "README.md"])
    assert "exported" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    for section in ("## What it is", "## Data", "## What it expects", "## Measured", "## Limits"):
        assert section in card
    assert "not road-ready" in card and "hidden 64, 2 layers" in card and "B = 8" in card
    assert "256x128 RGB, 90 deg" in card  # the world's camera card
    assert "make results-eval" in card  # no results logged in this test
    plan = Planner.from_pretrained(str(out)).plan(tiny_road(), EgoState((8.0, 0.0), (0.0, 0.0)), "follow")
    assert plan.stats.block_size == 8


def test_the_card_describes_the_plan_that_trained_the_model(tmp_path):
    run = _run(tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    rounds = [str(tmp_path / "h" / "student" / kind / "r01" / "data" / "train.json")
              for kind in ("dagger", "adapt_dagger")]
    config["data"]["train"] += rounds
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "shipped"
    plan = Path(export.__file__).parent.parent / "configs" / "tiny_hierarchy.yaml"
    assert train_main(["export", "--checkpoint", str(run), "--out", str(out), "--results", str(tmp_path / "none"),
                       "--plan", str(plan)]) == 0
    card = (out / "README.md").read_text()
    assert f"--plan {plan}" in card and "5 DAgger rounds" in card and "4000 steps" in card
    assert "B = 1 -> 4 -> 8 -> 16 -> 32 (this student: 300/300/300/300/1500 steps; the teacher: 150/" in card
    assert "driven by the student (the other model trains on its exports)" in card and "Stage III" in card
    assert "Plus 2 DAgger round exports" in card and "2000 lane recovery frames per scenario (all;" in card
    assert "1 DAgger round driven by the student's B = 32 model (2500 steps at that B)" in card
    assert "into this student (400 steps, plus 1 × cross-entropy to the ground truth)" in card
    assert "DAgger" not in export.stages_text(None) and "Stage III" in export.stages_text(None)
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"root": "r"}))
    text = export.stages_text(str(plain))
    assert "DAgger" not in text and "cross-entropy" not in text and "recovery" not in text
    assert train_main(["export", "--checkpoint", str(run), "--out", str(out), "--plan", str(tmp_path / "no.yaml")]) == 2
    with pytest.raises(SystemExit):  # neither a checkpoint nor a plan to take the final student from
        train_main(["export", "--out", str(out)])


def test_export_refuses_what_it_cannot_ship(tmp_path, capsys, monkeypatch):
    run = _run(tmp_path)
    (run / "checkpoints" / "step-000002" / "tokenizer.json").unlink()
    assert train_main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "x")]) == 2
    assert "missing tokenizer.json" in capsys.readouterr().err
    run = _run(tmp_path / "again")
    monkeypatch.setattr(export, "MAX_MB", 0.01)
    assert train_main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "y")]) == 2
    assert "exceed the package's" in capsys.readouterr().err
    assert not (tmp_path / "y").exists() and not (tmp_path / "y.tmp").exists()


def test_model_names_resolve_without_torch_and_default_is_the_packaged_student():
    assert model_names.resolve("wamdiff-tiny") == model_names.PACKAGED_MODELS["wamdiff-tiny"]
    assert model_names.resolve("some/folder") == "some/folder"
    assert model_names.is_model("tiny-random") and not model_names.is_model("no/such/folder")
    assert model_names.DEFAULT_MODEL == "wamdiff-tiny"


def tiny_road():
    import numpy as np

    return np.full((128, 256, 3), 90, dtype=np.uint8)


def test_eval_summary_quotes_the_students_paused_score(tmp_path):
    assert export.eval_summary(tmp_path) is None  # nothing logged
    groups = [{"planner": "student", "mode": "realtime", "episodes": 100, "ds": 40.0, "ds_lo": 35.0, "ds_hi": 45.0},
              {"planner": "student", "mode": "paused", "episodes": 100, "ds": 50.0, "ds_lo": 45.5, "ds_hi": 54.5}]
    (tmp_path / "closed_loop.json").write_text(json.dumps({"entries": {"student": {"status": "ok", "groups": groups}}}))
    assert export.eval_summary(tmp_path) == {"driving_score": 50.0, "ci90": [45.5, 54.5], "episodes": 100,
                                             "mode": "paused", "source": "training/RESULTS.md"}


def test_export_takes_the_plans_final_student_without_a_checkpoint(tmp_path, capsys):
    run = _run(tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"root": str(tmp_path)}))
    out = tmp_path / "shipped"
    assert train_main(["export", "--plan", str(plan), "--out", str(out), "--results", str(tmp_path / "none")]) == 0
    assert f"exported {run / 'checkpoints' / 'step-000002'}" in capsys.readouterr().out
    plan.write_text(yaml.safe_dump({"root": str(tmp_path / "untrained")}))  # its final student: not run
    assert train_main(["export", "--plan", str(plan), "--out", str(out)]) == 2
    assert "student/cross_scale" in capsys.readouterr().err


def test_the_cards_low_speed_stage_names_its_data_and_dagger_scenarios():
    """The model card's recipe line for a low-speed plan (tiny_lowspeed_wide.yaml, the fullest): its new scenarios,
    the v1 replay, the training-only variants from rest and the DAgger rounds' scenarios, as the plan file has them."""
    from wamdiff_training.hierarchy import CONFIGS, load_plan

    plan = load_plan(CONFIGS / "tiny_lowspeed_wide.yaml")
    low = plan.lowspeed
    text = export.lowspeed_text(plan)
    assert text.startswith("low-speed continuation at B = 32 from `wamdiff_ros/assets/wamdiff-tiny`")
    assert f"{low.episodes} expert episodes per scenario of start_clear, start_queue" in text
    assert f"{low.replay} per scenario of the chain's set (replay)" in text
    assert f"{low.variants.episodes} per scenario of all from `training/configs/scenarios_from_rest.yaml`" in text
    assert f"{low.dagger.rounds} DAgger rounds ({low.dagger.episodes} episodes per scenario of all" in text
    low.variants = low.dagger_scenarios = None
    assert "training only" not in export.lowspeed_text(plan) and "per new scenario" in export.lowspeed_text(plan)
