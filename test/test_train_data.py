"""Tests for the training data pipeline (``wamdiff_training.data`` / ``.sampling``): records of a real export load,
prompts are byte-identical to ``encode_prompt``'s, answers end with EOS, NAVSIM-style variants load, malformed files
name file / record / field, the export's manifest states its format, and the sampler mixes, shards, resumes and
repeats deterministically."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import wamdiff_training  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import format as fmt
from wamdiff_ros.cli import load_rgb
from wamdiff_ros.inputs import encode_prompt
from wamdiff_training.data import (REST_GO_M, REST_SPEED, SLOW_DOWN_M, Record, RecordError, SampleDataset, encode_record,
                                   load_records, mix_group, moves_off, read_manifest, slows_down, turn_ahead)
from wamdiff_training.sampling import TaskMix, TaskMixSampler
from wamdiff_training.world.dataset import main as export

TASKS = ["plan"] * 30 + ["detect"] * 30 + ["ask"] * 60


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_data") / "set"
    assert export(["generate", "--scenarios", "highway,roundabout", "--episodes", "1", "--max-seconds", "3",
                   "--out", str(out), "--preview", "0", "--no-progress"]) == 0
    return out


def test_export_loads_as_records(exported):
    raw = json.loads((exported / "train.json").read_text())
    records = load_records(exported / "train.json")
    assert [r.id for r in records] == [s["id"] for s in raw]
    for r, s in zip(records, raw):
        assert r.image_path == exported / s["image"] and r.image_path.is_file()
        assert (r.user, r.answer) == (s["conversations"][0]["value"], s["conversations"][1]["value"])
        assert r.task == s["task"] and r.meta == s["meta"]
    assert {r.task for r in records} == {"plan", "detect", "ask"}
    # root overrides the JSON's folder
    assert load_records([str(exported / "train.json")], root=exported)[0].image_path == records[0].image_path


def test_prompt_ids_match_encode_prompt_and_answers_end_with_eos(exported, tiny_bundle):
    raw = json.loads((exported / "train.json").read_text())
    records = load_records(exported / "train.json")
    for r, s in zip(records, raw):
        sample = encode_record(tiny_bundle, r)
        ref = encode_prompt(tiny_bundle, s["conversations"][0]["value"], load_rgb(exported / s["image"]))
        assert sample.prompt_ids.tolist() == ref.input_ids[0].tolist()
        assert torch.equal(sample.mm_token_type_ids, ref.mm_token_type_ids[0])
        assert torch.equal(sample.pixel_values, ref.pixel_values)
        assert torch.equal(sample.image_grid_thw, ref.image_grid_thw)
        ids = sample.answer_ids.tolist()
        assert ids[-1] == tiny_bundle.eos_token_id and tiny_bundle.eos_token_id not in ids[:-1]
        assert tiny_bundle.tokenizer.decode(ids[:-1], skip_special_tokens=False) == s["conversations"][1]["value"]
        assert (sample.id, sample.task) == (s["id"], s["task"])


def test_lru_cache(exported, tiny_bundle):
    data = SampleDataset(load_records(exported / "train.json"), tiny_bundle, cache_size=2)
    first = data[0]
    assert data[0] is first and (data.hits, data.misses) == (1, 1)
    data[1], data[2]  # evicts 0
    assert data[0] is not first and data.misses == 4
    assert data[0].prompt_ids.tolist() == first.prompt_ids.tolist()
    assert [s.id for s in data.batch([2, 1])] == [data.records[2].id, data.records[1].id]
    uncached = SampleDataset(data.records, tiny_bundle)
    assert uncached[0] is not uncached[0]


def _navsim_file(exported: Path, tmp_path: Path) -> tuple[Path, str]:
    """A WAM-Diff2 NAVSIM-style record: image list (front camera + one more), two turns, no task / meta."""
    cams = tmp_path / "sensor_blobs"
    cams.mkdir()
    front = load_rgb(exported / "images/train/highway_0_0000.png")
    from PIL import Image

    Image.fromarray(front).save(cams / "CAM_F0.jpg")
    Image.fromarray(front[:, ::-1].copy()).save(cams / "CAM_L0.jpg")
    plan = fmt.format_waypoints(np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1))
    record = {"id": 17, "image": ["sensor_blobs/CAM_F0.jpg", "sensor_blobs/CAM_L0.jpg"], "conversations": [
        {"from": "human", "value": fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.5, 0.0))},
        {"from": "gpt", "value": plan},
        {"from": "human", "value": "Why turn left here?"},
        {"from": "gpt", "value": "The route turns left at the next junction."}]}
    path = tmp_path / "navsim_train.json"
    path.write_text(json.dumps([record]))
    return path, plan


def test_navsim_style_record_loads(exported, tmp_path, tiny_bundle):
    path, plan = _navsim_file(exported, tmp_path)
    first, second = load_records(path)
    assert (first.id, first.task, first.answer) == ("17", "plan", plan)
    assert first.image_path == second.image_path == tmp_path / "sensor_blobs/CAM_F0.jpg"
    assert (second.id, second.task) == ("17#1", "ask")
    assert second.user == "<image>\nWhy turn left here?" and first.meta == {}
    for r in (first, second):
        sample = encode_record(tiny_bundle, r)
        ref = encode_prompt(tiny_bundle, r.user, load_rgb(r.image_path))
        assert sample.prompt_ids.tolist() == ref.input_ids[0].tolist() and int(sample.mm_token_type_ids.sum()) > 0
    assert [r.id for r in load_records(path, turns="first")] == ["17"]
    # a later turn with its own <image> shows the next listed image; one more than listed is an error
    data = json.loads(path.read_text())
    left = [{"from": "human", "value": "<image>\nIs the left lane free?"}, {"from": "gpt", "value": "Yes."}]
    data[0]["conversations"] += left
    path.write_text(json.dumps(data))
    assert load_records(path)[2].image_path.name == "CAM_L0.jpg"
    data[0]["conversations"] += left
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"record 0: conversations\[6\].value: <image> number 3 but 'image' lists 2"):
        load_records(path)
    # a single image path, user/assistant roles, and an explicit task
    data = json.loads(path.read_text())
    data[0].update(image="sensor_blobs/CAM_F0.jpg", task="plan", conversations=[
        {"from": "user", "value": data[0]["conversations"][0]["value"]},
        {"from": "assistant", "value": plan}])
    path.write_text(json.dumps(data))
    (only,) = load_records(path)
    assert only.task == "plan" and only.image_path.name == "CAM_F0.jpg"


def _mutate(record: dict, how: str) -> object:
    if how == "missing":
        del record["conversations"]
    elif how == "wrong_type":
        record["conversations"][1]["value"] = 5
    elif how == "image_type":
        record["image"] = 5
    elif how == "no_image_file":
        record["image"] = "images/train/nowhere.png"
    elif how == "bad_role":
        record["conversations"][0]["from"] = "gpt"
    elif how == "two_placeholders":
        record["conversations"][0]["value"] += " <image>"
    return record


@pytest.mark.parametrize("how, field, words", [
    ("missing", "conversations", "missing"),
    ("wrong_type", "conversations[1].value", "expected a string, got int"),
    ("image_type", "image", "expected a path or a non-empty list of paths"),
    ("no_image_file", "image", "no such image file"),
    ("bad_role", "conversations[0].from", "'human'"),
    ("two_placeholders", "conversations[0].value", "2 <image> placeholders"),
])
def test_malformed_records_name_file_index_and_field(exported, tmp_path, how, field, words):
    data = json.loads((exported / "train.json").read_text())[:4]
    data[2] = _mutate(data[2], how)
    path = exported / f"bad_{how}.json"  # beside the images, so the other records resolve
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as info:
        load_records(path)
    message = str(info.value)
    assert message.startswith(f"{path}: record 2: {field}: ") and words in message, message
    assert (info.value.file, info.value.index, info.value.field) == (str(path), 2, field)


@pytest.mark.parametrize("text, words", [("[{\"id\": 1,", "invalid JSON"), ('{"id": 1}', "expected a list")])
def test_malformed_files_name_the_file(tmp_path, text, words):
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(RecordError, match=words) as info:
        load_records(path)
    assert str(info.value).startswith(f"{path}: ")
    with pytest.raises(RecordError, match="cannot read"):
        load_records(tmp_path / "absent.json")


def test_duplicate_ids_across_files_are_refused(exported):
    with pytest.raises(RecordError, match="duplicate id"):
        load_records([exported / "train.json", exported / "train.json"])


def test_the_manifest_beside_an_export_states_its_format(exported, tmp_path):
    manifest = read_manifest(exported / "train.json")
    assert (manifest["format_version"], manifest["route_points"]) == (fmt.FORMAT_VERSION, False)
    plans = [r for r in load_records(exported / "train.json") if r.task == "plan"]
    assert plans and {fmt.waypoint_text_version(r.answer) for r in plans} == {fmt.FORMAT_VERSION}
    assert read_manifest(tmp_path / "hand_written.json") is None  # no manifest beside it: the format is not known
    for bad, field in (({"route_points": False}, "format_version"), ({"format_version": 2}, "format_version"),
                       ({"format_version": True}, "format_version"),
                       ({"format_version": 3, "route_points": "yes"}, "route_points")):
        (tmp_path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(RecordError, match=f"manifest.json: {field}"):
            read_manifest(tmp_path / "train.json")
    (tmp_path / "manifest.json").write_text("[")
    with pytest.raises(RecordError, match="cannot read the export manifest"):
        read_manifest(tmp_path / "train.json")


def test_task_mix_shares_and_probabilities():
    mix = TaskMix()
    assert mix.shares(TASKS) == {"ask": 0.25, "detect": 0.25, "plan": 0.5}
    p = mix.probabilities(TASKS)
    assert p.sum() == pytest.approx(1.0) and p[0] == pytest.approx(0.5 / 30) and p[-1] == pytest.approx(0.25 / 60)
    assert TaskMix({"plan": 1.0, "ask": 1.0, "detect": 2.0}).shares(["plan", "ask"]) == {"ask": 0.5, "plan": 0.5}
    with pytest.raises(ValueError, match="no weight for task"):
        TaskMix({"plan": 1.0}).shares(TASKS)
    with pytest.raises(ValueError, match=">= 0"):
        TaskMix({"plan": -1.0})


def test_task_mixing_proportions_over_many_draws():
    sampler = TaskMixSampler(TASKS, TaskMix({"plan": 1.0, "detect": 0.5, "ask": 0.25}), batch_size=7, seed=3,
                             epoch_size=101)
    drawn = Counter(TASKS[i] for _ in range(40) for batch in sampler for i in batch)
    total = sum(drawn.values())
    assert total == 40 * len(sampler) * 7
    for task, share in {"plan": 4 / 7, "detect": 2 / 7, "ask": 1 / 7}.items():
        assert drawn[task] / total == pytest.approx(share, abs=0.01)
    # within a task, records are drawn evenly: 58 plan draws an epoch are every plan record once, 28 twice
    counts = Counter(sampler.epoch_indices(e)[k] for e in range(40) for k in range(101))
    plan = [counts[i] for i in range(30)]
    assert sum(plan) == 40 * 58 and 40 <= min(plan) and max(plan) <= 80


def test_behaviour_and_question_groups_take_their_share_out_of_their_task():
    def record(task, expert=None, command="follow"):
        meta = {} if expert is None else {"expert": expert, "command": command}
        return Record(f"r{expert}", Path("x.png"), "", "", task, meta)

    weights = {"plan": 1.0, "plan/lane_change": 1.0, "plan/junction": 2.0, "detect": 0.5}
    records = [record("plan", "free")] * 6 + [record("plan", "lane change free")] * 2 \
        + [record("plan", "free", "left")] * 2 + [record("plan")] + [record("detect", "free")] * 3
    groups = [mix_group(r, weights) for r in records]
    assert groups == ["plan"] * 6 + ["plan/lane_change"] * 2 + ["plan/junction"] * 2 + ["plan"] + ["detect"] * 3
    assert mix_group(record("plan", "yield"), weights) == "plan"  # no weight of its own: the plan task's share
    recovery = Record("rec", Path("x.png"), "", "", "plan", {"expert": "free", "command": "follow",
                                                             "recovery": {"offset_m": 0.5, "heading_rad": 0.01}})
    assert mix_group(recovery, weights) == "plan"  # wamdiff-train data recoveries frames: their own group when weighted
    assert mix_group(recovery, {**weights, "plan/recovery": 1.0}) == "plan/recovery"
    sampler = TaskMixSampler(groups, TaskMix(weights), batch_size=9, seed=0, epoch_size=900)
    drawn = Counter(groups[i] for batch in sampler for i in batch)
    assert drawn == {"plan": 200, "plan/lane_change": 200, "plan/junction": 400, "detect": 100}
    # questions likewise, by the world's question key
    ask = [Record("a", Path("x.png"), "", "", "ask", {"question": q}) for q in ("lead", "lane", "lead", "command")]
    assert [mix_group(r, {"ask": 1.0, "ask/lead": 2.0}) for r in ask] == ["ask/lead", "ask", "ask/lead", "ask"]
    assert [mix_group(r, {"ask": 1.0}) for r in ask] == ["ask"] * 4


def test_junction_frames_that_begin_a_turn_are_their_own_group_when_weighted():
    def plan(command, ys, xs=None):
        xs = xs or [2.0 * (k + 1) for k in range(8)]
        return Record("p", Path("x.png"), "", fmt.format_waypoints(np.array(list(zip(xs, ys)))), "plan",
                      {"expert": "free", "command": command})

    begins = plan("left", [0.0, 0.1, 0.3, 0.8, 1.5, 2.4, 3.5, 5.0])  # straight for 1 s, 5 m left at 4 s
    turning = plan("left", [0.5, 1.2, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])  # already turning at 1 s
    slight = plan("right", [0.0, 0.0, -0.2, -0.5, -1.0, -1.5, -2.0, -2.9])  # ends short of 3 m
    crossing = plan("straight", [0.0] * 8)
    cruise_curve = plan("follow", [0.0, 0.1, 0.3, 0.8, 1.5, 2.4, 3.5, 5.0])  # a bend with no command: not a junction
    assert turn_ahead(begins.answer) and not turn_ahead(turning.answer) and not turn_ahead(slight.answer)
    assert turn_ahead(plan("right", [-y for y in [0.0, 0.1, 0.3, 0.8, 1.5, 2.4, 3.5, 5.0]]).answer)
    assert not turn_ahead("not a plan")
    weights = {"plan": 1.0, "plan/junction": 1.0, "plan/turn_start": 1.0}
    assert [mix_group(r, weights) for r in (begins, turning, slight, crossing, cruise_curve)] == \
        ["plan/turn_start", "plan/junction", "plan/junction", "plan/junction", "plan"]
    no_junction = {"plan": 1.0, "plan/turn_start": 1.0}  # out of the plan task's share then
    assert [mix_group(r, no_junction) for r in (begins, turning)] == ["plan/turn_start", "plan"]
    assert mix_group(begins, {"plan": 1.0, "plan/junction": 1.0}) == "plan/junction"  # not named: no group


def test_sharding_is_disjoint_equal_and_covers_the_epoch():
    world = 3
    samplers = [TaskMixSampler(TASKS, batch_size=4, seed=1, rank=r, world_size=world, epoch_size=120)
                for r in range(world)]
    assert {len(s) for s in samplers} == {10}
    per_rank = [np.array(list(s)) for s in samplers]  # (10, 4) each
    interleaved = np.stack(per_rank, axis=-1).reshape(-1)  # step, slot, rank -> positions of the epoch
    assert np.array_equal(interleaved, samplers[0].epoch_indices(0))
    # mixing by the data's own shares: an epoch is a permutation, so the ranks' record sets are disjoint
    natural = TaskMix({"plan": 1.0, "detect": 1.0, "ask": 2.0})
    sets = [set(np.concatenate(list(TaskMixSampler(TASKS, natural, 5, seed=2, rank=r, world_size=world))).tolist())
            for r in range(world)]
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
    assert set().union(*sets) == set(range(len(TASKS))) and {len(s) for s in sets} == {40}
    # a tail that does not fill a batch on every rank is dropped, equally for all ranks
    tails = [TaskMixSampler(TASKS, batch_size=4, rank=r, world_size=world, epoch_size=125) for r in range(world)]
    assert {len(s) for s in tails} == {10} and {len(list(s)) for s in tails} == {10}
    with pytest.raises(ValueError, match="less than one batch"):
        TaskMixSampler(TASKS, batch_size=64, world_size=2)


@pytest.mark.parametrize("taken", [0, 3, 9, 10, 17])
def test_resume_yields_exactly_the_remaining_batches(taken):
    def make():
        return TaskMixSampler(TASKS, batch_size=6, seed=5, rank=1, world_size=2)

    reference = make()
    full = [b for _ in range(3) for b in reference]  # 3 epochs of 10 batches
    interrupted = make()
    stream = interrupted.stream()
    assert [next(stream) for _ in range(taken)] == full[:taken]
    state = json.loads(json.dumps(interrupted.state_dict()))  # survives a JSON checkpoint
    resumed = make()
    resumed.load_state_dict(state)
    tail = [b for b in resumed] + [b for _ in range(3 - state["epoch"] - 1) for b in resumed]
    assert tail == full[taken:]


def test_state_from_another_setup_is_refused():
    state = TaskMixSampler(TASKS, batch_size=6, seed=5).state_dict()
    for other in (TaskMixSampler(TASKS, batch_size=6, seed=6), TaskMixSampler(TASKS, batch_size=5, seed=5),
                  TaskMixSampler(TASKS, TaskMix({"plan": 1, "detect": 1, "ask": 1}), batch_size=6, seed=5)):
        with pytest.raises(ValueError, match="cannot resume"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="out of range"):
        TaskMixSampler(TASKS, batch_size=6, seed=5).load_state_dict({**state, "position": 99})


def test_same_seed_same_batches_other_seed_other_batches():
    def epochs(seed: int) -> list[list[int]]:
        s = TaskMixSampler(TASKS, batch_size=8, seed=seed, epoch_size=200)
        return [b for _ in range(2) for b in s]

    assert epochs(11) == epochs(11)
    assert epochs(11) != epochs(12)
    s = TaskMixSampler(TASKS, batch_size=8, seed=11, epoch_size=200)
    assert not np.array_equal(s.epoch_batches(0), s.epoch_batches(1))  # reshuffled per epoch
    s.set_epoch(1)
    assert next(iter(s)) == s.epoch_batches(1)[0].tolist()


def test_frames_at_rest_that_move_off_or_wait_are_their_own_groups_when_weighted():
    def plan(speed, x8, **meta):
        xs = np.linspace(x8 / 8, x8, 8)
        return Record("p", Path("x.png"), "", fmt.format_waypoints(np.stack([xs, np.zeros(8)], 1)), "plan",
                      {"expert": "free", "command": "follow", "speed": speed, **meta})

    starts, waits = plan(0.0, 12.0), plan(0.0, 0.0)
    creeps, rolling = plan(REST_SPEED - 0.01, REST_GO_M - 0.5), plan(REST_SPEED, 12.0)
    at_junction = plan(0.0, 8.0, command="left")  # a start at a junction is a start first
    assert moves_off(starts.answer) and not moves_off(creeps.answer) and not moves_off("not a plan")
    weights = {"plan": 1.0, "plan/junction": 1.0, "plan/rest_start": 1.0, "plan/rest_hold": 1.0}
    assert [mix_group(r, weights) for r in (starts, waits, creeps, rolling, at_junction)] == \
        ["plan/rest_start", "plan/rest_hold", "plan/rest_hold", "plan", "plan/rest_start"]
    only_starts = {"plan": 1.0, "plan/junction": 1.0, "plan/rest_start": 1.0}
    waits_at_junction = plan(0.0, 0.0, command="left")  # its group not named: the junction's
    assert [mix_group(r, only_starts) for r in (starts, waits, waits_at_junction)] == ["plan/rest_start", "plan",
                                                                                      "plan/junction"]
    assert mix_group(Record("p", Path("x.png"), "", "boxes", "detect", {"speed": 0.0}), weights) == "detect"


def test_lane_keeping_frames_that_brake_are_their_own_group_when_weighted():
    def plan(speed, x8, expert="free", command="follow"):
        xs = np.linspace(x8 / 8, x8, 8)
        return Record("p", Path("x.png"), "", fmt.format_waypoints(np.stack([xs, np.zeros(8)], 1)), "plan",
                      {"expert": expert, "command": command, "speed": speed})

    brakes = plan(25.0, 100.0 - SLOW_DOWN_M)  # 8 m short of holding 25 m/s for 4 s
    holds = plan(25.0, 100.0 - SLOW_DOWN_M + 0.5)
    speeds_up = plan(20.0, 95.0)
    assert slows_down(brakes.answer, 25.0) and not slows_down(holds.answer, 25.0)
    assert not slows_down(brakes.answer, None) and not slows_down("not a plan", 25.0)
    weights = {"plan": 1.0, "plan/slow_down": 1.0}
    junction = plan(25.0, 60.0, command="left")  # a junction's braking stays a junction frame
    lane_change = plan(25.0, 60.0, expert="lane change free")
    assert [mix_group(r, weights) for r in (brakes, holds, speeds_up, junction, lane_change)] == \
        ["plan/slow_down", "plan", "plan", "plan", "plan"]
    assert mix_group(brakes, {"plan": 1.0, "plan/cruise": 1.0}) == "plan/cruise"  # not named: no group
