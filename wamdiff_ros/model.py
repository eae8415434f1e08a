"""Checkpoint folders (Qwen3-VL / WAM-Diff2 layout) and the tiny random default -> a loaded model bundle.

A checkpoint folder holds config.json, *.safetensors (one file, or shards with model.safetensors.index.json; pickle
weights are refused), a tokenizer and preprocessor_config.json; ``wamdiff.json`` carries the decode metadata (see
``DecodeMeta``). How each layout decodes (docs/checkpoints.md):

- a folder with ``wamdiff.json`` (this package's saves): as it says;
- WAM-Diff2's save (model_type ``wam_diff2``; no decode metadata in it): block diffusion with in-place prediction,
  block-causal prompt, WAM-Diff2's free-width answers, mask id 151671 (an embedding row no token string names, so
  no token is added), block size from ``block_size`` in config.json when present, else 32, and WAM-Diff2's image
  size (``qwen_vl_utils``' 12,544 to 2,073,600 pixels);
- any other Qwen3-VL folder: autoregressive.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES, TINY_RANDOM, resolve  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

META_FILE = "wamdiff.json"
PREDICTIONS = ("in_place", "next_token")
PROMPT_ATTENTION = ("causal", "block_causal")
DEFAULT_MASK_TOKEN = "<|mask|>"
WAM_DIFF2_MODEL_TYPE = "wam_diff2"
WAM_DIFF2_MASK_ID = 151671  # its generate()'s default and its training YAML's: a bare id, no token string
WAM_DIFF2_BLOCK_SIZE = 32  # its inference default; its config.json holds none
WAM_DIFF2_PIXELS = (12544, 2073600)  # the image size range its inference resizes to (min_pixels, max_pixels)

_PROMPT_TOKENS = ("<|im_start|>", fmt.CHAT_END, fmt.VISION_START, fmt.VISION_END, fmt.IMAGE_PAD)
# WAM-Diff2 ships renamed copies of the Qwen3-VL classes with the same weight names.
_RENAMED_MODEL_TYPES = {WAM_DIFF2_MODEL_TYPE: "qwen3_vl", "qwen3_vl_uniform": "qwen3_vl"}
_RENAMED_SUB_TYPES = {"vision_config": "qwen3_vl_vision", "text_config": "qwen3_vl_text"}
# Key layouts seen in other Qwen-VL exports (older transformers, vLLM-style) -> transformers 5.
_KEY_MAPPING = {
    r"^visual\.": "model.visual.",
    r"^model\.layers\.": "model.language_model.layers.",
    r"^model\.embed_tokens\.": "model.language_model.embed_tokens.",
    r"^model\.norm\.": "model.language_model.norm.",
    r"^language_model\.model\.": "model.language_model.",
    r"^language_model\.lm_head\.": "lm_head.",
}


@dataclass(frozen=True, slots=True)
class DecodeMeta:
    """How a checkpoint was trained to decode; the loader refuses settings that contradict it."""

    prediction: str = "in_place"  # in_place: logit at a [MASK] predicts that position; next_token: AR shift
    trained_block_size: int = 32
    prompt_attention: str = "block_causal"  # the prompt is prefilled in trained_block_size chunks
    format_version: int = fmt.FORMAT_VERSION
    mask_token: str = DEFAULT_MASK_TOKEN
    route_points: bool = True  # trained with the optional route line in its plan prompts (fmt.route_line)
    mask_token_id: int | None = None  # set: the mask is this embedding row (no token string; mask_token unused)

    def __post_init__(self) -> None:
        if self.prediction not in PREDICTIONS:
            raise CheckpointError(f"{META_FILE}: prediction {self.prediction!r} is not one of {PREDICTIONS}")
        if self.prompt_attention not in PROMPT_ATTENTION:
            raise CheckpointError(
                f"{META_FILE}: prompt_attention {self.prompt_attention!r} is not one of {PROMPT_ATTENTION}"
            )
        if self.trained_block_size < 1:
            raise CheckpointError(f"{META_FILE}: trained_block_size {self.trained_block_size} must be >= 1")
        if self.prediction == "next_token" and self.trained_block_size != 1:
            raise CheckpointError(f"{META_FILE}: a next_token (AR) checkpoint has trained_block_size 1")
        if not isinstance(self.route_points, bool):
            raise CheckpointError(f"{META_FILE}: route_points {self.route_points!r} must be true or false")
        if self.mask_token_id is not None and (not isinstance(self.mask_token_id, int) or self.mask_token_id < 0):
            raise CheckpointError(f"{META_FILE}: mask_token_id {self.mask_token_id!r} must be a token id >= 0")
        if self.format_version not in fmt.FORMAT_VERSIONS:
            raise CheckpointError(
                f"{META_FILE}: format_version {self.format_version} is not one this package reads "
                f"{fmt.FORMAT_VERSIONS}"
            )

    def check_block_size(self, block_size: int) -> None:
        if block_size < 1:
            raise CheckpointError(f"block_size {block_size} must be >= 1")
        if block_size > self.trained_block_size:
            raise CheckpointError(
                f"block_size {block_size} exceeds the checkpoint's trained block size {self.trained_block_size}"
            )

    @property
    def prompt_block_size(self) -> int:
        return self.trained_block_size if self.prompt_attention == "block_causal" else 1


@dataclass(slots=True)
class ModelBundle:
    model: Qwen3VLForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    image_processor: Qwen2VLImageProcessorPil
    meta: DecodeMeta
    mask_token_id: int
    eos_token_id: int
    source: str

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device


def ensure_mask_token(model: Qwen3VLForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, mask: str) -> int:
    """Add [MASK] only if the vocabulary lacks it; resize the embeddings only if its id does not fit."""
    if mask not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"mask_token": mask})
        log.info("added mask token %r to the tokenizer", mask)
    elif tokenizer.mask_token is None:
        tokenizer.mask_token = mask
    mask_id = tokenizer.convert_tokens_to_ids(mask)
    rows = model.get_input_embeddings().weight.shape[0]
    if mask_id >= rows:
        model.resize_token_embeddings(mask_id + 1, mean_resizing=False)
        log.info("resized token embeddings %d -> %d for the mask token", rows, mask_id + 1)
    return mask_id


def resolve_mask_id(model: Qwen3VLForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, meta: DecodeMeta,
                  source: str, override: int | None = None) -> int:
    """The [MASK] id: ``override``, else the checkpoint's bare id (``meta.mask_token_id``), neither adding a token;
    else ``meta.mask_token``'s id (``ensure_mask_token``). A bare id must be an embedding row the tokenizer does not
    name with a token the prompt uses (``_PROMPT_TOKENS``)."""
    bare = override if override is not None else meta.mask_token_id
    if bare is None:
        return ensure_mask_token(model, tokenizer, meta.mask_token)
    rows = model.get_input_embeddings().weight.shape[0]
    what = "the mask id override" if override is not None else f"{META_FILE} / config.json key mask_token_id"
    if not 0 <= bare < rows:
        raise CheckpointError(f"{source}: {what} {bare} is not an embedding row (0..{rows - 1})")
    used = {tokenizer.convert_tokens_to_ids(t): t for t in _PROMPT_TOKENS}
    if bare in used:
        raise CheckpointError(f"{source}: {what} {bare} is {used[bare]!r}, a token every prompt uses")
    return int(bare)


def _read_config(folder: Path) -> tuple[dict, Qwen3VLConfig]:
    """config.json as written (what the layout says of itself) and the transformers config it loads as."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json; expected a Qwen3-VL / WAM-Diff2 checkpoint folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable config ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    model_type = raw.get("model_type")
    model_type = _RENAMED_MODEL_TYPES.get(model_type, model_type)
    if model_type != "qwen3_vl":
        raise CheckpointError(
            f"{path}: model_type {raw.get('model_type')!r} is not a Qwen3-VL checkpoint "
            f"(accepted: qwen3_vl, {', '.join(_RENAMED_MODEL_TYPES)})"
        )
    for key in ("text_config", "vision_config"):
        if not isinstance(raw.get(key), dict):
            raise CheckpointError(f"{path}: key {key!r} is missing or not an object (a Qwen3-VL config has both)")
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if not isinstance(raw["text_config"].get(key), int):
            raise CheckpointError(f"{path}: key 'text_config.{key}' is missing or not an integer")
    qwen = copy.deepcopy(raw)
    qwen["model_type"] = "qwen3_vl"
    qwen["architectures"] = ["Qwen3VLForConditionalGeneration"]
    for key, sub_type in _RENAMED_SUB_TYPES.items():
        if isinstance(qwen.get(key), dict):
            qwen[key]["model_type"] = sub_type
    qwen.pop("auto_map", None)  # never follow remote code
    try:
        return raw, Qwen3VLConfig.from_dict(qwen)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a Qwen3-VL config ({exc})") from exc


def _read_meta(folder: Path, raw: dict) -> DecodeMeta:
    """``raw``: config.json as written."""
    path = folder / META_FILE
    if path.is_file():
        try:
            return DecodeMeta(**json.loads(path.read_text()))
        except (TypeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: bad decode metadata ({exc})") from exc
    block = raw.get("block_size")
    if block is not None and (not isinstance(block, int) or block < 1):
        raise CheckpointError(f"{folder / 'config.json'}: key 'block_size' {block!r} must be an integer >= 1")
    if raw.get("model_type") == WAM_DIFF2_MODEL_TYPE or block:
        if block is None:
            block = WAM_DIFF2_BLOCK_SIZE
            log.info("%s: a WAM-Diff2 checkpoint without a block size in its metadata: decoding with B = %d",
                     folder, block)
        mask_id = raw.get("mask_token_id", WAM_DIFF2_MASK_ID)
        return DecodeMeta(trained_block_size=int(block), prompt_attention="block_causal", format_version=1,
                          route_points=False, mask_token_id=mask_id)
    log.warning("%s has no %s: treating it as an autoregressive Qwen3-VL model", folder, META_FILE)
    return DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal", format_version=1,
                      route_points=False)


INDEX_FILE = "model.safetensors.index.json"


def _open_safetensors(path: Path) -> set[str]:
    """The tensor names of one safetensors file, its last tensor read (a truncated file fails there)."""
    try:
        if path.stat().st_size < 8:
            raise ValueError("file too short")
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            if keys:
                f.get_slice(keys[-1])
        return set(keys)
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise CheckpointError(f"{path}: corrupt safetensors file ({exc})") from exc


def _check_weights(folder: Path) -> list[Path]:
    """The weight files, each opened; with an index file, every shard it names present and holding the keys it maps
    there (a half-copied sharded folder is refused naming the missing file and a key it should hold)."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError("weight_map is empty or not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: unreadable index, key 'weight_map' ({exc})") from exc
        shards: dict[str, list[str]] = {}
        for key, name in weight_map.items():
            shards.setdefault(str(name), []).append(key)
        files = []
        for name, keys in sorted(shards.items()):
            path = folder / name
            if "/" in name or not path.is_file():
                raise CheckpointError(f"{index}: shard {name} (holding {keys[0]}) is missing from {folder}")
            missing = sorted(set(keys) - _open_safetensors(path))
            if missing:
                raise CheckpointError(f"{path}: lacks {missing[0]}, which {INDEX_FILE} maps to it"
                                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            files.append(path)
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found pickle weights {pickles}; convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{folder}: no *.safetensors weights{hint}")
    if len(files) > 1:
        raise CheckpointError(f"{folder}: {len(files)} safetensors files ({files[0].name}, ...) but no {INDEX_FILE}")
    _open_safetensors(files[0])
    return files


LATEST_POINTER = "latest"  # a training run's checkpoints/<this> names its newest checkpoint folder


def latest_checkpoint(run: str | Path) -> Path:
    """The checkpoint folder a training run's ``checkpoints/latest`` pointer names (``wamdiff-train``'s --out)."""
    pointer = Path(run) / "checkpoints" / LATEST_POINTER
    try:
        name = pointer.read_text().strip()
    except OSError as exc:
        raise CheckpointError(f"{pointer}: no checkpoint ({exc.strerror or exc})") from exc
    if not name or "/" in name:
        raise CheckpointError(f"{pointer}: corrupt pointer {name!r}")
    return pointer.parent / name


def torch_dtype(name: str) -> torch.dtype | None:
    """A ``DTYPE_NAMES`` name as the loaders take it (None: auto)."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of {DTYPE_NAMES}")
    return None if name == "auto" else getattr(torch, name)


def default_dtype(raw: dict, device: str | torch.device) -> torch.dtype:
    """float32 on the CPU; on an accelerator the checkpoint's own dtype (``raw``: its config.json; bf16 saves stay
    bf16)."""
    if torch.device(device).type == "cpu":
        return torch.float32
    name = raw.get("dtype") or raw.get("torch_dtype") or raw.get("text_config", {}).get("dtype") or "float32"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name), torch.float32)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    mask_token_id_override: int | None = None) -> ModelBundle:
    """``dtype`` None: ``default_dtype``. ``mask_token_id_override``: use this embedding row as [MASK] instead of the
    checkpoint's (no token is added)."""
    folder = Path(path)
    if not (folder / "config.json").exists() and (folder / "checkpoints" / LATEST_POINTER).is_file():
        folder = latest_checkpoint(folder)  # a training run's folder: its newest checkpoint
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder (expected config.json + *.safetensors)")
    raw, config = _read_config(folder)
    meta = _read_meta(folder, raw)
    _check_weights(folder)
    dtype = dtype or default_dtype(raw, device)
    if not (folder / "preprocessor_config.json").is_file():
        raise CheckpointError(f"{folder}: no preprocessor_config.json (the image processor)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: cannot load tokenizer / image processor ({exc})") from exc
    if raw.get("model_type") == WAM_DIFF2_MODEL_TYPE:
        low, high = WAM_DIFF2_PIXELS
        image_processor.size = {"shortest_edge": low, "longest_edge": high}
        log.info("%s: WAM-Diff2 layout: images resized to %d..%d pixels as its inference does", folder, low, high)
    try:
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            str(folder),
            config=config,
            dtype=dtype,
            use_safetensors=True,
            trust_remote_code=False,
            key_mapping=_KEY_MAPPING,
            attn_implementation="sdpa",
        )
    except Exception as exc:
        raise CheckpointError(f"{folder}: cannot load the weights ({exc})") from exc
    model.to(device).eval()
    mask_id = resolve_mask_id(model, tokenizer, meta, str(folder), mask_token_id_override)
    return _bundle(model, tokenizer, image_processor, meta, mask_id, str(folder))


def _bundle(model, tokenizer, image_processor, meta: DecodeMeta, mask_id: int, source: str) -> ModelBundle:
    eos = tokenizer.convert_tokens_to_ids(fmt.CHAT_END)
    if eos is None or eos == tokenizer.unk_token_id:
        raise CheckpointError(f"{source}: the tokenizer has no {fmt.CHAT_END} token")
    return ModelBundle(model, tokenizer, image_processor, meta, mask_id, eos, source)


def tiny_random(
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    meta: DecodeMeta | None = None,
    hidden: int = 128,
    layers: int = 4,
    vision_hidden: int = 64,
    vision_depth: int = 2,
) -> ModelBundle:
    """The package's tiny default: random weights (seeded), offline tokenizer and image processor."""
    from wamdiff_ros import tiny

    tokenizer = copy.deepcopy(tiny.tiny_tokenizer())
    config = tiny.tiny_config(tokenizer, hidden=hidden, layers=layers, vision_hidden=vision_hidden,
                              vision_depth=vision_depth)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    model.to(device=device, dtype=dtype).eval()
    meta = meta or DecodeMeta()
    mask_id = resolve_mask_id(model, tokenizer, meta, TINY_RANDOM)
    return _bundle(model, tokenizer, tiny.tiny_image_processor(), meta, mask_id, TINY_RANDOM)


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
         mask_token_id: int | None = None) -> ModelBundle:
    """``path``: a checkpoint folder (this package's, WAM-Diff2's or Qwen3-VL's layout), a training run's folder (its
    latest checkpoint), a packaged model's name (``wamdiff-tiny``) or ``tiny-random``. ``dtype`` None: float32 on the
    CPU, the checkpoint's own on an accelerator. ``mask_token_id``: override the checkpoint's [MASK] id."""
    if str(path) == TINY_RANDOM:
        bundle = tiny_random(device=device, dtype=dtype or torch.float32)
        if mask_token_id is not None:
            bundle.mask_token_id = resolve_mask_id(bundle.model, bundle.tokenizer, bundle.meta, TINY_RANDOM,
                                                   mask_token_id)
        return bundle
    return load_checkpoint(resolve(path), device=device, dtype=dtype, mask_token_id_override=mask_token_id)
