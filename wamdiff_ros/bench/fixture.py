"""Checkpoint folders in the real layouts, with random weights: WAM-Diff2's save and Qwen3-VL-2B-Instruct's.

``wamdiff-bench fixture --layout wam_diff2|qwen3_vl --size small|2b --out DIR`` writes one. What is real (facts in
docs/checkpoints.md): config.json's keys and model types, in the transformers-4.57 form both projects write
(``rope_theta`` + ``rope_scaling`` with ``mrope_section``), the safetensors key names (``model.language_model.*``,
``model.visual.*``, no ``lm_head.weight``: tied), an index file when the weights are sharded, bf16 weights, Qwen's
token ids (a byte-level BPE of 151,643 ids, then its 26 added tokens at 151643-151668, 151,936 embedding rows, so
WAM-Diff2's mask id 151671 is a row no string names) and Qwen3-VL's processor config. What is not: the weights
(seeded random) and the BPE's merges (generated, not Qwen's; Qwen's pre-tokenizer, so digits split one per token).
``small`` keeps the real vocabulary and ids at a tiny width, for CI; ``2b`` has Qwen3-VL-2B's dimensions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration

LAYOUTS = ("wam_diff2", "qwen3_vl")
SIZES = ("small", "2b")
BPE_IDS = 151_643
VOCAB_ROWS = 151_936
# Qwen's added tokens in id order from 151643 (special: True for the first 14)
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>",
)
SPECIAL_ADDED = 14
QWEN_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3-VL's chat template, for one user turn of text and images (the part a planning prompt uses)
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}{{ item['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
PREPROCESSOR = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}
DIMENSIONS = {  # (text, vision)
    "2b": (dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                intermediate_size=6144),
           dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                deepstack_visual_indexes=[5, 11, 17])),
    "small": (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                   intermediate_size=128),
              dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, deepstack_visual_indexes=[0])),
}


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with Qwen's id layout: 151,643 BPE ids, then Qwen's 26 added tokens; eos ``<|im_end|>``, pad
    ``<|endoftext|>``, no bos, Qwen3-VL's chat template."""
    alphabet = sorted(ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    pairs = ((a, b) for a in alphabet for b in alphabet)
    for a, b in pairs:
        if len(vocab) >= 256 * 257:
            break
        vocab[a + b], _ = len(vocab), merges.append((a, b))
    firsts = [t for t in vocab if len(t) == 2]
    for ab in firsts:
        for c in alphabet:
            if len(vocab) == BPE_IDS:
                break
            vocab[ab + c], _ = len(vocab), merges.append((ab, c))
        if len(vocab) == BPE_IDS:
            break
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_TOKENS[:SPECIAL_ADDED]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS[SPECIAL_ADDED:]])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=262144)
    fast.eos_token, fast.pad_token = "<|im_end|>", "<|endoftext|>"
    fast.chat_template = CHAT_TEMPLATE
    ids = fast.convert_tokens_to_ids(list(ADDED_TOKENS))
    if ids != list(range(BPE_IDS, BPE_IDS + len(ADDED_TOKENS))):
        raise RuntimeError(f"added tokens landed at {ids[:3]}..., not at {BPE_IDS}")
    return fast


def qwen_config(size: str) -> dict:
    """Qwen3-VL-2B-Instruct's config.json (transformers 4.57 form) at ``size``'s dimensions."""
    text, vision = DIMENSIONS[size]
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": VOCAB_ROWS, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "rope_theta": 5000000, "attention_bias": False, "attention_dropout": 0.0,
            "hidden_act": "silu", "initializer_range": 0.02, "bos_token_id": 151643, "eos_token_id": 151645,
            "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, **text,
        },
        "vision_config": {
            "model_type": "qwen3_vl", "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "in_channels": 3, "out_hidden_size": text["hidden_size"], "num_position_embeddings": 2304,
            "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02, **vision,
        },
    }


def wam_diff2_config(size: str) -> dict:
    """What WAM-Diff2's update_checkpoint_metadata writes over the base config: its model types, nothing else
    (no block size, no mask id)."""
    config = qwen_config(size)
    config.update(model_type="wam_diff2", architectures=["WAMDiff2ForConditionalGeneration"])
    config["text_config"]["model_type"] = "wam_diff2_text"
    config["vision_config"]["model_type"] = "wam_diff2"
    return config


def _rope_for_mrope(config: dict) -> dict:
    """The 2b head_dim 128 takes Qwen's [24, 20, 20]; a smaller head the same proportions (sum = head_dim / 2)."""
    text = config["text_config"]
    half = text["head_dim"] // 2
    if half != 64:
        a = half * 24 // 64
        b = (half - a) // 2
        text["rope_scaling"]["mrope_section"] = [a, b, half - a - b]
    return config


def _configs(layout: str, size: str) -> tuple[dict, Qwen3VLConfig]:
    """The layout's own config.json and the transformers config it loads as."""
    raw = _rope_for_mrope(wam_diff2_config(size) if layout == "wam_diff2" else qwen_config(size))
    base = json.loads(json.dumps(raw))
    base.update(model_type="qwen3_vl")
    base["text_config"]["model_type"], base["vision_config"]["model_type"] = "qwen3_vl_text", "qwen3_vl_vision"
    base.pop("architectures")
    return raw, Qwen3VLConfig.from_dict(base)


def write_fixture(out: str | Path, layout: str, size: str = "small", seed: int = 0,
                  max_shard_size: str | None = None) -> Path:
    """Write a ``layout`` folder at ``size`` into ``out``; ``max_shard_size`` (e.g. "20MB") shards the weights with
    an index file (WAM-Diff2 shards above 5 GiB)."""
    if layout not in LAYOUTS or size not in SIZES:
        raise ValueError(f"layout {layout!r} / size {size!r}: expected one of {LAYOUTS} / {SIZES}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    raw, config = _configs(layout, size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if size == "2b":  # 2B random weights without a float32 copy: built on the meta device, made in bf16
            with torch.device("meta"):
                model = Qwen3VLForConditionalGeneration(config)
            model = model.to(torch.bfloat16).to_empty(device="cpu")
            model.tie_weights()  # to_empty gives the tied head a storage of its own
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(std=0.02)
        else:
            model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True, max_shard_size=max_shard_size or "50GB")
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")  # the layout's own config.json
    (folder / "generation_config.json").unlink(missing_ok=True)
    bpe_tokenizer().save_pretrained(str(folder))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench fixture", description=__doc__.splitlines()[0])
    p.add_argument("--layout", choices=LAYOUTS, required=True)
    p.add_argument("--size", choices=SIZES, default="small")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shard-size", default=None, help="shard the weights (e.g. 2GB) and write the index file")
    args = p.parse_args(argv)
    folder = write_fixture(args.out, args.layout, args.size, args.seed, args.max_shard_size)
    files = sorted(f.name for f in folder.iterdir())
    print(f"wrote {folder}: {', '.join(files)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
