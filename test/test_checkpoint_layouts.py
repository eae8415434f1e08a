"""Real checkpoint layouts (docs/checkpoints.md): WAM-Diff2's save and Qwen3-VL-2B-Instruct's, at a small width with
the real config keys, key names, token ids and processor config (``wamdiff_ros.bench.fixture``), load and plan
through ``Planner`` in the right mode; folders that cannot be understood are refused naming the file and the key."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.fixture import ADDED_TOKENS, BPE_IDS, VOCAB_ROWS, write_fixture
from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import INDEX_FILE, META_FILE, WAM_DIFF2_MASK_ID, default_dtype, load, load_checkpoint
from wamdiff_ros.planner import EgoState, Planner
from conftest import assert_parsed_plan

EGO = EgoState((5.0, 0.0))


@pytest.fixture(scope="module")
def wam_folder(tmp_path_factory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("wam") / "WAM-Diff2-B32", "wam_diff2", max_shard_size="12MB")


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("qwen") / "Qwen3-VL-2B-Instruct", "qwen3_vl")


@pytest.fixture(scope="module")
def wam_planner(wam_folder) -> Planner:
    return Planner.from_pretrained(str(wam_folder), steps=4, max_new_tokens=96)


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_fixtures_have_the_real_layouts(wam_folder, qwen_folder):
    wam = json.loads((wam_folder / "config.json").read_text())
    assert wam["model_type"] == "wam_diff2" and wam["text_config"]["model_type"] == "wam_diff2_text"
    assert "block_size" not in wam and "mask_token_id" not in wam  # WAM-Diff2 writes neither
    index = json.loads((wam_folder / INDEX_FILE).read_text())["weight_map"]
    assert len(set(index.values())) >= 2 and "lm_head.weight" not in index  # sharded; tied head not stored
    assert all(k.startswith(("model.language_model.", "model.visual.")) for k in index)
    assert json.loads((qwen_folder / "config.json").read_text())["model_type"] == "qwen3_vl"
    assert not (qwen_folder / INDEX_FILE).exists() and (qwen_folder / "model.safetensors").is_file()


def test_wam_diff2_folder_plans_as_block_diffusion_with_its_bare_mask_id(wam_planner, road_image):
    bundle = wam_planner.bundle
    assert bundle.meta.prediction == "in_place" and bundle.meta.prompt_attention == "block_causal"
    assert bundle.meta.trained_block_size == 32 and bundle.meta.format_version == 1
    assert bundle.mask_token_id == WAM_DIFF2_MASK_ID
    assert len(bundle.tokenizer) == BPE_IDS + len(ADDED_TOKENS)  # no token added
    assert bundle.model.get_input_embeddings().weight.shape[0] == VOCAB_ROWS  # no resize
    assert bundle.tokenizer.convert_ids_to_tokens(WAM_DIFF2_MASK_ID) is None  # no string names the mask
    plan = wam_planner.plan(road_image, EGO, "left")
    assert plan.stats.mode == "block" and plan.stats.block_size == 32
    assert_parsed_plan(plan)  # the grammar holds on a random model with Qwen's ids
    assert fmt.waypoint_text_version(plan.text) == 1  # WAM-Diff2's free width


def test_the_decoder_never_answers_the_mask_id(wam_planner, road_image):
    from wamdiff_ros.decoding.generate import generate

    bundle = wam_planner.bundle
    prompt = encode_prompt(bundle, fmt.ask_prompt("What is ahead?"), road_image)
    with torch.no_grad():  # unconstrained: every vocabulary row may win but the mask
        bundle.model.lm_head.weight[WAM_DIFF2_MASK_ID].mul_(50.0)  # make the mask row the likeliest
        try:
            result = generate(bundle, prompt, wam_planner.settings, None).result
        finally:
            bundle.model.lm_head.weight[WAM_DIFF2_MASK_ID].div_(50.0)
    assert result.new_tokens > 0 and WAM_DIFF2_MASK_ID not in result.tokens


def test_wam_diff2_prompt_is_built_as_its_inference_builds_it(wam_planner):
    """Chat template, image placeholder and image grid: a 1920x1080 frame resized to WAM-Diff2's pixel range is a
    1056x1920 image, grid (1, 66, 120): 1980 image pad tokens between the vision start and end tokens."""
    bundle, image = wam_planner.bundle, np.zeros((1080, 1920, 3), np.uint8)
    user = fmt.plan_prompt(fmt.Command.LEFT, (5.0, 0.0), (0.0, 0.0))
    prompt = encode_prompt(bundle, user, image)
    assert prompt.image_grid_thw.tolist() == [[1, 66, 120]]
    ids = prompt.input_ids[0].tolist()
    start, end = ids.index(151652), ids.index(151653)  # <|vision_start|>, <|vision_end|> at Qwen's ids
    assert ids[start + 1:end] == [151655] * 1980  # <|image_pad|>
    assert ids[0] == 151644 and ids.count(151645) == 1  # <|im_start|> ... <|im_end|> once
    before, _, after = user.partition(fmt.IMAGE_PLACEHOLDER)
    messages = [{"role": "user", "content": [{"type": "text", "text": before.strip()}, {"type": "image"},
                                             {"type": "text", "text": after.strip()}]}]
    templated = bundle.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert fmt.chat(user, 1) == templated  # one image pad per image before the processor expands it


def test_qwen_folder_plans_autoregressive_without_metadata_and_diffusion_with_it(qwen_folder, tmp_path, road_image):
    ar = Planner.from_pretrained(str(qwen_folder), max_new_tokens=96)
    assert ar.bundle.meta.prediction == "next_token"
    plan = ar.plan(road_image, EGO, "follow")
    assert plan.stats.mode == "ar" and plan.stats.block_size == 1
    folder = _copy(qwen_folder, tmp_path)
    meta = {"prediction": "in_place", "trained_block_size": 32, "prompt_attention": "block_causal",
            "format_version": 1, "route_points": False, "mask_token_id": WAM_DIFF2_MASK_ID}
    (folder / META_FILE).write_text(json.dumps(meta))
    block = Planner.from_pretrained(str(folder), steps=4, max_new_tokens=96)
    assert block.bundle.mask_token_id == WAM_DIFF2_MASK_ID and len(block.bundle.tokenizer) == BPE_IDS + 26
    assert block.plan(road_image, EGO, "follow").stats.mode == "block"


def test_mask_id_override_and_its_checks(wam_folder):
    assert load(str(wam_folder), mask_token_id=151700).mask_token_id == 151700
    with pytest.raises(CheckpointError, match=r"mask id override 151645 is '<\|im_end\|>'"):
        load(str(wam_folder), mask_token_id=151645)
    with pytest.raises(CheckpointError, match=r"mask id override 200000 is not an embedding row \(0..151935\)"):
        load(str(wam_folder), mask_token_id=200000)


def test_bf16_weights_load_as_float32_on_the_cpu_and_stay_bf16_on_a_gpu(wam_folder, wam_planner):
    assert wam_planner.bundle.model.dtype == torch.float32
    raw = json.loads((wam_folder / "config.json").read_text())
    assert default_dtype(raw, "cpu") == torch.float32
    assert default_dtype(raw, "cuda") == torch.bfloat16  # read from config.json, no GPU needed


def test_half_sharded_corrupt_truncated_and_foreign_folders_are_refused(wam_folder, tmp_path):
    index = json.loads((wam_folder / INDEX_FILE).read_text())["weight_map"]
    shard = sorted(set(index.values()))[-1]
    key = next(k for k, v in index.items() if v == shard)

    half = _copy(wam_folder, tmp_path / "half")
    (half / shard).unlink()
    with pytest.raises(CheckpointError, match=rf"{INDEX_FILE}: shard {shard} \(holding .+\) is missing"):
        load_checkpoint(half)

    stale = _copy(wam_folder, tmp_path / "stale")  # a single-file save beside a copied index
    for name in set(index.values()):
        (stale / name).unlink()
    (stale / "model.safetensors").write_bytes((wam_folder / shard).read_bytes())
    with pytest.raises(CheckpointError, match=r"is missing from"):
        load_checkpoint(stale)

    wrong = _copy(wam_folder, tmp_path / "wrong")  # the index maps a key to a shard that lacks it
    data = json.loads((wrong / INDEX_FILE).read_text())
    other = next(v for v in set(index.values()) if v != shard)
    data["weight_map"][key] = other
    (wrong / INDEX_FILE).write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=rf"{other}: lacks {key}"):
        load_checkpoint(wrong)

    truncated = _copy(wam_folder, tmp_path / "truncated")
    blob = (truncated / shard).read_bytes()
    (truncated / shard).write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError, match=rf"{shard}: corrupt safetensors file"):
        load_checkpoint(truncated)

    corrupt = _copy(wam_folder, tmp_path / "corrupt")
    (corrupt / shard).write_bytes(b"\x00" * 64 + blob[64:])
    with pytest.raises(CheckpointError, match=rf"{shard}: corrupt safetensors file"):
        load_checkpoint(corrupt)

    foreign = _copy(wam_folder, tmp_path / "foreign")
    config = json.loads((foreign / "config.json").read_text())
    (foreign / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"config.json: model_type 'llama' is not a Qwen3-VL checkpoint"):
        load_checkpoint(foreign)
    del config["text_config"]
    (foreign / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: key 'text_config' is missing"):
        load_checkpoint(foreign)
    config = json.loads((wam_folder / "config.json").read_text())
    (foreign / "config.json").write_text(json.dumps({**config, "block_size": "32"}))
    with pytest.raises(CheckpointError, match=r"config.json: key 'block_size' '32' must be an integer"):
        load_checkpoint(foreign)


def test_wamdiff_plan_takes_both_layouts(wam_folder, qwen_folder, capsys):
    from wamdiff_ros.cli import plan_main

    for folder, mode in ((wam_folder, "block"), (qwen_folder, "ar")):
        assert plan_main(["--model", str(folder), "--json", "--steps", "4"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["stats"]["mode"] == mode


@pytest.mark.slow
def test_full_size_2b_wam_diff2_folder_plans_on_the_cpu(tmp_path, road_image):
    """Qwen3-VL-2B's dimensions in WAM-Diff2's layout (4.3 GB of bf16): loads on the CPU and plans one frame
    (`make bench-2b` times the same from a fresh process: peak RSS and time to the first plan)."""
    folder = write_fixture(tmp_path / "WAM-Diff2-B32-2B", "wam_diff2", size="2b")
    planner = Planner.from_pretrained(str(folder))
    config = planner.bundle.model.config.text_config
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (2048, 28, VOCAB_ROWS)
    plan = planner.plan(road_image, EGO, "follow")
    assert plan.stats.mode == "block" and plan.stats.block_size == 32
    assert_parsed_plan(plan)  # random weights: the checker may refuse the plan
