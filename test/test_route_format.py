"""The route line's two number formats (``fmt.ROUTE_FORMATS``): 2 writes every number in version 2's width, 3 writes
each y as version 3's answers do (a sideways bin, then the residual). Both parse back to the same points, an export
and ``wamdiff-data reformat`` write the chosen one, training refuses a mix and records which it saw
(``DecodeMeta.route_format``), and a hierarchy plan passes it to every export."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model import META_FILE, DecodeMeta, load_checkpoint, save_checkpoint, tiny_random
from wamdiff_ros.world.dataset import main as data_main

try:
    import wamdiff_training  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_training.config import ConfigError  # noqa: E402
from wamdiff_training.data import Record, RecordError  # noqa: E402
from wamdiff_training.engine import _meta, route_format_in  # noqa: E402
from wamdiff_training.hierarchy import load_plan  # noqa: E402

TURN = np.array([[10.0, -0.77], [29.24, -15.3]])


def test_route_format_3_writes_each_y_as_a_bin_and_parses_back():
    assert fmt.route_line(TURN) == fmt.route_line(TURN, 2) == "The route passes (010.00,-00.77) and (029.24,-15.30)"
    line = fmt.route_line(TURN, 3)
    assert line == "The route passes (010.00,e04.23) and (029.24,c09.70)"
    # the far point's bin letter is the one a version-3 answer writes for a y of that size
    assert fmt.format_waypoints(np.tile([29.24, -15.3], (8, 1)), 3).split(",")[1] == "c09.70"
    for route_format, text in ((2, fmt.route_line(TURN, 2)), (3, line)):
        np.testing.assert_allclose(fmt.parse_route_line(text), TURN, atol=1e-9)
        assert fmt.route_line_format(text) == route_format
    assert fmt.route_line_format(fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.0, 0.0))) is None
    straight = fmt.route_line(np.array([[10.0, 0.0], [30.0, 0.0]]), 3)
    assert straight.endswith("(010.00,e05.00) and (030.00,e05.00)")
    with pytest.raises(ValueError, match="route format"):
        fmt.route_line(TURN, 1)


def test_a_prompts_route_line_is_rewritten_in_place():
    prompt = fmt.plan_prompt(fmt.Command.RIGHT, (6.0, 0.1), (0.2, 0.0), TURN)
    binned = fmt.plan_prompt(fmt.Command.RIGHT, (6.0, 0.1), (0.2, 0.0), TURN, route_format=3)
    assert binned != prompt and binned.replace(fmt.route_line(TURN, 3), fmt.route_line(TURN)) == prompt
    assert fmt.rewrite_route_line(prompt, None, 3) == binned
    assert fmt.rewrite_route_line(binned, TURN, 2) == prompt
    paper = fmt.plan_prompt(fmt.Command.RIGHT, (6.0, 0.1), (0.2, 0.0))
    assert fmt.rewrite_route_line(paper, None, 3) == paper


def test_decode_meta_keeps_the_route_format_and_old_files_load_as_2(tmp_path):
    bundle = tiny_random(seed=3, meta=DecodeMeta(route_points=True, route_format=3), hidden=64, layers=2)
    folder = save_checkpoint(bundle, tmp_path / "ckpt")
    assert load_checkpoint(folder).meta.route_format == 3
    old = {k: v for k, v in json.loads((folder / META_FILE).read_text()).items() if k != "route_format"}
    (folder / META_FILE).write_text(json.dumps(old))
    assert load_checkpoint(folder).meta == replace(bundle.meta, route_format=2)
    for bad in (1, 4, True, "3"):
        with pytest.raises(CheckpointError, match="route_format"):
            DecodeMeta(route_format=bad)


def _record(key: str, user: str, task: str = "plan") -> Record:
    return Record(key, Path("x.png"), user, "answer", task, source=f"{key}.json")


def test_training_records_the_route_format_and_refuses_a_mix():
    two = _record("a", fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.0, 0.0), TURN))
    three = _record("b", fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.0, 0.0), TURN, 3))
    paper = _record("c", fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.0, 0.0)))
    ask = _record("d", fmt.ask_prompt("Where? " + fmt.route_line(TURN, 3)), "ask")
    assert route_format_in([paper, ask]) is None and route_format_in([paper, two]) == 2
    assert route_format_in([three, paper, ask]) == 3
    with pytest.raises(RecordError,
                       match=r"a\.json.*route format 2 but b\.json \('b'\) in route format 3.*reformat --route-format"):
        route_format_in([two, paper, three])

    class Stage:
        def decode_meta(self, meta):
            return meta

    class Bundle:
        meta = DecodeMeta(route_points=True)

    assert _meta(Stage(), Bundle(), 3, True, 3) == replace(Bundle.meta, format_version=3, route_format=3)
    assert _meta(Stage(), Bundle(), 3, True, None).route_format == 2  # no route lines: what the model had


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A short intersection episode with counterfactual commands, route points in format 3 and answers in version 3."""
    out = tmp_path_factory.mktemp("route_format") / "set"
    assert data_main(["generate", "--scenarios", "intersection", "--episodes", "1", "--max-seconds", "4",
                      "--questions", "0", "--noise-fraction", "0", "--counterfactual-commands", "--route-points",
                      "--route-format", "3", "--format-version", "3", "--out", str(out), "--preview", "0",
                      "--no-progress"]) == 0
    return out


def test_an_export_writes_the_route_line_in_its_route_format(export):
    assert json.loads((export / "manifest.json").read_text())["route_format"] == 3
    plans = [s for s in json.loads((export / "train.json").read_text()) if s["task"] == "plan"]
    assert plans and any(s["meta"].get("counterfactual") for s in plans)
    for s in plans:
        m, prompt = s["meta"], s["conversations"][0]["value"]
        assert prompt == fmt.plan_prompt(fmt.Command(m["command"]), m["velocity"], m["acceleration"],
                                         np.asarray(m["route_points"]), 3)
        assert fmt.route_line_format(prompt) == 3


def test_reformat_rewrites_route_lines_from_the_meta_and_keeps_the_answers(export, capsys):
    path = export / "train.json"
    before = json.loads(path.read_text())
    assert data_main(["reformat", str(path), "--version", "3", "--route-format", "2", "--suffix", "_r2"]) == 0
    plans = sum(s["task"] == "plan" for s in before)
    assert f"{plans} route lines in route format 2" in capsys.readouterr().out
    after = json.loads((export / "train_r2.json").read_text())
    for a, b in zip(before, after):
        assert a["conversations"][1] == b["conversations"][1] and a["meta"] == b["meta"]
        if a["task"] == "plan":
            m = a["meta"]
            assert b["conversations"][0]["value"] == fmt.plan_prompt(
                fmt.Command(m["command"]), m["velocity"], m["acceleration"], np.asarray(m["route_points"]))
        else:
            assert a == b
    assert data_main(["reformat", str(export / "train_r2.json"), "--version", "3"]) == 0  # route lines kept
    assert json.loads((export / "train_r2.json").read_text()) == after


def _plan(tmp_path, extra: dict):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"root": str(tmp_path / "r"), **extra}))
    return load_plan(path)


def test_a_hierarchy_plan_passes_its_route_format_to_every_export(tmp_path, monkeypatch):
    import wamdiff_ros.world.dataset as dataset
    from wamdiff_training.hierarchy import Step, ensure_data, export_dagger

    calls = []
    monkeypatch.setattr(dataset, "main", lambda argv: calls.append(argv) or 0)
    plan = _plan(tmp_path, {"episodes": 2, "eval_episodes": 1, "route_points": True, "format_version": 3,
                            "route_format": 3, "recoveries": {"samples": 2, "scenarios": "highway", "weight": 1.0}})
    ensure_data(plan, progress=False)
    export_dagger(plan, Step("student/dagger/r01/data", "dagger-data", "", tmp_path / "d", 0,
                             ["seed_offset=40", "episodes=2", "expert_share=0.2"]), "a-model", progress=False)
    assert [c[0] for c in calls] == ["recoveries", "generate", "generate", "generate"]
    assert all(a[a.index("--route-format") + 1] == "3" and "--route-points" in a for a in calls)
    assert _plan(tmp_path, {"route_points": True}).route_format == 2


@pytest.mark.parametrize(("extra", "words"), [({"route_points": True, "route_format": 4}, "one of"),
                                              ({"route_points": True, "route_format": True}, "one of"),
                                              ({"route_format": 3}, "needs route_points")])
def test_a_bad_route_format_is_refused(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words):
        _plan(tmp_path, extra)
