"""Scale check: a random model with Qwen3-VL-2B dimensions (anchors section 4) prefills and decodes one block."""

import time

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.generate import generate
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import DecodeMeta, ModelBundle, ensure_mask_token
from wamdiff_ros.tiny import tiny_image_processor, tiny_tokenizer, two_b_config


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_b_dimension_model_decodes_one_block():
    from transformers import Qwen3VLForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = two_b_config(tokenizer)
    config._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        model = Qwen3VLForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    params = sum(p.numel() for p in model.parameters())
    assert 2.0e9 < params < 2.3e9
    text = model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        2048, 28, 16, 8)
    build_s = time.perf_counter() - t0
    mask_id = ensure_mask_token(model, tokenizer, "<|mask|>")
    bundle = ModelBundle(model, tokenizer, tiny_image_processor(), DecodeMeta(), mask_id,
                         tokenizer.convert_tokens_to_ids(fmt.CHAT_END), "qwen3-vl-2b-dims-random")
    image = np.random.default_rng(0).integers(0, 256, (128, 256, 3), dtype=np.uint8)
    prompt = encode_prompt(bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.0, 0.0), (0.0, 0.0)), image)
    settings = DecodeSettings(block_size=32, steps=4, schedule="static", max_new_tokens=32)
    g = generate(bundle, prompt, settings, ignore_eos=True)
    assert g.result.new_tokens == 32 and g.result.forward_calls == 4  # 4 steps, no commit after the last block
    assert len(set(g.result.tokens)) > 1 and mask_id not in g.result.tokens
    print(f"\n2B-dimension model: {params / 1e9:.2f} B params, built in {build_s:.0f} s; prompt {prompt.length} "
          f"tokens; vision {g.vision_s:.2f} s, prefill {g.prefill_s:.2f} s, one block of 32 tokens in "
          f"{g.decode_s:.2f} s ({g.result.forward_calls} forwards)")
