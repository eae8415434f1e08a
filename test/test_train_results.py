"""``wamdiff-train results``: ``evaluate`` on a small fake hierarchy (tiny-random checkpoints in the run folders the
real one writes, a 2 s held-out export, the 3 s closed-loop scenarios) into compact JSON, then ``render`` from that
real JSON: tables, the paired bootstrap CI, the paper comparison, missing runs and pieces as "not run", and a second
``evaluate`` that keeps what is there and evaluates only what is new."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.model import DecodeMeta, tiny_random
from wamdiff_ros.world.summary import paired_difference_ci
from wamdiff_training import evaluate_runs, render, results, runs
from wamdiff_training.checkpoint import save_checkpoint
from wamdiff_training.cli import main as train_main
from wamdiff_training.metrics_log import MetricsLog
from wamdiff_training.world.dataset import main as export

LOGIT_SCALE = 48.0  # as conftest.scaled_tiny: threshold decoding fixes several tokens per step
PRESENT = ("teacher/ar", "student/ar", "student/adapt/b08", "student/cross_scale", "teacher/distill")
PLAN = """root: unused
ar_steps: 30
curriculum: [1, 4, 8, 16, 32]
adapt_steps: 10
distill_steps: 10
cross_scale_steps: 20
"""


def _run_folder(root: Path, run: str, source: Path, step: int = 4) -> None:
    """<root>/<run>/checkpoints/step-N (a link to ``source``) + latest + metrics.csv, as the engine leaves them."""
    checkpoints = root / run / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / f"step-{step:06d}").symlink_to(source, target_is_directory=True)
    (checkpoints / "latest").write_text(f"step-{step:06d}\n")
    log = MetricsLog(root / run, True, 0, False)
    for s, loss in enumerate((6.0, 4.5, 3.5, 3.0), 1):
        log.write(s, {"loss": loss, "lr": 1e-3, "samples_per_s": 20.0})
    log.close()


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("train_results")
    root = base / "root"
    assert export(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "2", "--out",
                   str(root / "data"), "--preview", "0", "--no-progress", "--split", "test"]) == 0
    ar = tiny_random(seed=0, meta=DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal"))
    save_checkpoint(ar, base / "ckpt" / "ar")
    for b, seed in ((8, 1), (32, 2)):
        block = tiny_random(seed=seed, meta=DecodeMeta(trained_block_size=b))
        with torch.no_grad():
            block.model.model.language_model.norm.weight.mul_(LOGIT_SCALE)
        save_checkpoint(block, base / "ckpt" / f"b{b}")
    sources = {"teacher/ar": "ar", "student/ar": "ar", "student/adapt/b08": "b8", "student/cross_scale": "b32",
               "teacher/distill": "b32"}
    for run in PRESENT:
        _run_folder(root, run, base / "ckpt" / sources[run])
    (base / "plan.yaml").write_text(PLAN)
    return {"base": base, "root": root, "ckpt": base / "ckpt", "plan": base / "plan.yaml"}


def _evaluate_argv(fake: dict, out: Path, short_scenario_file, *extra: str) -> list[str]:
    return ["results", "evaluate", "--root", str(fake["root"]), "--out", str(out), "--work",
            str(fake["base"] / "work"), "--max-samples", "1", "--episodes", "1", "--scenarios", "highway",
            "--scenario-file", str(short_scenario_file), "--workers", "1", "--plan", str(fake["plan"]), *extra]


@pytest.fixture(scope="module")
def evaluated(fake, short_scenario_file) -> Path:
    out = fake["base"] / "results"
    assert train_main(_evaluate_argv(fake, out, short_scenario_file)) == 0  # through wamdiff-train's dispatch
    return out


@pytest.fixture(scope="module")
def rendered(evaluated, fake) -> tuple[str, Path]:
    md = fake["base"] / "RESULTS.md"
    assert train_main(["results", "render", "--results", str(evaluated), "--out", str(md)]) == 0
    return md.read_text(), md


def _load(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_default_threshold_is_the_decoders():
    assert runs.DEFAULT_THRESHOLD == DecodeSettings().threshold


def test_open_loop_json(evaluated, fake):
    ol = _load(evaluated, "open_loop")
    assert ol["piece"] == "open_loop" and ol["schema"] == runs.SCHEMA and ol["complete"] is False
    entries = ol["entries"]
    assert list(entries) == [t.key for t in runs.OPEN_LOOP]
    for key in ("student_b04", "student_b16", "student_b32", "student_distill"):
        assert entries[key]["status"] == "not run" and str(fake["root"]) in entries[key]["reason"]
    ok = {k: e for k, e in entries.items() if e["status"] == "ok"}
    assert set(ok) == {"teacher_ar", "student_ar", "student_b08", "student_final", "teacher_b32"}
    assert ok["student_ar"]["decode"]["mode"] == "ar" and ok["student_b08"]["decode"]["block_size"] == 8
    assert ok["student_final"]["decode"]["block_size"] == 32 and ok["student_final"]["step"] == 4
    assert sorted(r["threshold"] for r in ok["student_final"]["plan"]) == sorted(runs.SWEEP)
    assert [r["threshold"] for r in ok["student_b08"]["plan"]] == [runs.DEFAULT_THRESHOLD]
    for e in ok.values():
        assert e["command_line"][:2] == ["wamdiff-train", "eval"]
        for row in e["plan"]:
            assert len(row["l2_per_waypoint"]) == fmt.NUM_WAYPOINTS and row["plans"] == 1
            assert 0 < row["forward_calls_per_token"] <= 1 and row["tokens_per_s"] > 0
            (group, numbers), = row["by_behaviour"].items()  # the one plan record: its expert behaviour
            assert group in ("cruise", "lane_change", "yield") and numbers["plans"] == 1
            assert numbers["constant_velocity_l2_mean"] >= 0 and numbers["turns"] in (0, 1)
            assert (numbers["turn_shortfall_m"] is None) == (numbers["turns"] == 0)
        assert 0 <= e["token_accuracy"] <= 1 and e["detection"]["records"] == 1 and e["questions"] == 1
        (question, numbers), = e["per_question"].items()  # the one ask record, by its question key
        assert question in ("lead", "lane", "left_free", "right_free", "command") and numbers["records"] == 1
    assert ok["teacher_b32"]["rho"] is None  # the rho teacher itself
    assert ok["student_final"]["rho"]["value"] == 1.0 and ok["student_final"]["rho"]["k"] == 5  # the same weights
    assert ol["data"]["used"] == {"ask": 1, "detect": 1, "plan": 1}
    assert ol["data"]["available"]["plan"] == sum(
        r["task"] == "plan" for r in json.loads((fake["root"] / "data" / "test.json").read_text()))


def test_ablation_divergence_overlap_json(evaluated):
    ab, dv, ov = (_load(evaluated, n) for n in ("ablation", "divergence", "overlap"))
    assert {k: e["status"] for k, e in ab["entries"].items()} == {
        "direct": "not run", "curriculum": "not run", "block_distill": "not run", "model_distill": "ok",
        "ar_teacher": "not run"}
    assert "student/ablation/direct" in ab["entries"]["direct"]["reason"]
    assert [r["threshold"] for r in ab["entries"]["model_distill"]["plan"]] == [runs.DEFAULT_THRESHOLD]
    final = _load(evaluated, "open_loop")["entries"]["student_final"]
    row = next(r for r in final["plan"] if r["threshold"] == runs.DEFAULT_THRESHOLD)
    assert ab["entries"]["model_distill"]["plan"][0] == row  # one decode, reused
    assert {k: e["status"] for k, e in dv["entries"].items()} == {"jsd": "ok", "fkl": "not run", "rkl": "not run"}
    statuses = {k: e["status"] for k, e in ov["entries"].items()}
    assert statuses == {"student_distill__diffusion": "not run", "student_distill__ar": "not run",
                        "student_final__diffusion": "ok", "student_final__ar": "ok"}
    same, ar = ov["entries"]["student_final__diffusion"], ov["entries"]["student_final__ar"]
    assert same["rho"]["value"] == 1.0 and 0 <= ar["rho"]["value"] < 1
    assert ar["rho"]["alignment"].startswith("AR-aligned") and ar["teacher_decode"] == "ar"


def test_closed_loop_json_keeps_episode_rows(evaluated):
    cl = _load(evaluated, "closed_loop")
    assert cl["settings"]["modes"] == ["paused", "realtime"] and cl["complete"] is True
    assert list(cl["entries"]) == ["baselines", "ar", "student"]  # teacher_ar only with --with-teacher
    planners = {(g["planner"], g["mode"]) for e in cl["entries"].values() for g in e["groups"]}
    assert "plan_blend_tau_s" not in cl["settings"]
    assert planners == {(p, m) for p in ("expert", "constant_velocity", "ar", "student")
                        for m in ("paused", "realtime")}
    for e in cl["entries"].values():
        assert e["command_line"][:2] == ["wamdiff-eval", "closed-loop"] and "--realtime" in e["command_line"]
        # the committed logs' protocol: plans followed unblended, and no settings key for it (they predate blending)
        assert e["command_line"][e["command_line"].index("--blend-tau") + 1] == "0.0"
        for row in e["episodes"]:
            assert {"planner", "mode", "scenario", "seed", "ds", "rc", "collisions", "completed", "success"} <= set(row)
            assert row["scenario"] == "highway" and row["seed"] == 1_000_000 and 0 <= row["ds"] <= 100
    assert cl["entries"]["student"]["groups"][0]["forward_calls_per_token"] < 1
    assert len(cl["entries"]["student"]["videos"]) == 1  # --videos 2 on one scenario
    assert cl["entries"]["ar"]["checkpoint"].endswith("step-000004")  # the run's, not the snapshot's path


def test_runs_json(evaluated, fake):
    runs = _load(evaluated, "runs")
    by_run = {r["run"]: r for r in runs["runs"]}
    for run in PRESENT:
        r = by_run[run]
        weights = Path(r["checkpoint"]) / "model.safetensors"
        assert r["status"] == "ok" and r["steps"] == 4 and r["safetensors_bytes"] == weights.stat().st_size
        with safe_open(str(weights), "pt") as f:
            assert r["params"] == sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        assert r["metrics"]["loss_first"] == 6.0 and r["metrics"]["loss_last"] == 3.0
    assert by_run["student/cross_scale"]["planned_steps"] == 20 and by_run["student/ar"]["block_size"] == 1
    assert by_run["student/ablation/fkl"]["status"] == "not run"
    test = runs["data"]["splits"]["test"]
    records = json.loads((fake["root"] / "data" / "test.json").read_text())
    assert test["records"] == len(records) and test["episodes"] == 1 and runs["data"]["image_size"][0] > 0


def test_json_logs_are_small(evaluated):
    for name in runs.PIECES:
        path = evaluated / f"{name}.json"
        assert path.stat().st_size < 40_000, name
        assert "NaN" not in path.read_text()


def test_render_tables(rendered):
    text, md = rendered
    assert text.splitlines()[2] == runs.HEADER
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert [h.split()[1] for h in heads] == ["(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)", "Runs", "Where"]
    assert "*not run* — `training/results/lowspeed.json` is missing" in text  # no low-speed comparison logged
    assert re.search(r"^\| student Stage I B=4 \| not run \|", text, re.M)
    assert re.search(r"^\| direct AR → B=32 \(no curriculum\) \| not run \|", text, re.M)
    t = re.escape(f"{runs.DEFAULT_THRESHOLD:.2f}")
    assert re.search(rf"^\| student Stage I B=8 \| B=8, t={t} \| 4 \|", text, re.M)
    assert re.search(r"^\| forward KL \| not run \|", text, re.M)
    behaviours = text.split("### Plan L2 by what the expert does")[1].split("###")[0]
    assert re.search(r"^\| student AR \| [\d.]+ \([\d.]+\) \|", behaviours, re.M)
    assert "turn shortfall (m) |" in behaviours and re.search(r"^\| student AR \|.* \| (-|-?[\d.]+) \|$",
                                                               behaviours, re.M)  # the column: a number or -
    perception = text.split("### What the camera tells the model")[1].split("###")[0]
    assert re.search(r"^\| student AR \| [\d.]+ \| - \| - \| - \|", perception, re.M)  # one question, no lead
    sweep = text.split("### Threshold sweep")[1].split("##")[0]
    assert [float(t) for t in re.findall(r"^\| (0\.\d+) \|", sweep, re.M)] == sorted(runs.SWEEP, reverse=True)
    figure = md.parent / "results" / runs.FIGURE
    assert "![per-waypoint L2](results/l2_curve.png)" in text
    assert figure.is_file() and figure.read_bytes()[:4] == b"\x89PNG"
    assert "each followed as it comes (no plan blending)" in text
    assert re.search(r"^\| final student \(B=32\) \| realtime \| 1 \| [\d.]+ \[[\d.]+, [\d.]+\] \|", text, re.M)
    assert "| student/cross_scale | - | B=32 | 4 / 20 |" in text and "`student/ablation/rkl`" in text


def test_render_paired_ci_and_the_paper_comparison(rendered, evaluated):
    text, _ = rendered
    episodes = [row for e in _load(evaluated, "closed_loop")["entries"].values() for row in e["episodes"]]
    for mode in ("paused", "realtime"):
        ds = {p: [r["ds"] for r in episodes if r["planner"] == p and r["mode"] == mode] for p in ("student", "ar")}
        diff, lo, hi = paired_difference_ci(ds["student"], ds["ar"], level=0.9)
        assert f"| {mode} | 1 | {diff:.1f} [{lo:.1f}, {hi:.1f}] |" in text
    assert "Acceptance" not in text and "issue" not in text
    verdicts = text.split("## Where we disagree with the paper")[1]
    assert "paper: the B=32 student matches its AR counterpart's planning quality" in verdicts
    assert "paper: JSD is the better Stage III divergence than forward or reverse KL: not run" in verdicts


def test_render_marks_missing_pieces_not_run(evaluated, tmp_path):
    shutil.copy(evaluated / "runs.json", tmp_path / "runs.json")
    md = tmp_path / "out" / "RESULTS.md"
    text = results.render(tmp_path, md)
    for name in ("open_loop", "ablation", "divergence", "overlap", "closed_loop"):
        assert f"`training/results/{name}.json` is missing" in text
    assert not (tmp_path / runs.FIGURE).exists() and "(e) Per-waypoint L2" in text
    assert "| teacher/ar |" in text  # runs.json is there
    assert results.render(tmp_path, md) == text  # deterministic: regenerates byte for byte


def test_evaluate_again_keeps_and_adds_only_what_is_new(evaluated, fake, short_scenario_file, monkeypatch):
    out = fake["base"] / "results_again"
    shutil.copytree(evaluated, out)
    before = {n: _load(out, n) for n in runs.PIECES if n != "runs"}
    from wamdiff_ros.world import evaluate as closed_loop_cli
    from wamdiff_training import evaluation

    def refuse(*args, **kwargs):
        raise AssertionError("evaluated again")

    monkeypatch.setattr(evaluation, "evaluate", refuse)
    monkeypatch.setattr(evaluation, "teacher_forced", refuse)
    monkeypatch.setattr(closed_loop_cli, "main", refuse)
    assert train_main(_evaluate_argv(fake, out, short_scenario_file)) == 0
    assert {n: _load(out, n) for n in before} == before  # every piece kept as it was
    monkeypatch.undo()
    stale = _load(out, "open_loop")  # student AR evaluated before the rho teacher existed: only rho is computed
    stale["entries"]["student_ar"]["rho"] = None
    (out / "open_loop.json").write_text(json.dumps(stale))
    calls = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda args, argv: calls.append(args.checkpoint) or real(args, argv))
    if not (fake["ckpt"] / "b16").exists():  # weights of its own: the same weights would be kept (another test)
        block = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=32))
        with torch.no_grad():
            block.model.model.language_model.norm.weight.mul_(LOGIT_SCALE)
        save_checkpoint(block, fake["ckpt"] / "b16")
    _run_folder(fake["root"], "student/adapt/b16", fake["ckpt"] / "b16")
    try:  # a run that appeared since: evaluated alone
        assert train_main(_evaluate_argv(fake, out, short_scenario_file, "--only", "open_loop")) == 0
    finally:
        shutil.rmtree(fake["root"] / "student" / "adapt" / "b16")
    assert len(calls) == 1 and "b16" in calls[0][0]
    after = _load(out, "open_loop")["entries"]
    assert after["student_b16"]["status"] == "ok" and after["student_b16"]["decode"]["block_size"] == 32
    assert {k: v for k, v in after.items() if k != "student_b16"} == \
        {k: v for k, v in before["open_loop"]["entries"].items() if k != "student_b16"}  # student AR's rho is back


@pytest.mark.parametrize("argv, message", [
    (["--only", "open_loop,nonsense"], "--only: unknown piece(s) nonsense"),
    (["--root", "/no/such/root"], "--root /no/such/root: no such folder"),
    (["--only", "closed_loop", "--redo", "ar,teacher"], "--redo: unknown closed-loop key(s) teacher"),
])
def test_bad_arguments_exit_2(argv, message, capsys, tmp_path):
    assert train_main(["results", "evaluate", "--out", str(tmp_path / "r"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_json_rows_are_one_line_each(evaluated):
    text = (evaluated / "closed_loop.json").read_text()
    rows = [json.loads(line.strip().rstrip(",")) for line in text.splitlines() if '"seed": ' in line]
    assert len(rows) == 8 and all(set(r) >= {"planner", "mode", "ds"} for r in rows)  # 4 planners x 2 modes
    assert runs.clean({"x": float("nan"), "y": 1.234567891}) == {"x": None, "y": 1.2346}


def test_card_metrics_for_the_model_card(evaluated, tmp_path):
    lines = render.card_metrics(evaluated)
    assert lines[0].startswith(f"- open loop (held-out split, B=32, threshold {runs.DEFAULT_THRESHOLD:.2f})")
    assert [line.split(":")[0] for line in lines[1:]] == ["- closed loop, paused", "- closed loop, realtime"]
    assert all("paired student − AR" in line and "constant velocity" in line for line in lines[1:])
    assert render.card_metrics(tmp_path) == ["- No results logged yet: run `make results-eval`."]


def test_a_run_trained_again_in_the_same_folder_is_evaluated_again(evaluated, fake, short_scenario_file):
    out = fake["base"] / "results_retrained"
    shutil.copytree(evaluated, out)
    retrained = tiny_random(seed=5, meta=DecodeMeta(trained_block_size=32))
    save_checkpoint(retrained, fake["ckpt"] / "b32_retrained")
    link = fake["root"] / "student" / "cross_scale" / "checkpoints" / "step-000004"  # same path, other weights
    old = link.resolve()
    link.unlink()
    link.symlink_to(fake["ckpt"] / "b32_retrained", target_is_directory=True)
    try:  # the logged open_loop / ablation entries of the old weights must not answer for the new ones either
        assert train_main(_evaluate_argv(fake, out, short_scenario_file, "--only", "divergence")) == 0
    finally:
        link.unlink()
        link.symlink_to(old, target_is_directory=True)
    jsd = _load(out, "divergence")["entries"]["jsd"]
    assert jsd["status"] == "ok" and jsd["checkpoint"] == str(link)
    assert jsd["weights"] == evaluate_runs.weights_id(fake["ckpt"] / "b32_retrained")
    before = _load(evaluated, "divergence")["entries"]["jsd"]
    assert jsd["weights"] != before["weights"]
    assert (jsd["token_accuracy"], jsd["plan"]) != (before["token_accuracy"], before["plan"])  # numbers of new weights


def test_ar_rows_are_the_last_dagger_round_of_the_plan(fake, tmp_path):
    """With DAgger rounds in the plan, "the AR model" everywhere is each model's last round, and its rows say so."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "data").symlink_to(fake["root"] / "data", target_is_directory=True)
    for run in ("teacher/dagger/r02", "student/dagger/r02"):
        _run_folder(root, run, fake["ckpt"] / "ar")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN + "dagger: {rounds: 2, episodes: 1, steps: 1}\n")
    ar = runs.final_ar_runs(runs.load_hierarchy_plan(str(plan), root), root)
    assert ar == {"teacher/ar": "teacher/dagger/r02", "student/ar": "student/dagger/r02"}
    assert runs.load_hierarchy_plan(None, root) is None and runs.final_ar_runs(None, root) == {}
    assert [t.label for t in runs.with_ar(runs.CLOSED_LOOP, ar) if t.key == "ar"] == \
        ["AR model (student/dagger/r02)"]
    assert runs.with_ar(runs.OPEN_LOOP, {}) == runs.OPEN_LOOP
    assert {t.run for t in runs.DIVERGENCE + runs.ABLATION} >= {"student/cross_scale"}  # Stage III's own rows

    out = tmp_path / "results"
    assert train_main(["results", "evaluate", "--root", str(root), "--out", str(out), "--work", str(tmp_path / "work"),
                       "--max-samples", "1", "--only", "open_loop", "--plan", str(plan)]) == 0
    entries = _load(out, "open_loop")["entries"]
    assert entries["student_ar"]["status"] == "ok" and entries["student_ar"]["run"] == "student/dagger/r02"
    assert entries["teacher_ar"]["status"] == "ok" and entries["teacher_ar"]["run"] == "teacher/dagger/r02"
    assert entries["student_b08"]["status"] == "not run"  # the plan's other runs: where they always are
    md = tmp_path / "RESULTS.md"
    assert train_main(["results", "render", "--results", str(out), "--out", str(md)]) == 0
    assert "| student AR (student/dagger/r02) | AR |" in md.read_text()


def test_a_plan_that_does_not_load_is_refused(tmp_path, capsys):
    (tmp_path / "root").mkdir()
    (tmp_path / "plan.yaml").write_text("root: x\ndagger: {rounds: 0}\n")
    assert train_main(["results", "evaluate", "--root", str(tmp_path / "root"), "--out", str(tmp_path / "r"),
                       "--only", "runs", "--plan", str(tmp_path / "plan.yaml")]) == 2
    assert f"--plan {tmp_path / 'plan.yaml'}" in capsys.readouterr().err


def test_planned_runs_leave_out_dagger_exports(tmp_path):
    from wamdiff_training.hierarchy import DaggerPlan, HierarchyPlan

    plan = HierarchyPlan(root=str(tmp_path / "h"), dagger=DaggerPlan(rounds=2), adapt_dagger=DaggerPlan(rounds=1))
    planned = runs.planned_steps(plan, tmp_path / "h")
    assert "student/dagger/r02" in planned and "student/adapt_dagger/r01" in planned
    assert not [run for run in planned if run.endswith("/data")]  # exports are data: no checkpoint to report


def test_render_compares_the_stage_two_student_when_it_was_driven(evaluated, tmp_path, short_scenario_file, fake):
    for name in ("open_loop", "closed_loop"):
        shutil.copy(evaluated / f"{name}.json", tmp_path / f"{name}.json")
    piece = _load(tmp_path, "closed_loop")
    assert "student_stage2" not in piece["entries"] and piece["complete"] is True  # its run is absent: skipped
    stage2 = {**json.loads(json.dumps(piece["entries"]["student"])), "run": "student/distill",
              "label": "student after Stage II (B=32, before Stage III)"}
    for row in [*stage2["episodes"], *stage2["groups"]]:
        row["planner"] = "student_stage2"
        row["ds"] = row["ds"] + 10.0  # Stage III cost ten points here
    piece["entries"]["student_stage2"] = stage2
    (tmp_path / "closed_loop.json").write_text(json.dumps(piece))
    md = tmp_path / "RESULTS.md"
    assert train_main(["results", "render", "--results", str(tmp_path), "--out", str(md)]) == 0
    text = md.read_text()
    assert "| student after Stage II (B=32, before Stage III) | paused | 1 |" in text
    assert re.search(r"^\| final student − Stage II student \(what Stage III did\) \| paused \| 1 \| -10\.0 ", text,
                     re.M)
    assert "| Stage II student − AR model | realtime | 1 |" in text


def test_a_missing_held_out_split_is_named(tmp_path):
    with pytest.raises(runs.ResultsError, match=str(tmp_path / "v3" / "data" / "test.json")):
        evaluate_runs.data_subset(tmp_path / "v3" / "data", tmp_path / "work", 4)


def _entry_pairs(before_out: Path, after_out: Path):
    """(piece, key, entry before, entry after) over the entry pieces of two --out folders, which hold the same keys."""
    for name in ("open_loop", "ablation", "divergence", "overlap", "closed_loop"):
        before, after = _load(before_out, name)["entries"], _load(after_out, name)["entries"]
        assert after.keys() == before.keys(), name
        for key, entry in after.items():
            yield name, key, before[key], entry


def _evaluate_elsewhere(evaluated, fake, short_scenario_file, monkeypatch, root: Path, name: str) -> Path:
    """``results evaluate`` of the fake's logged results under another root (with a plan on the same held-out
    export), with every evaluation refused: what it keeps, it keeps without evaluating again. Returns --out."""
    plan = fake["base"] / f"plan_{name}.yaml"
    plan.write_text(PLAN)
    if not (root / "data").exists():  # the same held-out export
        root.mkdir(parents=True, exist_ok=True)
        (root / "data").symlink_to(fake["root"] / "data", target_is_directory=True)
    out = fake["base"] / f"results_{name}"
    shutil.copytree(evaluated, out)
    from wamdiff_ros.world import evaluate as closed_loop_cli
    from wamdiff_training import evaluation

    def refuse(*args, **kwargs):
        raise AssertionError("evaluated again")

    for module, function in ((evaluation, "evaluate"), (evaluation, "teacher_forced"), (closed_loop_cli, "main")):
        monkeypatch.setattr(module, function, refuse)
    argv = _evaluate_argv(fake, out, short_scenario_file)
    argv[argv.index("--root") + 1], argv[argv.index("--plan") + 1] = str(root), str(plan)
    assert train_main(argv) == 0
    return out


def test_a_plan_that_links_the_runs_under_another_root_keeps_their_entries(evaluated, fake, short_scenario_file,
                                                                            monkeypatch):
    """A root that links another root's runs: their entries stand for the same weights, so nothing is evaluated
    again; the kept entries name the new root's checkpoints."""
    root = fake["base"] / "root_linked"
    shutil.copytree(fake["root"], root, symlinks=True, ignore=shutil.ignore_patterns("data"))
    out = _evaluate_elsewhere(evaluated, fake, short_scenario_file, monkeypatch, root, "linked")
    for name, key, old, entry in _entry_pairs(evaluated, out):
        if old.get("status") != "ok":  # not run: the reason names the new root's folder
            assert entry["status"] == old["status"] and str(root) in entry["reason"]
            continue
        if old.get("checkpoint") is None:  # the baselines
            assert entry == old
            continue
        assert entry["checkpoint"].startswith(str(root)) and entry["weights"] == old["weights"], (name, key)
        same = {k: v for k, v in entry.items() if k not in ("checkpoint", "teacher", "rho")}
        assert same == {k: v for k, v in old.items() if k not in ("checkpoint", "teacher", "rho")}, (name, key)
        if (entry.get("rho") or {}).get("teacher"):
            assert entry["rho"]["teacher"].startswith(str(root)), (name, key)
            assert entry["rho"]["value"] == old["rho"]["value"]
        if entry.get("teacher"):
            assert entry["teacher"].startswith(str(root))
    assert _load(out, "open_loop")["settings"]["root"] == str(root)


def test_runs_that_are_not_on_this_machine_keep_their_logged_entries(evaluated, fake, short_scenario_file,
                                                                    monkeypatch):
    """A fresh machine holds only the runs trained there: evaluating those must not turn what another machine
    logged of the others into "not run" (nor evaluate anything again)."""
    root = fake["base"] / "root_partial"
    _run_folder(root, "student/cross_scale", fake["ckpt"] / "b32")  # the same weights, the one run on this machine
    out = _evaluate_elsewhere(evaluated, fake, short_scenario_file, monkeypatch, root, "partial")
    for name, key, old, entry in _entry_pairs(evaluated, out):
        assert entry["status"] == old["status"], (name, key)
        if old["status"] != "ok" or old.get("checkpoint") is None:
            continue
        here = old.get("run") == "student/cross_scale" or old.get("student_run") == "student/cross_scale"
        if here and name != "overlap":  # on this machine: the same weights, under this root
            assert entry["checkpoint"].startswith(str(root)) and entry["weights"] == old["weights"], (name, key)
        else:  # the student's teacher, or the run itself, is elsewhere: as logged
            assert entry == old, (name, key)
    runs_before = {r["run"]: r for r in _load(evaluated, "runs")["runs"]}
    runs_after = {r["run"]: r for r in _load(out, "runs")["runs"]}
    for run in PRESENT:
        assert runs_after[run]["status"] == "ok", run
        if run != "student/cross_scale":
            assert runs_after[run] == runs_before[run], run
    assert runs_after["student/cross_scale"]["checkpoint"].startswith(str(root))
    assert runs_after["student/ablation/fkl"]["status"] == "not run"
    data = {k: v for k, v in _load(out, "runs")["data"].items() if k != "folder"}
    assert data == {k: v for k, v in _load(evaluated, "runs")["data"].items() if k != "folder"}


def test_render_names_where_each_run_was_measured(evaluated, tmp_path, rendered):
    """Every closed-loop entry records its machine and commit; real time is judged only between runs measured on the
    same one (a re-measured AR model next to a student logged elsewhere is named, not compared)."""
    text, _ = rendered
    piece = _load(evaluated, "closed_loop")
    hosts = [e["host"] for e in piece["entries"].values()]
    assert all({"cpu", "cores", "torch", "commit"} <= set(h) for h in hosts) and hosts[0]["cores"] >= 1
    assert "Every run here was measured on " in text
    for name in ("open_loop", "closed_loop"):
        shutil.copy(evaluated / f"{name}.json", tmp_path / f"{name}.json")
    piece["entries"]["ar"]["host"] = {**piece["entries"]["ar"]["host"], "commit": "0123456789ab"}
    del piece["entries"]["baselines"]["host"]
    (tmp_path / "closed_loop.json").write_text(json.dumps(piece))
    md = tmp_path / "RESULTS.md"
    assert train_main(["results", "render", "--results", str(tmp_path), "--out", str(md)]) == 0
    apart = md.read_text()
    assert "Measured apart (real-time rows compare only within one machine and one version of the code):" in apart
    assert "commit 0123456789ab" in apart and "- expert + constant velocity: not recorded" in apart
    assert "| final student − AR model † | realtime | 1 |" in apart and "† the two were measured apart" in apart


def test_redo_drives_only_the_named_planners_again(evaluated, fake, short_scenario_file, monkeypatch):
    """After a decoder speed-up the real-time rows are stale though the weights are not: --redo drives the named
    planners again and keeps every other entry as logged."""
    out = fake["base"] / "results_redo"
    shutil.copytree(evaluated, out)
    before = _load(out, "closed_loop")["entries"]
    from wamdiff_ros.world import evaluate as closed_loop_cli

    driven = []
    real = closed_loop_cli.main
    monkeypatch.setattr(closed_loop_cli, "main", lambda argv: driven.append(argv[argv.index("--model") + 1])
                        or real(argv))
    assert train_main(_evaluate_argv(fake, out, short_scenario_file, "--only", "closed_loop", "--redo", "ar")) == 0
    assert len(driven) == 1 and "snapshots/ar/" in driven[0]
    after = _load(out, "closed_loop")["entries"]
    assert list(after) == list(before) and after["baselines"] == before["baselines"]
    assert after["student"] == before["student"] and after["ar"]["status"] == "ok"
    assert after["ar"]["weights"] == before["ar"]["weights"] and after["ar"]["host"]["cores"] >= 1
