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
        lines.append(fmt.format_waypoints(np.array([[rng.uniform(0, 60), rng.uniform(-8, 8)] for _ in range(8)])))
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


def tiny_config(tokenizer: PreTrainedTokenizerFast, hidden: int = 128, layers: int = 4) -> Qwen3VLConfig:
    head_dim = 32
    ids = tokenizer.convert_tokens_to_ids
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=hidden // head_dim,
            num_key_value_heads=max(1, hidden // head_dim // 2),
            head_dim=head_dim,
            max_position_embeddings=4096,
            rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[6, 5, 5], mrope_interleaved=True),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=hidden,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        eos_token_id=ids(EOS_TOKEN),
        pad_token_id=ids(EOS_TOKEN),
        tie_word_embeddings=True,
    )


def two_b_config(vocab_size: int = 151_936) -> Qwen3VLConfig:
    """Qwen3-VL-2B dimensions (anchors section 4), for the slow scale test."""
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=262_144,
            rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[24, 20, 20], mrope_interleaved=True),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=2048,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[5, 11, 17],
        ),
        tie_word_embeddings=True,
    )
