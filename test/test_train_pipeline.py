"""Every stage end to end through the engine on a tiny export: the shipped tiny config (a few steps), a checkpoint
that `Planner` loads with the stage's decode metadata, and a valid plan from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros.cli import load_rgb
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_training.config import from_dict
from wamdiff_training.engine import train
from wamdiff_training.stages import STAGES
from wamdiff_training.world.dataset import main as export
from conftest import assert_parsed_plan

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_pipeline") / "set"
    assert export(["generate", "--scenarios", "roundabout", "--episodes", "1", "--max-seconds", "2", "--out", str(out),
                   "--preview", "0", "--no-progress"]) == 0
    return out / "train.json"


@pytest.mark.parametrize(("stage", "config", "block_size"), [
    ("ar", "tiny_ar", 1), ("adapt", "tiny_adapt", None), ("distill", "tiny_distill", 32),
    ("cross-scale", "tiny_cross_scale", 32)])
def test_stage_runs_end_to_end_and_its_checkpoint_plans(stage, config, block_size, data, tmp_path):
    raw = yaml.safe_load((ROOT / "training/configs" / f"{config}.yaml").read_text())
    raw["data"]["train"] = [str(data)]
    raw["train"].update(steps=STEPS, warmup=1, batch_size=2)
    raw["out"].update(dir=str(tmp_path / "run"), checkpoint_every=0, tensorboard=False)
    config = from_dict(raw, config)
    result = train(config, STAGES[stage], stage, progress=False)
    assert result.steps == STEPS and len(result.losses) == STEPS
    assert all(loss == loss and loss < float("inf") for loss in result.losses)

    meta = json.loads((result.checkpoint / "wamdiff.json").read_text())
    expected_b = block_size if block_size is not None else config.adapt.block_size
    assert meta["trained_block_size"] == expected_b
    assert meta["prediction"] == ("next_token" if stage == "ar" else "in_place")
    planner = Planner.from_pretrained(str(result.checkpoint))
    record = next(r for r in json.loads(data.read_text()) if r["task"] == "plan")
    m = record["meta"]
    plan = planner.plan(load_rgb(data.parent / record["image"]), EgoState(tuple(m["velocity"]),
                        tuple(m["acceleration"])), m["command"])
    assert_parsed_plan(plan)
    assert plan.stats.mode == ("ar" if stage == "ar" else "block")


def test_adapt_curriculum_runs_each_phase_from_its_predecessor(data, tmp_path):
    from wamdiff_training import checkpoint, cli

    raw = yaml.safe_load((ROOT / "training/configs/tiny_adapt.yaml").read_text())
    raw["data"]["train"] = [str(data)]
    raw["train"].update(steps=1, warmup=1, batch_size=2)
    raw["out"].update(dir=str(tmp_path / "ladder"), checkpoint_every=0, tensorboard=False)
    raw["adapt"].update(curriculum=[1, 4, 8], steps_per_phase=[1])
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["adapt", "--config", str(path), "--curriculum", "--no-progress"]) == 0
    sizes = []
    for name in ("b01", "b04", "b08"):
        last = checkpoint.resolve(checkpoint.LATEST, tmp_path / "ladder" / name)
        sizes.append(json.loads((last / "wamdiff.json").read_text())["trained_block_size"])
    assert sizes == [1, 4, 8]
    assert all((tmp_path / "ladder" / name / "metrics.csv").is_file() for name in ("b01", "b04", "b08"))
    assert cli.main(["distill", "--config", str(path), "--curriculum"]) == 2  # only adapt has a curriculum


def test_metrics_go_to_csv_and_tensorboard(data, tmp_path):
    raw = yaml.safe_load((ROOT / "training/configs/tiny_ar.yaml").read_text())
    raw["data"]["train"] = [str(data)]
    raw["train"].update(steps=2, warmup=1, batch_size=2)
    raw["out"].update(dir=str(tmp_path / "run"), checkpoint_every=0, tensorboard=True)
    train(from_dict(raw, "tiny_ar"), STAGES["ar"], "ar", progress=False)
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,") and len(rows) == 3
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
