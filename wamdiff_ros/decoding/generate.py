"""One entry point: prompt tensors + settings -> answer tokens, with per-stage timings.

``attention`` names the engine's attention backend (``attention.py``); a ``GraphRunner`` (``graphs.py``) brings its
own engine and captured graphs, reused across calls. Block decoding runs on the runner (``block.py``: the graph path;
eagerly on the CPU) unless a step trace is asked for, or a constraint comes without its per-position ``grammar`` mask
(WAM-Diff2's free width): then the host loop (``host.py``). Constrained AR decoding is the host loop too (``ar.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wamdiff_ros.decoding.ar import decode_ar, decode_ar_host
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.host import CachedBackend, StepTrace, decode_blocks_host
from wamdiff_ros.decoding.reflect import PlanCheck
from wamdiff_ros.decoding.settings import DecodeResult, DecodeSettings
from wamdiff_ros.inputs import PromptInputs
from wamdiff_ros.model import ModelBundle

MODES = ("auto", "ar", "block")


@dataclass(slots=True)
class Generation:
    result: DecodeResult
    mode: str  # "ar" or "block"
    vision_s: float
    prefill_s: float
    decode_s: float


def resolve_mode(bundle: ModelBundle, settings: DecodeSettings, mode: str = "auto") -> str:
    """auto: the checkpoint's own convention (next_token -> AR, in_place -> blocks), after checking B against it."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if mode == "auto":
        bundle.meta.check_block_size(settings.block_size)
        return "ar" if bundle.meta.prediction == "next_token" else "block"
    return mode


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(
    bundle: ModelBundle,
    prompt: PromptInputs,
    settings: DecodeSettings,
    constraint: WaypointConstraint | None = None,
    mode: str = "auto",
    ignore_eos: bool = False,
    on_step: Callable[[StepTrace], None] | None = None,
    attention: str = "sdpa",
    runner: GraphRunner | None = None,
    grammar: torch.Tensor | None = None,
    deadline: float | None = None,
    check: PlanCheck | None = None,
    reflect_rounds: int = 0,
) -> Generation:
    """``grammar``: ``constraint`` as a per-position allowed-token mask (``grammar_mask.grammar_mask``), which lets
    a constrained plan decode on the runner. ``deadline`` (``time.perf_counter()``): block decoding on the runner
    answers its best so far once it passes (``block``'s "Anytime"); the other paths run to the end. ``check`` and
    ``reflect_rounds``: block decoding (on the runner, or the host loop without a step trace) repairs a draft that
    fails the plan checker (``reflect.py``); AR decoding leaves the check to the caller."""
    mode = resolve_mode(bundle, settings, mode)
    model, device = bundle.model, bundle.device
    t0 = time.perf_counter()
    if prompt.pixel_values is not None:
        vision = model.model.get_image_features(prompt.pixel_values, prompt.image_grid_thw, return_dict=True)
        prompt = PromptInputs(prompt.input_ids, prompt.mm_token_type_ids, None, prompt.image_grid_thw, vision)
    _sync(device)
    t1 = time.perf_counter()
    needed = prompt.length + settings.max_new_tokens + settings.block_size
    if runner is None:
        engine = DecoderEngine(model, needed, attention)
    elif needed > runner.engine.capacity:
        raise ValueError(f"the runner's cache holds {runner.engine.capacity} tokens, this plan needs {needed}")
    else:
        engine = runner.engine
    first_logits = engine.prefill(prompt, bundle.meta.prompt_block_size)
    _sync(device)
    t2 = time.perf_counter()
    on_runner = runner is not None and on_step is None and (constraint is None or grammar is not None)
    if on_runner:
        runner.set_grammar(grammar if constraint is not None else None)
    if mode == "ar" and on_runner and constraint is None and runner.use_graphs and runner.ar_supported:
        result = decode_ar(runner, first_logits, settings.max_new_tokens, bundle.eos_token_id, ignore_eos)
    elif mode == "ar":
        result = decode_ar_host(engine, first_logits, settings.max_new_tokens, bundle.eos_token_id, constraint,
                                ignore_eos)
    elif on_runner:
        result = decode_blocks(runner, settings, bundle.eos_token_id, ignore_eos, deadline, check, reflect_rounds)
    else:
        result = decode_blocks_host(
            CachedBackend(engine), settings, bundle.mask_token_id, bundle.eos_token_id, constraint, ignore_eos, on_step,
            check if on_step is None else None, reflect_rounds)
    _sync(device)
    t3 = time.perf_counter()
    return Generation(result, mode, t1 - t0, t2 - t1, t3 - t2)
