"""`wamdiff-train hierarchy`: the whole tiny hierarchy in order, each step from its predecessor, resumable."""

from __future__ import annotations

import json
import re
import shutil
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
from wamdiff_training import checkpoint
from wamdiff_training.cli import main
from wamdiff_training.config import ConfigError, load_config
from wamdiff_training.engine import build_bundle
from wamdiff_training.hierarchy import CONFIGS, LowSpeedPlan, ensure_data, final_run, load_plan, plan_steps
from conftest import assert_parsed_plan


def test_hierarchy_runs_in_order_skips_what_is_done_and_resumes(tmp_path, capsys):
    plan = {"root": str(tmp_path / "h"), "scenarios": "highway", "episodes": 1, "batch_size": 2, "ar_steps": 2,
            "checkpoint_every": 1,
            "teacher": {"hidden": 128, "layers": 4, "seed": 0}, "student": {"hidden": 64, "layers": 2, "seed": 1},
            "curriculum": [1, 4, 8], "adapt_steps": 1, "distill_teacher_block": 4, "distill_steps": 1,
            "cross_scale_steps": 1, "ablations": False}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    names = [s.name for s in plan_steps(load_plan(path))]
    assert names == ["teacher/ar", "teacher/adapt/b01", "teacher/adapt/b04", "teacher/adapt/b08", "teacher/distill",
                     "student/ar", "student/adapt/b01", "student/adapt/b04", "student/adapt/b08", "student/distill",
                     "student/cross_scale"]

    assert main(["hierarchy", "--plan", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("trained (0 -> ") == len(names)
    root = Path(plan["root"])
    final = root / "student" / "cross_scale" / "checkpoints" / "step-000001"
    assert json.loads((final / "config.json").read_text())["text_config"]["hidden_size"] == 64  # the student
    teacher = root / "teacher" / "distill" / "checkpoints" / "step-000001"
    assert json.loads((teacher / "config.json").read_text())["text_config"]["hidden_size"] == 128
    meta = json.loads((final / "wamdiff.json").read_text())
    assert (meta["prediction"], meta["trained_block_size"]) == ("in_place", 8)

    record = next(r for r in json.loads((root / "data" / "test.json").read_text()) if r["task"] == "plan")
    m = record["meta"]
    plan_out = Planner.from_pretrained(str(final)).plan(load_rgb(root / "data" / record["image"]),
                                                        EgoState(tuple(m["velocity"]), tuple(m["acceleration"])),
                                                        m["command"])
    assert_parsed_plan(plan_out)

    assert main(["hierarchy", "--plan", str(path), "--no-progress"]) == 0  # again: nothing left to do
    assert capsys.readouterr().out.count("done (") == len(names)

    # a kill after the student's AR step 1: its step-2 checkpoint never landed; the next call resumes from step 1
    ar = root / "student" / "ar" / "checkpoints"
    shutil.rmtree(ar / "step-000002")
    (ar / "latest").write_text("step-000001\n")
    # a later step never starts from a predecessor cut short (or still training in another process)
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--set", "ablations=true",
                 "--only", "student/ablation/direct"]) == 2
    assert "is at step 1 of 2; finish it first" in capsys.readouterr().err
    assert main(["hierarchy", "--plan", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "student/ar           trained (1 -> 2 steps)" in out and out.count("done (") == len(names) - 1
    assert main(["hierarchy", "--plan", str(path), "--set", "nope=1"]) == 2

    # --only: a part of the plan (two processes can run the teacher's and the student's chains side by side)
    assert main(["hierarchy", "--plan", str(path), "--dry-run", "--only", "student/adapt/*,student/ar"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["student/ar", "student/adapt/b01", "student/adapt/b04", "student/adapt/b08"]
    assert main(["hierarchy", "--plan", str(path), "--dry-run", "--only", "nobody/*"]) == 2
    assert "no step matches" in capsys.readouterr().err

    # the student's ablations run after the main chain, from its runs
    assert main(["hierarchy", "--plan", str(path), "--set", "ablations=true", "--no-progress"]) == 0
    out = capsys.readouterr().out
    ablations = ["student/ablation/direct", "student/ablation/ar_teacher", "student/ablation/fkl",
                 "student/ablation/rkl"]
    assert out.count("trained (0 -> ") == 4 and all(f"{name} " in out for name in ablations)
    direct = root / "student" / "ablation" / "direct" / "checkpoints" / "step-000003"  # the curriculum's budget
    assert json.loads((direct / "wamdiff.json").read_text())["trained_block_size"] == 8
    for name, kind in (("ar_teacher", "ar"), ("fkl", "diffusion"), ("rkl", "diffusion")):
        config = yaml.safe_load((root / "student" / "ablation" / name / "config.yaml").read_text())
        assert config["cross_scale"]["teacher_kind"] == kind
        assert config["cross_scale"]["divergence"] == (name if name != "ar_teacher" else "jsd")


def test_per_model_stage_one_steps(tmp_path):
    plan = {"root": str(tmp_path / "h"), "curriculum": [1, 4, 32], "adapt_steps": 5,
            "student": {"hidden": 64, "layers": 2, "seed": 1, "adapt_steps": [2, 3, 40]}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    steps = {s.name: s.steps for s in plan_steps(load_plan(path))}
    assert [steps[f"teacher/adapt/b{b:02d}"] for b in (1, 4, 32)] == [5, 5, 5]
    assert [steps[f"student/adapt/b{b:02d}"] for b in (1, 4, 32)] == [2, 3, 40]
    assert steps["student/ablation/direct"] == 45  # the student's whole curriculum budget in one phase
    plan["student"]["adapt_steps"] = [1, 2]
    path.write_text(yaml.safe_dump(plan))
    assert main(["hierarchy", "--plan", str(path), "--dry-run"]) == 2


def test_per_model_sizes_ar_steps_and_training_mix(tmp_path):
    plan = {"root": str(tmp_path / "h"), "ar_steps": 7, "task_weights": {"plan": 1.0, "detect": 0.3, "ask": 0.1},
            "teacher": {"hidden": 128, "layers": 4, "vision_hidden": 96, "vision_depth": 3},
            "student": {"hidden": 64, "layers": 2, "seed": 1, "ar_steps": 11}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    steps = {s.name: s for s in plan_steps(load_plan(path))}
    assert (steps["teacher/ar"].steps, steps["student/ar"].steps) == (7, 11)
    teacher = load_config(CONFIGS / "tiny_ar.yaml", steps["teacher/ar"].overrides)
    assert (teacher.model.tiny.vision_hidden, teacher.model.tiny.vision_depth) == (96, 3)
    assert teacher.data.task_weights == {"plan": 1.0, "detect": 0.3, "ask": 0.1}
    student = load_config(CONFIGS / "tiny_ar.yaml", steps["student/ar"].overrides)
    assert (student.model.tiny.vision_hidden, student.model.tiny.vision_depth) == (64, 2)  # the default tower
    with pytest.raises(ConfigError, match="vision_hidden"):
        load_config(CONFIGS / "tiny_ar.yaml", ["model.tiny.vision_hidden=48"])

    bundle = build_bundle(teacher)  # the tower the config names, not the default one
    vision = bundle.model.config.vision_config
    assert (vision.hidden_size, vision.depth, vision.out_hidden_size) == (96, 3, 128)


def test_ar_in_place_weight_reaches_every_ar_run_and_no_other(tmp_path):
    plan = {"root": str(tmp_path / "h"), "ar_in_place_weight": 0.5, "dagger": {"rounds": 2, "steps": 3},
            "adapt_dagger": {"rounds": 1, "steps": 3}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    weights = {s.name: [o for o in s.overrides if o.startswith("ar.")] for s in plan_steps(load_plan(path))}
    weights = {name: o for name, o in weights.items() if o}
    assert sorted(weights) == ["student/ar", "student/dagger/r01", "student/dagger/r02",
                               "teacher/ar", "teacher/dagger/r01", "teacher/dagger/r02"]
    assert all(o == ["ar.in_place_weight=0.5"] for o in weights.values())
    ar = next(s for s in plan_steps(load_plan(path)) if s.name == "student/ar")
    assert load_config(CONFIGS / "tiny_ar.yaml", ar.overrides).ar.in_place_weight == 0.5
    default = {"root": str(tmp_path / "g")}
    path.write_text(yaml.safe_dump(default))
    ar = next(s for s in plan_steps(load_plan(path)) if s.name == "student/ar")
    assert load_config(CONFIGS / "tiny_ar.yaml", ar.overrides).ar.in_place_weight == 0.0


STAGE_THREE = {"student/cross_scale", "student/ablation/ar_teacher", "student/ablation/fkl", "student/ablation/rkl"}


@pytest.mark.parametrize("key, value, prefix, section_fields, bad", [
    ("cross_scale_ce_weight", 1.5, "cross_scale.ce_weight", {"ce_weight": 1.5}, (-1.0, "a lot", True)),
])
def test_stage_three_plan_keys_reach_stage_three_and_its_ablations_only(tmp_path, key, value, prefix,
                                                                       section_fields, bad):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"root": str(tmp_path / "h"), key: value}))
    steps = plan_steps(load_plan(path))
    assert {s.name for s in steps if any(o.startswith(prefix) for o in s.overrides)} == STAGE_THREE
    final = next(s for s in steps if s.name == "student/cross_scale")
    plain = [o.replace("=@run:", "=") for o in final.overrides]  # each run's folder for its checkpoint
    section = load_config(CONFIGS / "tiny_cross_scale.yaml", plain).cross_scale
    assert {f: getattr(section, f) for f in section_fields} == section_fields
    path.write_text(yaml.safe_dump({"root": str(tmp_path / "g")}))  # default 0: no override, earlier runs unchanged
    assert not any(o.startswith(prefix) for s in plan_steps(load_plan(path)) for o in s.overrides)
    for value in bad:
        path.write_text(yaml.safe_dump({"root": str(tmp_path / "g"), key: value}))
        with pytest.raises(ConfigError, match=key):
            load_plan(path)


def test_a_plan_that_is_not_a_yaml_mapping_is_refused_with_its_file_named(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("root: out/h\nrecoveries: {samples: 10, weight: 1.0\n")  # the brace never closes
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))}: not valid YAML"):
        load_plan(path)
    path.write_text("- root: out/h\n")
    with pytest.raises(ConfigError, match="expected a mapping of plan keys, got a list"):
        load_plan(path)
    assert main(["hierarchy", "--plan", str(path), "--dry-run"]) == 2


@pytest.mark.parametrize("name", sorted(p.name for p in [*CONFIGS.glob("tiny_hierarchy*.yaml"),
                                                         *CONFIGS.glob("tiny_lowspeed*.yaml")]))
def test_shipped_plans_load_and_every_step_makes_a_valid_config(name):
    plan = load_plan(CONFIGS / name)
    steps = plan_steps(plan)
    assert steps[-1].name.startswith("student/")
    for step in steps:
        assert step.out_dir.is_relative_to(plan.root), step.name
        if step.stage in ("dagger-data", "world-data"):
            continue
        plain = [o.replace("=@run:", "=") for o in step.overrides]  # a run folder stands for its checkpoint
        config = load_config(CONFIGS / f"{step.base}.yaml", plain)
        assert config.train.batch_size == plan.batch_size, step.name  # the plan's settings, not the base file's
        inputs = [plan.root, plan.data_dir]
        assert all(any(Path(f).is_relative_to(i) for i in inputs) for f in config.data.train), step.name


def test_held_out_splits_take_their_own_episode_count(tmp_path, monkeypatch):
    import wamdiff_training.world.dataset as dataset

    calls = []
    monkeypatch.setattr(dataset, "main", lambda argv: calls.append(argv) or 0)
    plan = load_plan_from(tmp_path, {"root": str(tmp_path / "h"), "episodes": 30, "eval_episodes": 5})
    ensure_data(plan, progress=False)
    assert [(a[a.index("--split") + 1], a[a.index("--episodes") + 1]) for a in calls] == [("train", "30"),
                                                                                          ("val,test", "5")]
    calls.clear()
    ensure_data(load_plan_from(tmp_path, {"root": str(tmp_path / "g"), "episodes": 4}), progress=False)
    assert [(a[a.index("--split") + 1], a[a.index("--episodes") + 1]) for a in calls] == [("train,val,test", "4")]


def test_counterfactual_commands_reach_the_training_exports_only(tmp_path, monkeypatch):
    import wamdiff_training.world.dataset as dataset
    from wamdiff_training.hierarchy import Step, export_dagger

    calls = []
    monkeypatch.setattr(dataset, "main", lambda argv: calls.append(argv) or 0)
    plan = load_plan_from(tmp_path, {"root": str(tmp_path / "c"), "episodes": 4, "counterfactual_commands": True})
    ensure_data(plan, progress=False)
    assert [(a[a.index("--split") + 1], "--counterfactual-commands" in a) for a in calls] == [("train", True),
                                                                                              ("val,test", False)]
    calls.clear()
    step = Step("student/adapt_dagger/r01/data", "dagger-data", "", tmp_path / "d", 0,
                ["seed_offset=40", "episodes=2", "expert_share=0.2"])
    export_dagger(plan, step, "a-model", progress=False)
    assert "--counterfactual-commands" in calls[0] and "a-model" in calls[0]
    calls.clear()
    export_dagger(load_plan_from(tmp_path, {"root": str(tmp_path / "e")}), step, "a-model", progress=False)
    assert "--counterfactual-commands" not in calls[0]


def test_route_points_and_format_version_reach_every_export(tmp_path, monkeypatch):
    import wamdiff_training.world.dataset as dataset
    from wamdiff_training.hierarchy import Step, ensure_recoveries, export_dagger

    calls = []
    monkeypatch.setattr(dataset, "main", lambda argv: calls.append(argv) or 0)
    plan = load_plan_from(tmp_path, {"root": str(tmp_path / "r"), "episodes": 4, "eval_episodes": 2,
                                     "route_points": True, "format_version": 3,
                                     "recoveries": {"samples": 3, "scenarios": "highway", "weight": 1.0}})
    ensure_data(plan, progress=False)
    export_dagger(plan, Step("student/dagger/r01/data", "dagger-data", "", tmp_path / "d", 0,
                             ["seed_offset=40", "episodes=2", "expert_share=0.2"]), "a-model", progress=False)
    assert [c[0] for c in calls] == ["recoveries", "generate", "generate", "generate"]
    for argv in calls:  # recoveries, train, val + test, the DAgger round
        assert "--route-points" in argv and argv[argv.index("--format-version") + 1] == "3"
    calls.clear()
    default = load_plan_from(tmp_path, {"root": str(tmp_path / "s"), "episodes": 4})
    ensure_data(default, progress=False)
    ensure_recoveries(default, progress=False)
    assert all("--route-points" not in a and a[a.index("--format-version") + 1] == "3" for a in calls)


@pytest.mark.parametrize(("key", "value"), [("format_version", 2), ("format_version", 4), ("format_version", True),
                                            ("route_points", "yes")])
def test_bad_export_format_keys_are_refused(tmp_path, key, value):
    with pytest.raises(ConfigError, match=key):
        load_plan_from(tmp_path, {"root": "out/h", key: value})


def load_plan_from(tmp_path, plan: dict):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return load_plan(path)


def test_dagger_rounds_export_with_the_model_driving_and_train_on_the_union(tmp_path, capsys):
    plan = {"root": str(tmp_path / "h"), "scenarios": "highway", "episodes": 1, "batch_size": 2, "ar_steps": 1,
            "checkpoint_every": 1, "curriculum": [1, 4], "adapt_steps": 1, "distill_teacher_block": 1,
            "dagger": {"rounds": 2, "episodes": 1, "expert_share": [0.5, 0.2], "steps": 1, "lr": 1e-4}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    loaded = load_plan(path)
    steps = {s.name: s for s in plan_steps(loaded)}
    names = list(steps)
    assert names[names.index("student/ar") + 1:names.index("student/adapt/b01")] == [
        "student/dagger/r01/data", "student/dagger/r01", "student/dagger/r02/data", "student/dagger/r02"]
    root = Path(plan["root"])
    r1, r2 = root / "student" / "dagger" / "r01", root / "student" / "dagger" / "r02"
    # round r is driven by the model so far, on seeds no earlier export used, and trains on every round's data
    assert f"driver=@run:{root / 'student' / 'ar'}" in steps["student/dagger/r01/data"].overrides
    assert f"driver=@run:{r1}" in steps["student/dagger/r02/data"].overrides
    assert [o for o in steps["student/dagger/r02/data"].overrides if o.startswith("seed_offset")] == ["seed_offset=2"]
    assert "expert_share=0.5" in steps["student/dagger/r01/data"].overrides  # one share per round
    assert "expert_share=0.2" in steps["student/dagger/r02/data"].overrides
    def data_of(step: str, base: str):  # the step's data settings (its @run: links resolve only when it runs)
        return load_config(CONFIGS / base, [o for o in steps[step].overrides if "@run:" not in o]).data

    union = data_of("student/dagger/r02", "tiny_ar.yaml")
    assert [Path(p) for p in union.train] == [root / "data" / "train.json", r1 / "data" / "train.json",
                                              r2 / "data" / "train.json"]
    assert load_config(CONFIGS / "tiny_ar.yaml", [o for o in steps["student/dagger/r02"].overrides
                                                  if "@run:" not in o]).train.lr == 1e-4
    assert f"model.init=@run:{r2}" in steps["student/adapt/b01"].overrides  # Stage I starts from the last round
    later = data_of("student/cross_scale", "tiny_cross_scale.yaml").train
    assert len(later) == 3 and f"model.init=@run:{r2}" in steps["student/ablation/direct"].overrides
    assert f"cross_scale.teacher=@run:{root / 'teacher' / 'dagger' / 'r02'}" in \
        steps["student/ablation/ar_teacher"].overrides

    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", "student/ar,student/dagger/*"]) == 0
    out = capsys.readouterr().out
    assert out.count("exported") == 2 and out.count("trained (0 -> 1 steps)") == 3
    exported = json.loads((r1 / "data" / "manifest.json").read_text())
    assert exported["dagger"]["driver"].startswith(str(root / "student" / "ar" / "checkpoints"))
    assert exported["splits"]["train"]["seeds"] == [1, 1] and exported["dagger"]["expert_share"] == 0.5
    second = json.loads((r2 / "data" / "manifest.json").read_text())
    assert second["dagger"]["expert_share"] == 0.2 and second["splits"]["train"]["seeds"] == [2, 2]
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", "student/dagger/*"]) == 0
    assert capsys.readouterr().out.count("done (") == 4
    path.write_text(yaml.safe_dump({**plan, "dagger": {"rounds": 0}}))
    with pytest.raises(ConfigError, match="rounds"):
        load_plan(path)
    path.write_text(yaml.safe_dump({**plan, "dagger": {"rounds": 2, "expert_share": [0.5, 0.2, 0.1]}}))
    with pytest.raises(ConfigError, match="3 shares for 2 rounds"):
        load_plan(path)
    path.write_text(yaml.safe_dump({**plan, "dagger": {"rounds": 2, "expert_share": [0.5, 1.5]}}))
    with pytest.raises(ConfigError, match="expert_share in"):
        load_plan(path)
    path.write_text(yaml.safe_dump({**plan, "dagger": {"round": 2}}))
    with pytest.raises(ConfigError, match="dagger.round: unknown key"):
        load_plan(path)


def test_adapt_dagger_rounds_are_driven_by_the_b32_model_and_feed_the_later_stages(tmp_path, capsys):
    plan = {"root": str(tmp_path / "h"), "scenarios": "highway", "episodes": 1, "batch_size": 2, "ar_steps": 1,
            "checkpoint_every": 1, "curriculum": [1, 4], "adapt_steps": 1, "distill_teacher_block": 1,
            "dagger": {"rounds": 1, "episodes": 1, "steps": 1},
            "adapt_dagger": {"rounds": 1, "episodes": 1, "expert_share": 0.2, "steps": 1, "lr": 1e-4}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    steps = {s.name: s for s in plan_steps(load_plan(path))}
    names = list(steps)
    assert names[names.index("student/adapt/b04") + 1:names.index("student/distill")] == [
        "student/adapt_dagger/r01/data", "student/adapt_dagger/r01"]
    root = Path(plan["root"])
    r1 = root / "student" / "adapt_dagger" / "r01"
    data = steps["student/adapt_dagger/r01/data"].overrides
    assert f"driver=@run:{root / 'student' / 'adapt' / 'b04'}" in data  # the largest-B model drives
    assert "seed_offset=2" in data and "expert_share=0.2" in data  # seeds after the plan's and the AR round's
    train = steps["student/adapt_dagger/r01"]
    assert (train.stage, train.base) == ("adapt", "tiny_adapt")
    config = load_config(CONFIGS / "tiny_adapt.yaml", [o for o in train.overrides if "@run:" not in o])
    assert config.adapt.block_size == 4 and config.train.lr == 1e-4
    assert [Path(p) for p in config.data.train] == [root / "data" / "train.json",
                                                    root / "student" / "dagger" / "r01" / "data" / "train.json",
                                                    r1 / "data" / "train.json"]
    assert f"model.init=@run:{r1}" in steps["student/distill"].overrides  # Stage II starts from the last round
    assert len(load_config(CONFIGS / "tiny_cross_scale.yaml", [o for o in steps["student/cross_scale"].overrides
                                                               if "@run:" not in o]).data.train) == 3

    only = "student/ar,student/dagger/*,student/adapt/*,student/adapt_dagger/*"
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", only]) == 0
    out = capsys.readouterr().out
    assert out.count("exported") == 2 and out.count("trained (0 -> 1 steps)") == 5
    exported = json.loads((r1 / "data" / "manifest.json").read_text())
    assert exported["dagger"]["driver"].startswith(str(root / "student" / "adapt" / "b04" / "checkpoints"))
    assert exported["splits"]["train"]["seeds"] == [2, 2] and exported["dagger"]["expert_share"] == 0.2
    meta = json.loads((checkpoint.resolve("latest", r1) / "wamdiff.json").read_text())
    assert (meta["prediction"], meta["trained_block_size"], meta["format_version"]) == ("in_place", 4, 3)


def test_a_model_can_train_on_the_other_models_dagger_exports_without_driving(tmp_path, capsys):
    plan = {"root": str(tmp_path / "h"), "scenarios": "highway", "episodes": 1, "batch_size": 2, "ar_steps": 1,
            "checkpoint_every": 1, "curriculum": [1, 4], "adapt_steps": 1, "distill_teacher_block": 1,
            "teacher": {"hidden": 128, "layers": 4, "dagger_from": "student", "dagger_steps": 2},
            "dagger": {"rounds": 2, "episodes": 1, "steps": 1},
            "adapt_dagger": {"rounds": 1, "episodes": 1, "steps": 1}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    steps = {s.name: s for s in plan_steps(load_plan(path))}
    names = list(steps)
    root = Path(plan["root"])
    # the lender's chain comes first, so the borrower's rounds find their data; the borrower exports nothing
    assert names.index("student/adapt_dagger/r01/data") < names.index("teacher/ar")
    assert not [n for n in names if n.startswith("teacher/") and n.endswith("/data")]
    assert [n for n in names if n.startswith("teacher/")][:4] == [
        "teacher/ar", "teacher/dagger/r01", "teacher/dagger/r02", "teacher/adapt/b01"]
    assert steps["teacher/dagger/r02"].steps == 2 and steps["student/dagger/r02"].steps == 1

    def train_of(step: str, base: str) -> list[Path]:
        overrides = [o for o in steps[step].overrides if "@run:" not in o]
        return [Path(p) for p in load_config(CONFIGS / base, overrides).data.train]

    lent = [root / "student" / "dagger" / f"r0{r}" / "data" / "train.json" for r in (1, 2)]
    assert train_of("teacher/dagger/r02", "tiny_ar.yaml") == [root / "data" / "train.json", *lent]
    assert f"model.init=@run:{root / 'teacher' / 'dagger' / 'r01'}" in steps["teacher/dagger/r02"].overrides
    adapt_lent = root / "student" / "adapt_dagger" / "r01" / "data" / "train.json"
    assert train_of("teacher/adapt_dagger/r01", "tiny_adapt.yaml")[-1] == adapt_lent
    assert train_of("teacher/distill", "tiny_distill.yaml")[-1] == adapt_lent
    # Stage III and the ablations still train on the student's own data
    assert train_of("student/cross_scale", "tiny_cross_scale.yaml") == train_of("student/distill", "tiny_distill.yaml")

    # the borrower's round before the lender's export: refused, naming the missing file
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", "teacher/ar,teacher/dagger/*"]) == 2
    assert f"its training data {lent[0]} is not exported yet" in capsys.readouterr().err
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", "student/ar,student/dagger/*"]) == 0
    assert main(["hierarchy", "--plan", str(path), "--no-progress", "--only", "teacher/ar,teacher/dagger/*"]) == 0
    out = capsys.readouterr().out
    assert "teacher/dagger/r02" in out and out.count("trained (0 -> 2 steps)") == 2
    assert not (root / "teacher" / "dagger" / "r01" / "data").exists()

    for teacher, student, message in (({"dagger_from": "teacher"}, {}, "the only other model is 'student'"),
                                      ({"dagger_from": "student"}, {"dagger_from": "teacher"}, "borrows")):
        path.write_text(yaml.safe_dump({**plan, "teacher": {"hidden": 128, "layers": 4, **teacher},
                                        "student": {"hidden": 64, "layers": 2, **student}}))
        with pytest.raises(ConfigError, match=message):
            load_plan(path)


def test_with_wait_a_step_waits_for_what_another_process_makes(tmp_path, caplog):
    import logging
    import threading
    import time

    from wamdiff_training.hierarchy import Step, _await_inputs

    lent, pred = tmp_path / "student" / "dagger" / "r01" / "data" / "train.json", tmp_path / "teacher" / "ar"
    step = Step("teacher/dagger/r01", "ar", "tiny_ar", tmp_path / "teacher" / "dagger" / "r01", 2,
                [f"data.train=[{lent}]", f"model.init=@run:{pred}"])
    planned = {pred: 2}
    with pytest.raises(ConfigError, match="is not exported yet"):  # no wait: stop, naming the missing file
        _await_inputs(step, planned, 0)

    def at_step(n: int) -> None:  # the other process's checkpoints, as checkpoint.save leaves the pointer
        (pred / "checkpoints").mkdir(parents=True, exist_ok=True)
        (pred / "checkpoints" / "latest").write_text(f"step-{n:06d}")

    def other_process() -> None:
        time.sleep(0.1)
        lent.parent.mkdir(parents=True)
        lent.write_text("[]")
        time.sleep(0.1)
        at_step(1)  # half-way: starting from it would be silent
        time.sleep(0.1)
        at_step(2)

    worker = threading.Thread(target=other_process)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="wamdiff_training"):
        worker.start()
        _await_inputs(step, planned, 0.02)
    worker.join()
    assert time.monotonic() - started >= 0.3
    said = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(said) == len(set(said)) and "is not exported yet" in said[0]  # each new thing it waits for, once
    kinds = ("is not exported yet", "has no checkpoint yet", "at step 1 of 2")  # a busy machine may poll past one
    assert all(any(k in line for k in kinds) for line in said)

    with pytest.raises(SystemExit):  # the CLI refuses a negative interval before anything runs
        main(["hierarchy", "--wait", "x"])
    assert main(["hierarchy", "--plan", str(CONFIGS / "tiny_hierarchy.yaml"), "--wait", "-1", "--dry-run"]) == 2


def test_two_processes_export_the_world_data_once(tmp_path, monkeypatch):
    import threading
    import time

    import wamdiff_training.world.dataset as dataset

    plan = load_plan_from(tmp_path, {"root": str(tmp_path / "h"), "episodes": 4})
    calls = []

    def export(argv):  # slow enough that the second process asks while the first one writes
        calls.append(argv)
        time.sleep(0.2)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        for split in ("train", "val", "test"):
            (out / f"{split}.json").write_text("[]")
        return 0

    monkeypatch.setattr(dataset, "main", export)
    others = [threading.Thread(target=ensure_data, args=(plan, False)) for _ in range(2)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    assert len(calls) == 1


def test_recoveries_ar_lr_and_the_training_mix_reach_every_run(tmp_path, monkeypatch):
    import wamdiff_training.world.dataset as dataset

    root = tmp_path / "h"
    plan = load_plan_from(tmp_path, {
        "root": str(root), "recoveries": {"samples": 7, "scenarios": "highway,merge", "weight": 0.8},
        "task_weights": {"plan": 1.0}, "workers": 2, "ar_lr": 5e-4,
        "adapt_dagger": {"rounds": 1, "episodes": 3}})
    steps = {s.name: s for s in plan_steps(plan)}
    recoveries = root / "recoveries" / "train.json"
    for name, step in steps.items():
        if step.stage == "dagger-data":
            continue
        train = next(o for o in step.overrides if o.startswith("data.train="))
        assert train.startswith(f"data.train=[{root / 'data' / 'train.json'},{recoveries}")
        assert "data.task_weights.plan/recovery=0.8" in step.overrides, name
    config = load_config(CONFIGS / "tiny_ar.yaml", [o for o in steps["teacher/ar"].overrides])
    assert config.model.init == "tiny-random" and config.train.lr == 5e-4
    assert not any(o.startswith("train.lr=") for o in steps["student/adapt/b01"].overrides)  # AR runs only
    assert config.data.task_weights["plan/recovery"] == 0.8 and config.data.task_weights["plan"] == 1.0

    calls = []
    monkeypatch.setattr(dataset, "main", lambda argv: calls.append(argv) or 0)
    ensure_data(plan, progress=False)
    assert calls[0][:4] == ["recoveries", "--scenarios", "highway,merge", "--samples"] and "7" in calls[0]
    assert calls[0][calls[0].index("--out") + 1] == str(recoveries.parent)
    assert calls[1][calls[1].index("--out") + 1] == str(root / "data")
    recoveries.parent.mkdir(parents=True)
    recoveries.write_text("[]")
    calls.clear()
    ensure_data(plan, progress=False)
    assert [c[0] for c in calls] == ["generate"]  # recoveries exported already: not again


def test_recovery_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="recoveries.count"):
        load_plan_from(tmp_path, {"root": "x", "recoveries": {"count": 3}})
    with pytest.raises(ConfigError, match="samples must be >= 1"):
        load_plan_from(tmp_path, {"root": "x", "recoveries": {"samples": 0}})


def test_lowspeed_plan_extends_the_shipped_one_and_continues_the_student(tmp_path, capsys):
    """tiny_lowspeed.yaml: the shipped plan's export settings, its own root and a lowspeed section that starts from the
    packaged model; its steps export v2 data and the v1 replay, train at the last B, then DAgger rounds it drives.
    tiny_lowspeed_wide.yaml (the recipe tried second) adds the training-only variants from rest and drives its DAgger
    rounds over every v2 scenario, its seeds after the replay's."""
    shipped, low = load_plan(CONFIGS / "tiny_hierarchy.yaml"), load_plan(CONFIGS / "tiny_lowspeed.yaml")
    assert (low.route_points, low.format_version, low.batch_size) == (shipped.route_points, shipped.format_version,
                                                                      shipped.batch_size)
    assert low.root != shipped.root and shipped.lowspeed is None and low.lowspeed.init.endswith("wamdiff-tiny")
    steps = {s.name: s for s in plan_steps(low)}
    names = [n for n in steps if n.startswith("student/lowspeed")]
    rounds = low.lowspeed.dagger.rounds
    assert names == ["student/lowspeed/data", "student/lowspeed/replay", "student/lowspeed"] + [
        f"student/lowspeed/dagger/r{r:02d}{part}" for r in range(1, rounds + 1) for part in ("/data", "")]
    assert "scenario_file=v2" in steps["student/lowspeed/data"].overrides
    assert f"scenarios={low.scenarios}" in steps["student/lowspeed/replay"].overrides
    assert f"scenarios={low.lowspeed.scenarios}" in steps["student/lowspeed/dagger/r01/data"].overrides

    wide = load_plan(CONFIGS / "tiny_lowspeed_wide.yaml")
    assert wide.root != low.root and wide.lowspeed.init == low.lowspeed.init
    steps = {s.name: s for s in plan_steps(wide)}
    names = [n for n in steps if n.startswith("student/lowspeed")]
    rounds = wide.lowspeed.dagger.rounds
    assert names == ["student/lowspeed/data", "student/lowspeed/replay", "student/lowspeed/variants",
                     "student/lowspeed"] + [
        f"student/lowspeed/dagger/r{r:02d}{part}" for r in range(1, rounds + 1) for part in ("/data", "")]
    variants = wide.lowspeed.variants
    assert f"scenario_file={variants.scenario_file}" in steps["student/lowspeed/variants"].overrides
    from wamdiff_ros.world.scenarios import load_scenarios
    rest = load_scenarios(variants.scenario_file)  # training only: v1's roads, the ego at rest
    assert rest.scenarios and all(spec.ego_speed == 0.0 for spec in rest.scenarios.values())
    assert "variants/train.json" in steps["student/lowspeed"].overrides[0]  # data.train=[..., the variants']
    assert "scenarios=all" in steps["student/lowspeed/dagger/r01/data"].overrides  # dagger_scenarios
    seeds = {}  # every export's seeds: the DAgger rounds' follow the replay's (both drive v1's scenarios)
    for name in names:
        o = dict(x.split("=", 1) for x in steps[name].overrides if "=" in x)
        if "seed_offset" in o:
            seeds[name] = range(int(o["seed_offset"]), int(o["seed_offset"]) + int(o["episodes"]))
    rounds_first = min(seeds[f"student/lowspeed/dagger/r{r:02d}/data"].start for r in range(1, rounds + 1))
    assert rounds_first >= max(r.stop for n, r in seeds.items() if "dagger" not in n)

    steps = {s.name: s for s in plan_steps(low)}
    rounds = low.lowspeed.dagger.rounds
    assert LowSpeedPlan(variants={"scenario_file": "v1", "scenarios": "merge"}).variants.episodes == 20  # frozen
    with pytest.raises(ConfigError, match="lowspeed.variants.count"):
        LowSpeedPlan(variants={"scenario_file": "v2", "count": 3})
    with pytest.raises(ConfigError, match="lowspeed.variants.episodes"):
        LowSpeedPlan(variants={"scenario_file": "v2", "episodes": 0})
    with pytest.raises(ConfigError, match="none.yaml: cannot read the scenario file"):
        LowSpeedPlan(variants={"scenario_file": str(tmp_path / "none.yaml")})
    with pytest.raises(ConfigError, match="no scenario 'nowhere'"):
        LowSpeedPlan(variants={"scenario_file": "v2", "scenarios": "start_clear,nowhere"})
    assert f"model.init={low.lowspeed.init}" in steps["student/lowspeed"].overrides
    assert "adapt.block_size=32" in steps["student/lowspeed/dagger/r01"].overrides
    assert str(final_run(low)).endswith(f"student/lowspeed/dagger/r{rounds:02d}")
    weights = low.lowspeed.task_weights or {}  # the low-speed steps' own mix on top of the plan's
    for task, w in weights.items():
        assert f"data.task_weights.{task}={w}" in steps["student/lowspeed"].overrides
    extra = load_plan(CONFIGS / "tiny_lowspeed.yaml")
    extra.lowspeed.task_weights = {"plan/rest_start": 0.25}
    assert "data.task_weights.plan/rest_start=0.25" in {s.name: s for s in plan_steps(extra)}[
        f"student/lowspeed/dagger/r{rounds:02d}"].overrides
    with pytest.raises(ConfigError, match="lowspeed.task_weights"):
        LowSpeedPlan(task_weights={"plan/rest_start": -1.0})

    # a small one, run: from the packaged model, one v2 episode, a DAgger round driven by the continued model
    plan = {"extends": str(CONFIGS / "tiny_lowspeed.yaml"), "root": str(tmp_path / "low"), "batch_size": 2,
            "checkpoint_every": 1, "workers": 1,
            "lowspeed": {"init": "wamdiff_ros/assets/wamdiff-tiny", "scenarios": "start_queue", "episodes": 1,
                         "replay": 0, "variants": None, "dagger_scenarios": None, "steps": 1,
                         "dagger": {"rounds": 1, "episodes": 1, "steps": 1}}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["hierarchy", "--plan", str(path), "--only", "student/lowspeed*", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("exported") == 2 and out.count("trained (0 -> 1 steps)") == 2
    root = tmp_path / "low" / "student" / "lowspeed"
    assert json.loads((root / "data" / "manifest.json").read_text())["scenario_set"]["version"] == 2
    dagger = json.loads((root / "dagger" / "r01" / "data" / "manifest.json").read_text())
    assert dagger["scenario_set"]["version"] == 2 and dagger["dagger"]["driver"].startswith(str(root / "run"))
    assert not (tmp_path / "low" / "data").exists()  # the chain's own data was not made
    final = checkpoint.resolve(checkpoint.LATEST, root / "dagger" / "r01")
    assert json.loads((final / "wamdiff.json").read_text())["trained_block_size"] == 32
    assert main(["hierarchy", "--plan", str(path), "--set", "lowspeed.steps=2", "--only", "student/lowspeed",
                 "--dry-run"]) == 0
    assert "to run (1/2 steps)" in capsys.readouterr().out
    assert main(["hierarchy", "--plan", str(path), "--set", "lowspeed.episodes=0", "--dry-run"]) == 2
