"""Tests for the dataset export (``wamdiff-train data generate``): answers that parse and match the expert, prompts
byte-identical to the planner's, images, determinism, disjoint split seeds, DAgger-lite perturbations, the privileged
questions, DAgger rollouts (a driver takes turns with the expert), the manifest's format, the preview and the CLI's
errors. Small: 1 episode of 2 scenarios cut after a few seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from highway_env.vehicle.kinematics import Vehicle
from PIL import Image

from wamdiff_ros import format as fmt
from wamdiff_ros.world.camera import CameraConfig
from wamdiff_ros.world.closed_loop import PlanResult
from wamdiff_ros.world.scenarios import load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.world import questions
from wamdiff_training.world.dataset import SEEDS_PER_SPLIT, SPLIT_SEED_BASE, image_path, main, records
from wamdiff_training.world.demonstrations import (DatasetError, NoiseConfig, RolloutConfig, perturbation_schedule,
                                                    rollout)

SCENARIOS = ("highway", "roundabout")
CUT_S = 9.0
CONFIG = RolloutConfig(sample_period_s=0.5, noise=NoiseConfig(fraction=1.0), questions_per_frame=2, max_seconds=CUT_S)
SET = load_scenarios()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, list[dict], dict]:
    out = tmp_path_factory.mktemp("dataset") / "set"
    rc = main(["generate", "--scenarios", ",".join(SCENARIOS), "--episodes", "1", "--max-seconds", str(CUT_S),
               "--noise-fraction", "1.0", "--out", str(out), "--preview", "4", "--no-progress"])
    assert rc == 0
    return out, json.loads((out / "train.json").read_text()), json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def episodes():
    """The same episodes generated a second time, in memory (train seed 0)."""
    return {name: rollout(SET.get(name), 0, CONFIG, SET) for name in SCENARIOS}


def _answer(sample: dict) -> str:
    return sample["conversations"][1]["value"]


def test_every_answer_parses_and_plans_match_the_expert(exported, episodes):
    _, samples, manifest = exported
    assert {s["task"] for s in samples} == {"plan", "detect", "ask"}
    assert len({s["id"] for s in samples}) == len(samples)
    frames = {(e.scenario, f.index): f for e in episodes.values() for f in e.frames}
    for s in samples:
        if s["task"] == "plan":
            parsed = fmt.parse_waypoints(_answer(s))
            assert parsed.valid, parsed.reason
            expert = frames[s["meta"]["scenario"], s["meta"]["frame"]].waypoints
            assert np.abs(parsed.waypoints - expert).max() <= 0.005
        elif s["task"] == "detect":
            assert fmt.parse_boxes(_answer(s)).valid, _answer(s)
        else:
            assert fmt.parse_text(_answer(s)) and _answer(s).endswith(".")
    counts = manifest["splits"]["train"]["counts"]
    assert counts["samples"] == len(samples) and counts["task"]["plan"] == counts["images"] == len(frames)


def test_prompts_are_byte_identical_to_the_planners(exported, tiny_bundle, monkeypatch):
    from wamdiff_ros.decoding.settings import DecodeSettings
    from wamdiff_ros.planner import EgoState, Planner

    out, samples, _ = exported
    planner = Planner(tiny_bundle, DecodeSettings(block_size=32, steps=8, schedule="static"))
    seen: list[str] = []

    class Captured(Exception):
        pass

    def capture(user_text, image, constraint, deadline=None, check=None):
        seen.append(user_text)
        raise Captured

    monkeypatch.setattr(planner, "_run", capture)
    for s in samples:
        image, meta = np.asarray(Image.open(out / s["image"]).convert("RGB")), s["meta"]
        with pytest.raises(Captured):
            if s["task"] == "plan":
                planner.plan(image, EgoState(tuple(meta["velocity"]), tuple(meta["acceleration"])), meta["command"])
            elif s["task"] == "detect":
                planner.detect(image)
            else:
                planner.ask(image, questions.QUESTIONS[meta["question"]])
        assert seen[-1] == s["conversations"][0]["value"]
        assert seen[-1].count(fmt.IMAGE_PLACEHOLDER) == 1


def test_images_exist_and_are_camera_frames_each_serving_several_samples(exported):
    out, samples, _ = exported
    cfg = CameraConfig()
    by_image: dict[str, list[str]] = {}
    for s in samples:
        by_image.setdefault(s["image"], []).append(s["task"])
    for rel, tasks in by_image.items():
        assert rel.startswith("images/train/") and (out / rel).is_file()
        image = np.asarray(Image.open(out / rel))
        assert image.shape == (cfg.height, cfg.width, 3) and image.dtype == np.uint8
        assert tasks[:2] == ["plan", "detect"] and 1 <= tasks.count("ask") <= 2


def test_the_same_scenario_and_seed_generates_identical_samples(exported, episodes):
    out, samples, _ = exported
    again = []
    for name, ep in episodes.items():
        for frame in ep.frames:
            again += records(frame, "train", SET.get(name).kind, ep.perturbed)
            assert np.array_equal(np.asarray(Image.open(out / image_path("train", frame))), frame.image)
    assert json.loads(json.dumps(again)) == samples


def test_split_seeds_are_disjoint(tmp_path):
    bases = sorted(SPLIT_SEED_BASE.values())
    assert all(b - a >= SEEDS_PER_SPLIT for a, b in zip(bases, bases[1:]))
    out = tmp_path / "splits"
    assert main(["generate", "--scenarios", "highway", "--episodes", "2", "--split", "train,val,test",
                 "--max-seconds", "0.5", "--out", str(out), "--preview", "0", "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    seeds = {}
    for split, base in SPLIT_SEED_BASE.items():
        seeds[split] = {e["seed"] for e in manifest["splits"][split]["episodes"]}
        assert seeds[split] == {base, base + 1}
        samples = json.loads((out / f"{split}.json").read_text())
        assert {s["meta"]["seed"] for s in samples} == seeds[split]
        assert all(s["image"].startswith(f"images/{split}/") for s in samples)
    assert not (seeds["train"] & seeds["val"]) and not (seeds["val"] & seeds["test"])
    assert not (seeds["train"] & seeds["test"])
    # --overwrite replaces only the named split
    train = (out / "train.json").read_text()
    assert main(["generate", "--scenarios", "highway", "--episodes", "1", "--split", "val", "--seed-offset", "7",
                 "--max-seconds", "0.5", "--out", str(out), "--preview", "0", "--no-progress", "--overwrite"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (out / "train.json").read_text() == train and set(manifest["splits"]) == set(SPLIT_SEED_BASE)
    assert manifest["splits"]["val"]["seeds"] == [SPLIT_SEED_BASE["val"] + 7] * 2
    val_images = sorted(p.name for p in (out / "images" / "val").iterdir())
    assert val_images == [f"highway_{SPLIT_SEED_BASE['val'] + 7}_0000.png"]


def test_a_perturbed_episode_drives_off_its_labels_in_the_direction_of_the_offset(exported, episodes):
    _, samples, manifest = exported
    assert all(e["perturbed"] and e["perturbations"] for e in manifest["splits"]["train"]["episodes"])
    for ep in episodes.values():
        assert ep.perturbed and perturbation_schedule(SET.get(ep.scenario), ep.seed, CONFIG.noise) == (True,
                                                                                                      ep.perturbations)
        checked = 0
        for f in ep.frames:
            p = f.perturbation
            if p is None or p.end - f.t < 0.25 or not np.isfinite(f.executed[0]).all():
                continue
            dx, dy = f.executed[0] - f.waypoints[0]  # where the ego really was 0.5 s later minus where the label said
            if p.steer_rad:
                assert np.sign(dy) == np.sign(p.steer_rad) and abs(dy) > 0.05, (ep.scenario, f.t, p, dx, dy)
            else:
                assert np.sign(dx) == np.sign(p.accel_mps2) and abs(dx) > 0.05, (ep.scenario, f.t, p, dx, dy)
            checked += 1
        assert checked >= 2
        # the noise touches nothing but the executed control: before it starts, the episode is the clean one
        clean = rollout(SET.get(ep.scenario), ep.seed, replace(CONFIG, noise=NoiseConfig(fraction=0.0),
                                                               max_seconds=ep.perturbations[0].start), SET)
        assert not clean.perturbed and clean.frames
        for a, b in zip(clean.frames, ep.frames):
            assert np.array_equal(a.waypoints, b.waypoints) and np.array_equal(a.image, b.image)
    flagged = {(s["meta"]["scenario"], s["meta"]["frame"]) for s in samples if s["meta"]["perturbed"]}
    assert flagged == {(e.scenario, f.index) for e in episodes.values() for f in e.frames if f.perturbation}
    assert all(s["meta"]["perturbation"] for s in samples if s["meta"]["perturbed"])


def test_noise_fraction_zero_never_perturbs():
    spec = SET.get("highway")
    assert all(perturbation_schedule(spec, seed, NoiseConfig(fraction=0.0)) == (False, []) for seed in range(20))
    hits = sum(perturbation_schedule(spec, seed, NoiseConfig())[0] for seed in range(200))
    assert 70 < hits < 130  # about half at the default 0.5


class VeerLeft:
    """A driver that keeps its speed and bends left at 0.8 m/s^2: where it takes the ego, the expert must steer back."""

    name, needs_camera = "veer_left", True

    def reset(self, world) -> None:
        pass

    def plan(self, obs, route=None) -> PlanResult:
        t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
        return PlanResult(np.concatenate([float(np.hypot(*obs.ego_velocity)) * t, 0.4 * t**2], axis=1))


class NeverCalled(VeerLeft):
    def plan(self, obs, route=None) -> PlanResult:
        raise AssertionError("the driver was asked for a plan although the expert drives every interval")


def test_a_dagger_driver_takes_its_share_and_the_expert_labels_where_it_drives_to():
    SEED = 0
    spec, config = SET.get("highway"), RolloutConfig(noise=NoiseConfig(fraction=0.0), questions_per_frame=0,
                                                     max_seconds=12.0, expert_share=0.5)
    ep = rollout(spec, SEED, config, SET, driver=VeerLeft())
    drivers = [f.driver for f in ep.frames]
    assert set(drivers) == {"expert", "model"} and 0.2 < drivers.count("model") / len(drivers) < 0.8
    clean = rollout(spec, SEED, config, SET)
    assert not any(np.array_equal(a.image, b.image) for a, b in zip(clean.frames[8:], ep.frames[8:]))
    # after an interval of drifting left the expert's label steers right; the clean episode is straight by then
    after = [f.waypoints[-1, 1] for prev, f in zip(ep.frames, ep.frames[1:]) if prev.driver == "model" and f.t > 4]
    assert after and np.mean(after) < -1.0
    assert max(abs(f.waypoints[-1, 1]) for f in clean.frames if f.t > 4) < 0.1
    assert rollout(spec, SEED, config, SET, driver=VeerLeft()).frames[-1].waypoints.tolist() == \
        ep.frames[-1].waypoints.tolist()  # deterministic
    # expert_share 1: the driver is never asked and the episode is the expert's; 0: the driver drives throughout
    only_expert = rollout(spec, SEED, replace(config, expert_share=1.0), SET, driver=NeverCalled())
    assert all(np.array_equal(a.image, b.image) and np.array_equal(a.waypoints, b.waypoints)
               for a, b in zip(clean.frames, only_expert.frames))
    only_model = rollout(spec, SEED, replace(config, expert_share=0.0, max_seconds=3.0), SET, driver=VeerLeft())
    assert {f.driver for f in only_model.frames} == {"model"}
    with pytest.raises(DatasetError, match="expert_share"):
        RolloutConfig(expert_share=1.5)


def test_cli_dagger_with_the_shipped_model_records_who_drove(tmp_path, capsys):
    from wamdiff_ros.model_names import DEFAULT_MODEL, PACKAGED_MODELS

    out, model = tmp_path / "dagger", PACKAGED_MODELS[DEFAULT_MODEL]
    assert main(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "4", "--noise-fraction",
                 "0", "--questions", "0", "--driver", str(model), "--expert-share", "0.3", "--out", str(out),
                 "--preview", "0", "--no-progress"]) == 0
    samples, manifest = json.loads((out / "train.json").read_text()), json.loads((out / "manifest.json").read_text())
    assert manifest["dagger"] == {"driver": str(model), "expert_share": 0.3}
    driven = [s for s in samples if s["meta"]["driver"] == "model"]
    assert driven and manifest["splits"]["train"]["counts"]["model_driven_samples"] == len(driven)
    assert manifest["splits"]["train"]["episodes"][0]["model_driven_frames"] == sum(
        s["task"] == "plan" for s in driven)
    capsys.readouterr()
    assert main(["generate", "--scenarios", "highway", "--episodes", "1", "--driver", str(tmp_path / "nothing"),
                 "--out", str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err
    assert "--driver" in err and "nothing" in err


def test_preview_is_a_non_empty_png(exported):
    out, _, _ = exported
    preview = Image.open(out / "preview.png")
    assert preview.format == "PNG" and preview.width > 0 and (out / "preview.png").stat().st_size > 1000


# ---------------------------------------------------------------------------------------------------- questions
def _highway_alone(lane: int = 1, speed: float = 24.0) -> World:
    """The 3-lane highway (lane ids 0, 1, 2 from the left, 4 m apart) with only the ego, in ``lane`` at ``speed``."""
    world = World(SET.get("highway"), 0, SET)
    world.road.vehicles[1:] = []
    ego = world.ego
    ego.position[1], ego.heading, ego.speed = lane * 4.0, 0.0, speed
    ego.lane_index = world.road.network.get_closest_lane_index(ego.position, ego.heading)
    assert len(world.road.network.graph["0"]["1"]) == 3 and ego.lane_index == ("0", "1", lane)
    return world


def _add(world: World, ahead_m: float, lane: int, speed: float) -> None:
    x = world.ego.position[0] + ahead_m
    world.road.vehicles.append(Vehicle(world.road, np.array([x, lane * 4.0]), 0.0, speed))


def test_lane_and_lead_answers_on_the_highway():
    world = _highway_alone()
    assert questions.answer(world, "lane") == "Lane 2 of 3, counted from the left."
    assert questions.answer(world, "lead") == "There is no vehicle ahead in our lane within 100 m."
    _add(world, 40.4, 1, 20.0)
    _add(world, 20.0, 2, 20.0)  # the next lane: not a lead
    assert questions.answer(world, "lead") == "The vehicle ahead in our lane is 35 m away."  # 40.4 - 5 bumpers


@pytest.mark.parametrize("ahead_m, speed, answer", [
    (None, 0.0, "Yes, the lane to the left is free."),
    (3.0, 24.0, "No, a vehicle is beside us in the lane to the left."),
    (-20.0, 30.0, "No, a vehicle in the lane to the left is 15 m behind."),  # needs 5 + 30 + 2 * 6 m
    (30.0, 24.0, "No, a vehicle in the lane to the left is 25 m ahead."),  # needs 5 + 24 m
    (40.0, 24.0, "Yes, the lane to the left is free."),
])
def test_lane_change_gap_check(ahead_m, speed, answer):
    world = _highway_alone()
    if ahead_m is not None:
        _add(world, ahead_m, 0, speed)
    assert questions.answer(world, "left_free") == answer
    assert questions.answer(world, "right_free") == "Yes, the lane to the right is free."
    world = _highway_alone(lane=0)
    assert questions.answer(world, "lane") == "Lane 1 of 3, counted from the left."
    assert questions.answer(world, "left_free") == "No, there is no lane to the left."
    assert questions.answer(world, "right_free") == "Yes, the lane to the right is free."


@pytest.mark.parametrize("scenario, command, answer", [
    ("roundabout", "right", "Take the first exit: turn right at the roundabout."),
    ("roundabout", "straight", "Take the second exit: go straight through the roundabout."),
    ("roundabout", "left", "Take the third exit: turn left at the roundabout."),
    ("intersection", "left", "Turn left at the intersection."),
    ("intersection", "straight", "Go straight across the intersection."),
    ("intersection", "right", "Turn right at the intersection."),
    ("merge", "follow", "Follow the lane."),
])
def test_command_answers(scenario, command, answer):
    world = next(w for w in (World(SET.get(scenario), seed, SET) for seed in range(50))
                 if w.route.command.value == command)
    if command != "follow":
        world.progress_m = world.route.command_from_m  # inside the commanded stretch
    assert world.command.value == command and questions.command_answer(world) == answer
    world.progress_m = world.route.command_from_m - 1.0  # before it: the planner is told to follow the lane
    assert questions.command_answer(world) == "Follow the lane."


# ---------------------------------------------------------------------------------------------------------- CLI
def test_cli_rejects_a_bad_scenario_name_naming_it(tmp_path, capsys):
    rc = main(["generate", "--scenarios", "highway,nowhere", "--episodes", "1", "--out", str(tmp_path / "x")])
    assert rc == 2 and "nowhere" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_rejects_a_non_empty_out_dir_and_bad_settings(exported, tmp_path, capsys):
    out, _, _ = exported
    assert main(["generate", "--scenarios", "highway", "--episodes", "1", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    for extra, message in ((["--sample-period", "0.07"], "multiple of the sim step"),
                           (["--split", "dev"], "dev"), (["--noise-fraction", "1.5"], "--noise-fraction"),
                           (["--expert-share", "-0.1"], "--expert-share"),
                           (["--seed-offset", str(SEEDS_PER_SPLIT)], "--seed-offset")):
        rc = main(["generate", "--scenarios", "highway", "--episodes", "1", "--out", str(tmp_path / "y"), *extra])
        assert rc == 2 and message in capsys.readouterr().err
    with pytest.raises(DatasetError, match="sample_period_s"):
        RolloutConfig(sample_period_s=0.0)


def test_counterfactual_commands_label_the_approach_under_every_other_command(tmp_path):
    """An intersection episode: on the approach each frame also carries the expert's plan under the two other
    commands (the same image, speed and expert state); in the box and after it, none. The own labels and the
    images are those of the plain export, and a right turn's counterfactual bends right where the left one does
    not."""
    spec, base = SET.get("intersection"), RolloutConfig(noise=NoiseConfig(fraction=0.0), questions_per_frame=0)
    seed = next(s for s in range(50) if World(spec, s, SET).exit_direction == "left")
    plain = rollout(spec, seed, base, SET)
    ep = rollout(spec, seed, replace(base, counterfactual_commands=True), SET)
    assert [f.waypoints.tolist() for f in ep.frames] == [f.waypoints.tolist() for f in plain.frames]
    assert all(np.array_equal(a.image, b.image) for a, b in zip(ep.frames, plain.frames))
    world = World(spec, seed, SET)
    approach = [f for f in ep.frames if f.counterfactuals]
    assert approach and approach[0].index == 0 and any(not f.counterfactuals for f in ep.frames)
    assert all({c for c, _, _ in f.counterfactuals} == {fmt.Command.RIGHT, fmt.Command.STRAIGHT}
               and f.command == fmt.Command.LEFT for f in approach)
    assert world.alternative_routes().keys() == {fmt.Command.RIGHT, fmt.Command.STRAIGHT}
    right = [dict((c, w) for c, w, _ in f.counterfactuals)[fmt.Command.RIGHT][-1, 1] for f in approach]
    assert min(right) < -3.0  # the expert turning right somewhere on the approach, to the ego's right (y < 0)
    # the records: one extra plan sample per counterfactual, its command in the prompt and the meta
    samples = [s for f in ep.frames for s in records(f, "train", spec.kind, False)]
    cf = [s for s in samples if s["meta"].get("counterfactual")]
    assert len(cf) == 2 * len(approach) and all(s["task"] == "plan" for s in cf)
    for s in cf:
        command = fmt.Command(s["meta"]["command"])
        assert s["id"].endswith(f"_cf_{command.value}") and command.phrase in s["conversations"][0]["value"]
        assert fmt.parse_waypoints(_answer(s)).valid
    # the highway has one route: nothing extra
    highway = rollout(SET.get("highway"), 0, replace(base, counterfactual_commands=True, max_seconds=3.0), SET)
    assert not any(f.counterfactuals for f in highway.frames)


def test_the_manifest_states_the_format_and_other_versions_write_their_own(exported, tmp_path, capsys):
    out, samples, manifest = exported
    assert (manifest["format_version"], manifest["route_points"]) == (fmt.FORMAT_VERSION, False)
    plans = [s for s in samples if s["task"] == "plan"]
    assert plans and all(fmt.waypoint_text_version(_answer(s)) == fmt.FORMAT_VERSION for s in plans)
    v1 = tmp_path / "v1"
    assert main(["generate", "--scenarios", "intersection", "--episodes", "1", "--max-seconds", "2", "--questions",
                 "0", "--noise-fraction", "0", "--format-version", "1", "--out", str(v1), "--preview", "0",
                 "--no-progress"]) == 0
    assert json.loads((v1 / "manifest.json").read_text())["format_version"] == 1
    assert all(fmt.waypoint_text_version(_answer(s)) == 1
               for s in json.loads((v1 / "train.json").read_text()) if s["task"] == "plan")
    # one folder, one plan format: another split in another format is refused, this split is replaced
    capsys.readouterr()
    assert main(["generate", "--scenarios", "intersection", "--episodes", "1", "--max-seconds", "2", "--split", "val",
                 "--out", str(v1), "--overwrite", "--preview", "0", "--no-progress"]) == 2
    assert "format version 1" in capsys.readouterr().err and not (v1 / "val.json").exists()
    assert main(["generate", "--scenarios", "intersection", "--episodes", "1", "--max-seconds", "2", "--questions",
                 "0", "--out", str(v1), "--overwrite", "--preview", "0", "--no-progress"]) == 0
    assert json.loads((v1 / "manifest.json").read_text())["format_version"] == fmt.FORMAT_VERSION
    rec = tmp_path / "rec"
    assert main(["recoveries", "--scenarios", "highway", "--samples", "2", "--format-version", "1", "--out", str(rec),
                 "--no-progress", "--preview", "0"]) == 0
    manifest = json.loads((rec / "manifest.json").read_text())
    assert (manifest["format_version"], manifest["route_points"]) == (1, False)
    assert all(fmt.waypoint_text_version(_answer(s)) == 1 for s in json.loads((rec / "train.json").read_text()))


def test_generate_from_the_v2_set_starts_at_rest_and_says_so(tmp_path):
    out = tmp_path / "v2"
    assert main(["generate", "--scenario-file", "v2", "--scenarios", "start_queue", "--episodes", "1",
                 "--max-seconds", "2", "--questions", "0", "--noise-fraction", "0", "--out", str(out), "--preview", "0",
                 "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["scenario_set"] == {"version": 2, "source": "scenarios_v2.yaml"}
    plans = [s for s in json.loads((out / "train.json").read_text()) if s["task"] == "plan"]
    assert plans and plans[0]["meta"]["velocity"] == [0.0, 0.0]
    assert all(np.abs(fmt.parse_waypoints(_answer(s)).waypoints).max() < 0.5 for s in plans)  # the queue stands
