"""Checkpoint folders (Qwen3-VL / WAM-Diff2 layout) and the tiny random default -> a loaded model bundle.

A checkpoint folder holds config.json, *.safetensors (pickle weights are refused), a tokenizer and
preprocessor_config.json; ``wamdiff.json`` carries the decode metadata (see ``DecodeMeta``).
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model_names import DEFAULT_MODEL, TINY_RANDOM, resolve  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

META_FILE = "wamdiff.json"
PREDICTIONS = ("in_place", "next_token")
PROMPT_ATTENTION = ("causal", "block_causal")
DEFAULT_MASK_TOKEN = "<|mask|>"

# WAM-Diff2 ships renamed copies of the Qwen3-VL classes with the same weight names.
_RENAMED_MODEL_TYPES = {"wam_diff2": "qwen3_vl", "qwen3_vl_uniform": "qwen3_vl"}
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


def _read_config(folder: Path) -> Qwen3VLConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json; expected a Qwen3-VL / WAM-Diff2 checkpoint folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable config ({exc})") from exc
    model_type = raw.get("model_type")
    model_type = _RENAMED_MODEL_TYPES.get(model_type, model_type)
    if model_type != "qwen3_vl":
        raise CheckpointError(
            f"{path}: model_type {raw.get('model_type')!r} is not a Qwen3-VL checkpoint "
            f"(accepted: qwen3_vl, {', '.join(_RENAMED_MODEL_TYPES)})"
        )
    raw = copy.deepcopy(raw)
    raw["model_type"] = "qwen3_vl"
    raw["architectures"] = ["Qwen3VLForConditionalGeneration"]
    for key, sub_type in _RENAMED_SUB_TYPES.items():
        if isinstance(raw.get(key), dict):
            raw[key]["model_type"] = sub_type
    raw.pop("auto_map", None)  # never follow remote code
    return Qwen3VLConfig.from_dict(raw)


def _read_meta(folder: Path, config: Qwen3VLConfig) -> DecodeMeta:
    path = folder / META_FILE
    if path.is_file():
        try:
            return DecodeMeta(**json.loads(path.read_text()))
        except (TypeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: bad decode metadata ({exc})") from exc
    block = getattr(config, "block_size", None)
    if block:  # a WAM-Diff2 config without our metadata file: the paper's free-width answers
        return DecodeMeta(trained_block_size=int(block), prompt_attention="block_causal", format_version=1,
                          route_points=False)
    log.warning("%s has no %s: treating it as an autoregressive Qwen3-VL model", folder, META_FILE)
    return DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal", format_version=1,
                      route_points=False)


def _check_weights(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found pickle weights {pickles}; convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{folder}: no *.safetensors weights{hint}")
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                keys = list(f.keys())
                if keys:
                    f.get_slice(keys[-1])
            if path.stat().st_size < 8:
                raise ValueError("file too short")
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise CheckpointError(f"{path}: corrupt safetensors file ({exc})") from exc
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


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> ModelBundle:
    folder = Path(path)
    if not (folder / "config.json").exists() and (folder / "checkpoints" / LATEST_POINTER).is_file():
        folder = latest_checkpoint(folder)  # a training run's folder: its newest checkpoint
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder (expected config.json + *.safetensors)")
    config = _read_config(folder)
    meta = _read_meta(folder, config)
    _check_weights(folder)
    if not (folder / "preprocessor_config.json").is_file():
        raise CheckpointError(f"{folder}: no preprocessor_config.json (the image processor)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: cannot load tokenizer / image processor ({exc})") from exc
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
    mask_id = ensure_mask_token(model, tokenizer, meta.mask_token)
    return _bundle(model, tokenizer, image_processor, meta, mask_id, str(folder))


def _bundle(model, tokenizer, image_processor, meta: DecodeMeta, mask_id: int, source: str) -> ModelBundle:
    eos = tokenizer.convert_tokens_to_ids(fmt.CHAT_END)
    if eos is None or eos == tokenizer.unk_token_id:
        raise CheckpointError(f"{source}: the tokenizer has no {fmt.CHAT_END} token")
    return ModelBundle(model, tokenizer, image_processor, meta, mask_id, eos, source)


def save_checkpoint(bundle: ModelBundle, path: str | Path) -> Path:
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    bundle.model.save_pretrained(str(folder), safe_serialization=True)
    bundle.tokenizer.save_pretrained(str(folder))
    bundle.image_processor.save_pretrained(str(folder))
    (folder / META_FILE).write_text(json.dumps(asdict(bundle.meta), indent=2) + "\n")
    return folder


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
    mask_id = ensure_mask_token(model, tokenizer, meta.mask_token)
    return _bundle(model, tokenizer, tiny.tiny_image_processor(), meta, mask_id, TINY_RANDOM)


def load(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> ModelBundle:
    """``path``: a checkpoint folder, a training run's folder (its latest checkpoint), a packaged model's name
    (``wamdiff-tiny``) or ``tiny-random``."""
    if str(path) == TINY_RANDOM:
        return tiny_random(device=device, dtype=dtype)
    return load_checkpoint(resolve(path), device=device, dtype=dtype)
