"""``wamdiff-train eval``: one run over a tiny held-out export with an AR checkpoint (found through its run folder,
with a metrics.csv) and a block-diffusion B=8 one (logits scaled so threshold decoding fixes several tokens per step),
the B=8 one as teacher, a threshold sweep and a 2 s closed loop; then its files, its numbers and its errors."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import format as fmt
from wamdiff_ros.model import DecodeMeta, tiny_random
from wamdiff_ros.planner import EgoState
from wamdiff_training import evaluation
from wamdiff_training.checkpoint import save_checkpoint
from wamdiff_training.cli import main as train_main
from wamdiff_training.data import Record
from wamdiff_training.detection import detection_metrics
from wamdiff_training.metrics_log import MetricsLog
from wamdiff_training.world.dataset import main as export

ROOT = Path(__file__).resolve().parents[1]
LOGIT_SCALE = 48.0  # as conftest.scaled_tiny: confidences spread over (0.6, 0.97)
THRESHOLDS = (0.9, 0.5)


@pytest.fixture(scope="module")
def run(tmp_path_factory, short_scenario_file) -> tuple[Path, dict, dict]:
    """(out, eval.json, paths) of one full ``wamdiff-train eval``."""
    base = tmp_path_factory.mktemp("train_eval")
    assert export(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "2", "--out",
                   str(base / "data"), "--preview", "0", "--no-progress", "--split", "test"]) == 0
    ar_run = base / "ar_run"
    ar = tiny_random(seed=0, meta=DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal"))
    save_checkpoint(ar, ar_run / "checkpoints" / "step-000004")
    (ar_run / "checkpoints" / "latest").write_text("step-000004\n")
    log = MetricsLog(ar_run, True, 0, False)
    for step, loss in enumerate((6.2, 4.1, 3.0, 2.5), 1):
        log.write(step, {"loss": loss, "lr": 1e-3})
    log.close()
    block = tiny_random(seed=1, meta=DecodeMeta(trained_block_size=8))
    with torch.no_grad():
        block.model.model.language_model.norm.weight.mul_(LOGIT_SCALE)
    save_checkpoint(block, base / "b8")
    out = base / "eval"
    argv = ["eval", "--checkpoint", str(ar_run), "--checkpoint", str(base / "b8"), "--data",
            str(base / "data" / "test.json"), "--teacher", str(base / "b8"), "--max-samples", "2",
            "--thresholds", ",".join(map(str, THRESHOLDS)), "--closed-loop", "--episodes", "1", "--scenarios",
            "highway", "--scenario-file", str(short_scenario_file), "--out", str(out), "--no-progress"]
    assert train_main(argv) == 0  # through the wamdiff-train CLI's dispatch
    return out, json.loads((out / "eval.json").read_text()), {"ar_run": ar_run, "b8": base / "b8", "base": base}


def test_eval_json_numbers_are_well_formed(run):
    out, result, paths = run
    assert result["command_line"][:2] == ["wamdiff-train", "eval"] and "--closed-loop" in result["command_line"]
    assert result["records"] == {"plan": 2, "detect": 2, "ask": 2} and result["k"] == 5
    ar, block = result["checkpoints"]
    assert ar["path"] == str(paths["ar_run"] / "checkpoints" / "step-000004")  # the run folder's latest
    assert ar["decode"]["mode"] == "ar" and block["decode"]["mode"] == "block" and block["decode"]["block_size"] == 8
    assert [r["threshold"] for r in ar["plan"]["sweep"]] == [None]  # a threshold does not change AR decoding
    assert [r["threshold"] for r in block["plan"]["sweep"]] == list(THRESHOLDS)
    for entry in (ar, block):
        for row in entry["plan"]["sweep"]:
            assert row["plans"] == 2 and row["valid"] + row["invalid"] == 2
            assert len(row["l2_per_waypoint"]) == fmt.NUM_WAYPOINTS
            finite = all(v is not None and math.isfinite(v) and v >= 0 for v in row["l2_per_waypoint"])
            assert finite or row["invalid"] > 0
            assert 0 < row["forward_calls_per_token"] <= 1 and row["tokens_per_s"] > 0
        tf = entry["teacher_forced"]
        assert 0 <= tf["token_accuracy"] <= 1 and tf["positions"] > 0 and set(tf["per_task"]) == {"plan", "detect", "ask"}
        det = entry["detection"]
        assert det["records"] == 2 and det["ground_truth"] > 0 and 0 <= det["recall"] <= 1 and 0 <= det["map50"] <= 1
        assert entry["ask"]["records"] == 2 and 0 <= entry["ask"]["exact_match"] <= 1
    assert ar["plan"]["sweep"][0]["forward_calls_per_token"] == pytest.approx(1.0, abs=0.02)
    assert all(r["forward_calls_per_token"] < 1 for r in block["plan"]["sweep"])  # several tokens per forward
    lowest = block["plan"]["sweep"][-1]["forward_calls_per_token"]
    assert lowest <= block["plan"]["sweep"][0]["forward_calls_per_token"]  # a lower threshold fixes more per step
    assert ar["metrics_csv"] == str(paths["ar_run"] / "metrics.csv") and block["metrics_csv"] is None
    assert result["exposure_bias"]["reference"] == ar["label"]
    assert len(result["exposure_bias"]["gap_per_waypoint"][block["label"]]) == fmt.NUM_WAYPOINTS


def test_rho_of_a_checkpoint_with_itself_is_one(run):
    _, result, paths = run
    ar, block = result["checkpoints"]
    assert block["rho"]["value"] == 1.0 and block["rho"]["k"] == 5 and block["rho"]["positions"] > 0
    assert block["rho"]["teacher"] == str(paths["b8"])
    assert 0 <= ar["rho"]["value"] < 1 and ar["rho"]["alignment"].startswith("AR-aligned")


def test_closed_loop_fills_a_driving_score(run):
    _, result, _ = run
    for entry in result["checkpoints"]:
        cl = entry["closed_loop"]
        assert 0 <= cl["driving_score"] <= 100 and cl["model"]["episodes"] == 1
        lo, hi = cl["driving_score_ci"]
        assert lo <= cl["driving_score"] <= hi and Path(cl["report"]).is_file()
    assert "--threshold" in result["checkpoints"][1]["closed_loop"]["command_line"]


def test_csv_rows_and_figures(run):
    out, result, _ = run
    with (out / "eval.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["threshold"]) for r in rows] == [("ar", ""), ("block", "0.9"), ("block", "0.5")]
    assert all(float(r["l2_mean"]) >= 0 and r["driving_score"] for r in rows)
    assert rows[1]["rho_k"] == "1.0"
    for name in ("l2_per_waypoint.png", "threshold_sweep.png", "training_curves.png"):
        path = out / name
        assert path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
        assert str(path) in result["figures"]


@pytest.mark.parametrize("flag", ["--checkpoint", "--data", "--teacher"])
def test_a_bad_path_is_named_with_exit_code_2(run, flag, capsys):
    _, _, paths = run
    given = {"--checkpoint": str(paths["b8"]), "--data": str(paths["base"] / "data" / "test.json"), "--teacher": None}
    missing = str(paths["base"] / "no_such_thing")
    given[flag] = missing
    argv = ["eval", *(x for k, v in given.items() if v is not None for x in (k, v)), "--out",
            str(paths["base"] / "bad"), "--no-progress"]
    assert train_main(argv) == 2
    assert missing in capsys.readouterr().err
    assert not (paths["base"] / "bad" / "eval.json").exists()


def test_detection_metrics_by_hand():
    car, truck = (lambda *xy: fmt.Box("car", *xy)), (lambda *xy: fmt.Box("truck", *xy))
    truth = [[car(0, 0, 100, 100), car(200, 200, 300, 300)], [truck(0, 0, 50, 50)]]
    perfect = detection_metrics(truth, truth)
    assert (perfect["precision"], perfect["recall"], perfect["map50"]) == (1.0, 1.0, 1.0)
    # one car found (IoU 0.81), one box off target, the truck called a car: P = 1/3, R = 1/3
    predicted = [[car(10, 10, 100, 100), car(600, 600, 700, 700)], [car(0, 0, 50, 50)]]
    m = detection_metrics(predicted, truth)
    assert m["true_positives"] == 1 and m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 3)
    assert m["ap50_per_class"] == pytest.approx({"car": 0.5 * (1 / 3), "truck": 0.0})  # AP = P x R at one score
    assert m["map50"] == pytest.approx((1 / 6 + 0.0) / 2)
    twice = detection_metrics([[car(0, 0, 100, 100), car(0, 0, 100, 100)]], [[car(0, 0, 100, 100)]])
    assert (twice["true_positives"], twice["precision"]) == (1, 0.5)  # a true box matches once


@pytest.mark.parametrize("command", list(fmt.Command))
def test_plan_inputs_rebuild_the_prompt(command):
    user = fmt.plan_prompt(command, (6.25, -0.5), (-1.75, 0.0))
    ego, parsed, route = evaluation.plan_inputs(Record("r", Path("x.png"), user, "", "plan"))
    assert parsed is command and route is None and fmt.plan_prompt(parsed, ego.velocity, ego.acceleration) == user
    points = np.array([[10.0, -0.77], [29.24, -4.17]])
    user = fmt.plan_prompt(command, (6.25, -0.5), (-1.75, 0.0), points)
    ego, parsed, route = evaluation.plan_inputs(Record("r", Path("x.png"), user, "", "plan"))
    np.testing.assert_array_equal(route, points)  # a route-line prompt is rebuilt with its route, as trained
    assert fmt.plan_prompt(parsed, ego.velocity, ego.acceleration, route) == user
    question = evaluation.question_of(Record("q", Path("x.png"), fmt.ask_prompt("Is the lane free?"), "", "ask"))
    assert question == "Is the lane free?"


def test_question_breakdown_and_the_lead_distance_read_off_the_image():
    from types import SimpleNamespace

    from wamdiff_training.world.questions import QUESTIONS, lead_answer, read_lead_answer

    def record(key, answer):
        return Record(key, Path("x.png"), fmt.ask_prompt(QUESTIONS[key]), answer, "ask", {"question": key})

    none = lead_answer(None)  # the world's own wording
    assert none == "There is no vehicle ahead in our lane within 100 m." and read_lead_answer(none) == 100.0
    pairs = [(SimpleNamespace(text=lead_answer(20.2)), record("lead", lead_answer(23.0))),
             (SimpleNamespace(text=lead_answer(40.0)), record("lead", lead_answer(40.4))),
             (SimpleNamespace(text=none), record("lead", lead_answer(90.0))),
             (SimpleNamespace(text="I do not know."), record("lead", none)),  # unreadable: left out of the distance
             (SimpleNamespace(text="Lane 1 of 2, counted from the left."), record("lane", "Lane 2 of 2, counted from "
                                                                                          "the left."))]
    out = evaluation.ask_breakdown(pairs)
    assert out["per_question"] == {"lane": {"records": 1, "exact_match": 0.0},
                                   "lead": {"records": 4, "exact_match": 0.25}}
    d = out["lead_distance"]
    assert d["records"] == 3 and d["mae_m"] == pytest.approx((3 + 0 + 10) / 3)
    assert d["pearson_r"] == pytest.approx(np.corrcoef([20, 40, 100], [23, 40, 90])[0, 1])
    assert d["blind_mae_m"] == pytest.approx(np.abs(np.array([23, 40, 90]) - 51).mean())
    assert read_lead_answer("nothing here") is None and read_lead_answer(lead_answer(12.6)) == 13.0


def test_behaviour_groups_and_the_constant_velocity_reference():
    from wamdiff_training.data import behaviour_of
    from wamdiff_training.evaluation import by_behaviour, constant_velocity_plan

    assert behaviour_of({"expert": "free", "command": "follow"}) == "cruise"
    assert behaviour_of({"expert": "free", "command": "left"}) == "junction"
    assert behaviour_of({"expert": "lane change no gap", "command": "follow"}) == "lane_change"
    assert behaviour_of({"expert": "yield", "command": "right"}) == "yield"
    assert behaviour_of({"scenario": "navsim"}) is None  # not a world record
    recovery = {"offset_m": 0.4, "heading_rad": 0.0, "lane": 1, "along_m": 3.0}
    assert behaviour_of({"expert": "lane change free", "command": "follow", "recovery": recovery}) == "recovery"
    assert behaviour_of({"expert": "free", "command": "follow", "recovery": None}) == "cruise"
    cv = constant_velocity_plan(EgoState((10.0, 1.0), (3.0, 0.0)))
    assert np.allclose(cv[0], [5.0, 0.5]) and np.allclose(cv[-1], [40.0, 4.0])  # 0.5 s apart, acceleration ignored

    turn = cv + np.array([0.0, 2.0])
    groups = by_behaviour([cv, "not waypoints", turn, cv], [cv, cv, cv, cv], [turn, turn, turn, turn],
                          ["cruise", "cruise", "yield", None])
    assert list(groups) == ["cruise", "yield", "other"]
    assert groups["cruise"] == {"plans": 2, "valid": 1, "l2_mean": 0.0, "constant_velocity_l2_mean": 2.0,
                                "turns": 1, "turn_shortfall_m": 0.0}  # cv ends 4 m to the left: a turn, matched
    assert groups["yield"]["l2_mean"] == 2.0 and groups["yield"]["turn_shortfall_m"] == -2.0  # 2 m further left


def test_turn_shortfall_is_signed_by_the_turn_and_skips_straight_and_invalid_plans():
    from wamdiff_training.evaluation import turn_shortfall

    def plan(y8: float) -> np.ndarray:
        w = np.zeros((8, 2))
        w[:, 0], w[:, 1] = np.arange(1, 9) * 4.0, np.linspace(0.0, y8, 8)
        return w

    # left turn 6 m, planned 2 m: 4 short; right turn -8 m, planned straight: 8 short; right turn planned 10 m
    # right: 2 over (answer text counts as waypoint_l2 reads it); a straight reference (0.5 m) and an answer that
    # does not parse do not count
    n, short = turn_shortfall([plan(2.0), fmt.format_waypoints(plan(0.0)), plan(-10.0), plan(3.0), "012.0,"],
                              [plan(6.0), plan(-8.0), plan(-8.0), plan(0.5), plan(6.0)])
    assert n == 3 and short == pytest.approx((4.0 + 8.0 - 2.0) / 3)
    assert turn_shortfall([plan(0.0)], [plan(0.2)]) == (0, None)


def test_turn_starts_count_the_plans_that_begin_the_referenced_turn():
    from wamdiff_training.evaluation import turn_starts

    def plan(y8: float) -> np.ndarray:
        w = np.zeros((8, 2))
        w[:, 0], w[:, 1] = np.arange(1, 9) * 4.0, np.linspace(0.0, y8, 8)
        return w

    references = [plan(6.0), plan(-8.0), plan(-8.0), plan(6.0), plan(5.0)]
    starts = [True, True, True, True, False]  # the last is not a turn start: not counted whatever its plan
    predicted = [plan(3.5), fmt.format_waypoints(plan(-1.0)), plan(4.0), "012.0,", plan(9.0)]
    out = turn_starts(predicted, references, starts)
    # 3.5 m left of a left turn: begun; 1 m right of a right turn: not; 4 m left of a right turn: -4, not
    assert out == {"references": 4, "valid": 3, "begun": 1, "median_sideways_m": pytest.approx(1.0)}
    assert turn_starts([plan(0.0)], [plan(6.0)], [False]) == {"references": 0, "valid": 0, "begun": 0,
                                                             "median_sideways_m": None}


def test_steps_back_counts_plans_whose_x_falls_behind_the_waypoint_before():
    from wamdiff_training.evaluation import steps_back

    def plan(xs) -> np.ndarray:
        w = np.zeros((8, 2))
        w[:, 0] = xs
        return w

    forward = plan(np.arange(1, 9) * 4.0)
    lost_tens = plan([3.5, 7.5, 0.6, 3.5, 6.5, 8.6, 10.7, 11.7])  # a tens digit decoded as 0
    stopping = plan([2.0, 3.0, 3.5, 3.6, 3.6, 3.4, 3.3, 3.0])  # noise about a stop: within 1 m is not a step back
    text = fmt.format_waypoints(plan([10.11, 29.19, 39.13, 59.13, 50.13, 60.13, 70.15, 80.25]), 3)
    out = steps_back([forward, lost_tens, stopping, text, "012.0,"], [forward] * 4 + [lost_tens])
    assert out == {"valid": 4, "plans": 2, "references": 1}


def test_command_response_compares_a_frames_plans_across_its_commands():
    from wamdiff_training.evaluation import command_response

    def plan(y8: float) -> np.ndarray:
        w = np.zeros((8, 2))
        w[:, 0], w[:, 1] = np.arange(1, 9) * 4.0, np.linspace(0.0, y8, 8)
        return w

    # frame a: left / straight / right references; the model plans straight under all three (spread 0)
    # frame b: left / right; the model follows both; frame c has one command only and a record of no frame: ignored
    frames = ["a", "a", "a", "b", "b", "c", None]
    references = [plan(6.0), plan(0.0), plan(-7.0), plan(5.0), plan(-5.0), plan(6.0), plan(9.0)]
    predicted = [plan(0.1), plan(0.1), plan(0.1), plan(4.0), fmt.format_waypoints(plan(-3.5)), plan(0.0), plan(0.0)]
    out = command_response(predicted, references, frames)
    assert out["frames"] == 2 and out["turns"] == 4 and out["followed"] == 2
    assert out["plan_spread_m"] == pytest.approx(3.75) and out["reference_spread_m"] == pytest.approx(11.5)
    assert command_response([plan(0.0)], [plan(6.0)], [None]) is None
    bad = command_response(["garbled", plan(0.0)], [plan(6.0), plan(0.0)], ["a", "a"])
    assert bad["plan_spread_m"] is None and bad["turns"] == 1 and bad["followed"] == 0


def test_max_samples_are_spread_over_the_file():
    from wamdiff_training.evaluation import evenly_spaced

    assert evenly_spaced(list(range(10)), 3) == [0, 3, 6] and evenly_spaced(list(range(4)), None) == [0, 1, 2, 3]
    assert evenly_spaced([1, 2], 5) == [1, 2] and evenly_spaced([], 3) == []


@pytest.mark.parametrize("ar", [False, True], ids=["block", "ar"])
def test_command_likelihood_compares_a_references_likelihood_across_the_frames_prompts(tmp_path, ar):
    from PIL import Image

    from wamdiff_ros.decoding.settings import DecodeSettings
    from wamdiff_training.data import encode_record
    from wamdiff_training.evaluation import Subject, command_likelihood

    meta = DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal") if ar else \
        DecodeMeta(trained_block_size=8)
    bundle = tiny_random(seed=3, meta=meta)
    settings = DecodeSettings(block_size=1 if ar else 8)
    subject = Subject("tiny", "tiny", bundle, settings)
    image = tmp_path / "frame.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (128, 256, 3), dtype=np.uint8)).save(image)

    def record(command: str, y8: float, prompt_command: str | None = None) -> Record:
        w = np.zeros((8, 2))
        w[:, 0], w[:, 1] = np.arange(1, 9) * 4.0, np.linspace(0.0, y8, 8)
        user = fmt.plan_prompt(fmt.Command(prompt_command or command), (8.0, 0.0), (0.0, 0.0))
        return Record(f"f_{command}", image, user, fmt.format_waypoints(w), "plan",
                      {"command": command, "counterfactual": command != "straight"})

    def likelihood(records: list[Record]) -> dict | None:
        return command_likelihood(subject, records, [encode_record(bundle, r) for r in records])

    plain = [record("left", 6.0), record("right", -6.0), record("straight", 0.0)]
    out = likelihood(plain)
    assert out["frames"] == 1 and out["references"] == 2  # the straight reference does not turn
    assert out["gain_mean_nats"] != 0.0 and 0 <= out["own_likeliest"] <= 2
    # the left and right records' prompts swapped: each turning reference's own prompt becomes the other's
    two = [record("left", 6.0), record("right", -6.0)]
    two_swapped = [record("left", 6.0, "right"), record("right", -6.0, "left")]
    a, b = likelihood(two), likelihood(two_swapped)
    assert a["gain_mean_nats"] == pytest.approx(-b["gain_mean_nats"], abs=1e-4)
    assert a["own_likeliest"] + b["own_likeliest"] == 2
    # a model that cannot see the command (every prompt says the same) gains nothing, and no prompt is likeliest
    blind = likelihood([record("left", 6.0, "left"), record("right", -6.0, "left")])
    assert blind["gain_mean_nats"] == pytest.approx(0.0, abs=1e-5) and blind["own_likeliest"] == 0
    assert likelihood([record("straight", 0.0)]) is None
