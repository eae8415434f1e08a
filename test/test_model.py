"""Checkpoint folders: round trip, refusals with clear messages, WAM-Diff2 layout, the mask token rule."""

import json
import shutil

import numpy as np
import pytest
import torch

from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model import META_FILE, DecodeMeta, ensure_mask_token, load, load_checkpoint, tiny_random
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_training.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    bundle = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=16))
    return bundle, save_checkpoint(bundle, tmp_path_factory.mktemp("ckpt") / "tiny")


def _copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


def test_round_trip_keeps_weights_tokenizer_and_meta(saved, road_image):
    bundle, folder = saved
    assert sorted(p.name for p in folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))
    loaded = load_checkpoint(folder)
    assert loaded.meta == bundle.meta
    assert (loaded.meta.format_version, loaded.meta.route_points) == (3, True)  # DecodeMeta's defaults
    assert loaded.mask_token_id == bundle.mask_token_id and loaded.eos_token_id == bundle.eos_token_id
    assert loaded.tokenizer.tokenize("12.34,-5.60") == bundle.tokenizer.tokenize("12.34,-5.60")
    a, b = bundle.model.state_dict(), loaded.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ego = EgoState((5.0, 0.0))
    p1 = Planner(bundle, Planner.from_pretrained(str(folder)).settings).plan(road_image, ego, "left")
    p2 = Planner.from_pretrained(str(folder)).plan(road_image, ego, "left")
    np.testing.assert_array_equal(p1.waypoints, p2.waypoints)
    assert p2.stats.block_size == 16  # the checkpoint's trained block size is the default


def test_block_size_above_trained_is_refused(saved):
    _, folder = saved
    with pytest.raises(CheckpointError, match=r"block_size 32 exceeds the checkpoint's trained block size 16"):
        Planner.from_pretrained(str(folder), block_size=32)


def test_ar_checkpoint_refuses_blocks(saved, tmp_path):
    _, folder = saved
    copy = _copy(folder, tmp_path)
    (copy / META_FILE).unlink()  # a plain Qwen3-VL checkpoint: autoregressive, next-token
    meta = load_checkpoint(copy).meta
    assert (meta.prediction, meta.format_version) == ("next_token", 1)  # a foreign model writes free-width numbers
    assert not meta.route_points  # and was not trained with our route line
    with pytest.raises(CheckpointError, match="block_size 4 exceeds the checkpoint's trained block size 1"):
        Planner.from_pretrained(str(copy), block_size=4)
    planner = Planner.from_pretrained(str(copy))
    assert planner.settings.block_size == 1


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"prediction": "shifted"}, "prediction 'shifted'"),
        ({"prompt_attention": "full"}, "prompt_attention 'full'"),
        ({"format_version": 99}, "format_version 99"),
        ({"format_version": 2}, "format_version 2"),  # fixed-width y without bins: no longer read
        ({"route_points": "yes"}, "route_points 'yes'"),
        ({"prediction": "next_token", "trained_block_size": 8}, "trained_block_size 1"),
        ({"unknown_key": 1}, "bad decode metadata"),
    ],
)
def test_bad_metadata_is_refused(saved, tmp_path, meta, message):
    _, folder = saved
    copy = _copy(folder, tmp_path)
    (copy / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(copy)


def test_corrupt_weights_are_refused_naming_the_file(saved, tmp_path):
    _, folder = saved
    copy = _copy(folder, tmp_path)
    weights = next(copy.glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=weights.name):
        load_checkpoint(copy)
    weights.write_bytes(b"\x00" * 4)
    with pytest.raises(CheckpointError, match=weights.name):
        load_checkpoint(copy)


def test_pickle_only_and_foreign_checkpoints_are_refused(saved, tmp_path):
    _, folder = saved
    copy = _copy(folder, tmp_path)
    for f in copy.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    with pytest.raises(CheckpointError, match="pickle weights"):
        load_checkpoint(copy)
    other = _copy(folder, tmp_path / "x")
    config = json.loads((other / "config.json").read_text())
    config["model_type"] = "llama"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'llama' is not a Qwen3-VL checkpoint"):
        load_checkpoint(other)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load(tmp_path / "missing")


def test_a_training_run_folder_loads_its_latest_checkpoint(saved, tmp_path):
    """``wamdiff-train``'s --out folder: ``checkpoints/latest`` names the step folder the loader reads."""
    bundle, folder = saved
    run = tmp_path / "run"
    shutil.copytree(folder, run / "checkpoints" / "step-000300")
    shutil.copytree(folder, run / "checkpoints" / "step-000200")
    (run / "checkpoints" / "latest").write_text("step-000300\n")
    loaded = load(run)
    assert loaded.source == str(run / "checkpoints" / "step-000300")
    a, b = bundle.model.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    (run / "checkpoints" / "latest").write_text("step-000400")
    with pytest.raises(CheckpointError, match=r"step-000400: not a checkpoint folder"):
        load(run)
    (run / "checkpoints" / "latest").write_text("../elsewhere")
    with pytest.raises(CheckpointError, match=r"latest: corrupt pointer '../elsewhere'"):
        load(run)


def test_wam_diff2_renamed_checkpoint_loads(saved, tmp_path):
    """WAM-Diff2 ships renamed classes (model_type wam_diff2) with block_size in config.json and no wamdiff.json."""
    bundle, folder = saved
    copy = _copy(folder, tmp_path)
    (copy / META_FILE).unlink()
    config = json.loads((copy / "config.json").read_text())
    config.update(model_type="wam_diff2", architectures=["WAMDiff2ForConditionalGeneration"], block_size=32,
                  mask_token_id=bundle.mask_token_id)
    config["text_config"]["model_type"] = "wam_diff2_text"
    config["vision_config"]["model_type"] = "wam_diff2"
    config["auto_map"] = {"AutoModel": "modeling_wam_diff2.WAMDiff2ForConditionalGeneration"}
    (copy / "config.json").write_text(json.dumps(config))
    loaded = load_checkpoint(copy)
    assert loaded.meta.trained_block_size == 32 and loaded.meta.prediction == "in_place"
    assert loaded.meta.prompt_attention == "block_causal"
    assert loaded.meta.format_version == 1  # the paper's free-width waypoints
    assert not loaded.meta.route_points  # the paper's prompt has no route line
    a, b = bundle.model.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_mask_token_added_only_when_missing():
    bundle = tiny_random()
    rows = bundle.model.get_input_embeddings().weight.shape[0]
    vocab = len(bundle.tokenizer)
    # present: same id, no resize
    assert ensure_mask_token(bundle.model, bundle.tokenizer, "<|mask|>") == bundle.mask_token_id
    assert len(bundle.tokenizer) == vocab
    # missing but the embedding has spare rows (as Qwen's 151,936 > tokenizer): added, no resize
    bundle.model.resize_token_embeddings(rows + 8)
    new_id = ensure_mask_token(bundle.model, bundle.tokenizer, "[MASK]")
    assert new_id == vocab and bundle.model.get_input_embeddings().weight.shape[0] == rows + 8
    # missing and no spare row: the embedding grows by exactly what the id needs
    small = tiny_random()
    small.model.resize_token_embeddings(len(small.tokenizer))
    mid = ensure_mask_token(small.model, small.tokenizer, "[MASK]")
    assert small.model.get_input_embeddings().weight.shape[0] == mid + 1
