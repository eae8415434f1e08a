"""Tiny Qwen3-VL configs and an offline tokenizer, for tests and the package's default model."""

from __future__ import annotations

import functools
import random

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3VLConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from wamdiff_ros import format as fmt

EOS_TOKEN = "<|im_end|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    EOS_TOKEN,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    MASK_TOKEN,
]
TINY_VOCAB = 1024


def _corpus(seed: int = 0, n: int = 400) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        cmd = list(fmt.Command)[i % len(fmt.Command)]
        vel = (rng.uniform(-2, 30), rng.uniform(-2, 2))
        acc = (rng.uniform(-5, 5), rng.uniform(-2, 2))
        lines.append(fmt.plan_prompt(cmd, vel, acc))
        wp = np.array([[rng.uniform(0, 60), rng.uniform(-8, 8)] for _ in range(8)])
        lines.append(fmt.format_waypoints(wp, version=1))  # version 1: the tokenizer stays the one models shipped with
    lines += [
        fmt.detect_prompt(),
        fmt.ask_prompt("Is the lane to the left free?"),
        "car:120,340,260,480;truck:500,300,700,520",
        "The lead vehicle is 23 metres ahead in the same lane. A lane change to the left is free.",
        "The command asks to turn right at the next junction, so the vehicle should slow down and yield.",
    ]
    return lines


def build_tokenizer(vocab_size: int = TINY_VOCAB) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained offline on format-shaped text; digits and punctuation are split one per token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, MASK_TOKEN)],
    )


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def tiny_image_processor(max_pixels: int = 256 * 128) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=64 * 64, max_pixels=max_pixels
    )


def qwen3_vl_config(
    tokenizer: PreTrainedTokenizerFast, *, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int,
    head_dim: int, mrope_section: list[int], vision_depth: int, vision_hidden: int, vision_ffn: int,
    vision_heads: int, vision_grid: int, deepstack: list[int], vocab_size: int | None = None,
) -> Qwen3VLConfig:
    """A Qwen3-VL config whose special-token ids are ``tokenizer``'s (patch 16, merge 2, tied embeddings)."""
    ids = tokenizer.convert_tokens_to_ids
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab_size or len(tokenizer),
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=262_144,
            rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=mrope_section,
                                 mrope_interleaved=True),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=vision_hidden,
            intermediate_size=vision_ffn,
            num_heads=vision_heads,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=hidden,
            num_position_embeddings=vision_grid * vision_grid,
            deepstack_visual_indexes=deepstack,
        ),
        image_token_id=ids(fmt.IMAGE_PAD),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids(fmt.VISION_START),
        vision_end_token_id=ids(fmt.VISION_END),
        eos_token_id=ids(EOS_TOKEN),
        pad_token_id=ids(EOS_TOKEN),
        tie_word_embeddings=True,
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast, hidden: int = 128, layers: int = 4, vision_hidden: int = 64,
                vision_depth: int = 2) -> Qwen3VLConfig:
    """Text decoder ``hidden`` x ``layers`` (head dim 32); vision tower ``vision_hidden`` x ``vision_depth`` (head
    dim 32, deepstack from its first layer)."""
    heads = hidden // 32
    return qwen3_vl_config(
        tokenizer, hidden=hidden, ffn=2 * hidden, layers=layers, heads=heads, kv_heads=max(1, heads // 2),
        head_dim=32, mrope_section=[6, 5, 5], vision_depth=vision_depth, vision_hidden=vision_hidden,
        vision_ffn=2 * vision_hidden, vision_heads=max(1, vision_hidden // 32), vision_grid=8, deepstack=[0],
    )


def two_b_config(tokenizer: PreTrainedTokenizerFast, vocab_size: int = 151_936) -> Qwen3VLConfig:
    """Qwen3-VL-2B dimensions (anchors section 4) around ``tokenizer``'s special tokens, for the scale test."""
    return qwen3_vl_config(
        tokenizer, hidden=2048, ffn=6144, layers=28, heads=16, kv_heads=8, head_dim=128,
        mrope_section=[24, 20, 20], vision_depth=24, vision_hidden=1024, vision_ffn=4096, vision_heads=16,
        vision_grid=48, deepstack=[5, 11, 17], vocab_size=vocab_size,
    )
