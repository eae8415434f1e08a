"""Block-diffusion decoding on a ``GraphRunner`` (``graphs.py``): the product's decode loop.

Per block: B [MASK] tokens, denoised in place against the cached prefix for at most T steps (``unmask.py`` fixes
some masked positions at each step; leftovers take their last prediction); the finished block is committed by the
next block's first step. One host sync per block (the EOS check; none with ``ignore_eos``), one every
``check_every`` steps under the threshold rule ("any mask left?": a step with nothing left to fix changes nothing, it
only costs its forward, which is counted), and one at the end. With the static schedule the step count is known up
front. The host loop with step traces and the free-width grammar is ``host.py``.

Anytime: with a ``deadline`` (a ``time.perf_counter()`` value) the host stops refining when it passes, between two
steps. The answer is then the best so far: the tokens fixed by then, the cut block's masks its last step's
predictions, and every later position one forward's argmax (``GraphRunner.fill``: the cut block committed and all the
rest as one block of masks, under the grammar when the runner has one). It is flagged ``anytime``.

Reflection: with a ``PlanCheck`` (``reflect.py``) a drafted plan that fails the checker is repaired in place before
the answer is cut at EOS (the runner must keep candidates: ``GraphRunner(candidates=k)``); an anytime answer is not.
"""

from __future__ import annotations

import time

import torch

from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.reflect import Draft, PlanCheck, reflect
from wamdiff_ros.decoding.settings import DecodeResult, DecodeSettings
from wamdiff_ros.decoding.unmask import tokens_per_step


@torch.inference_mode()
def decode_blocks(runner: GraphRunner, settings: DecodeSettings, eos_id: int, ignore_eos: bool = False,
                  deadline: float | None = None, check: PlanCheck | None = None, rounds: int = 0) -> DecodeResult:
    """Block decoding after the runner's engine was prefilled, constrained by the runner's grammar mask if it has one
    (``set_grammar``). ``deadline`` (``time.perf_counter()``): past it the answer is the best so far (the module's
    "Anytime"), flagged ``anytime``. ``check`` and ``rounds``: reflection (the module's "Reflection")."""
    engine = runner.engine
    runner.set_unmask(settings.schedule, settings.steps, settings.threshold)
    calls_before, prefix = engine.forward_calls, engine.length
    keep = check is not None and rounds > 0
    if keep and not runner.candidates:
        raise ValueError("reflection needs a runner that keeps candidates (GraphRunner(candidates=k))")
    blocks, confs, cands, steps_per_block = [], [], [], []
    produced, pending, anytime = 0, None, False
    while produced < settings.max_new_tokens:
        if deadline is not None and time.perf_counter() >= deadline:
            block, conf = runner.fill(pending, produced, settings.max_new_tokens - produced)
            blocks.append(block)
            confs.append(conf)
            anytime = True
            break
        n = min(settings.block_size, settings.max_new_tokens - produced)
        steps_per_block.append(denoise_block(runner, n, settings, produced, pending, deadline))
        if deadline is not None and time.perf_counter() >= deadline and runner.masks_left():
            anytime = True  # cut inside the block: its masks take the last step's argmax
        block, conf = runner.finish_block()
        blocks.append(block)
        confs.append(conf)
        if keep:
            cands.append(tuple(c.clone() for c in runner.block_candidates()))
        produced += n
        if not ignore_eos and bool((block == eos_id).any()):
            break
        pending = block
    tokens, confidence = torch.cat(blocks).tolist(), torch.cat(confs).tolist()
    reflection = None
    if keep and not anytime:
        draft = Draft(tokens, confidence, torch.cat([c[0] for c in cands]).tolist(),
                      torch.cat([c[1] for c in cands]).tolist(), [int(b.shape[0]) for b in blocks], prefix)
        reflection = reflect(runner, draft, check, rounds, settings.steps, deadline)
        tokens, confidence = draft.tokens, draft.confidence
    if not ignore_eos and eos_id in tokens:
        cut = tokens.index(eos_id) + 1
        tokens, confidence = tokens[:cut], confidence[:cut]
    return DecodeResult(tokens, confidence, engine.forward_calls - calls_before, steps_per_block, anytime,
                        reflection)


def denoise_block(runner: GraphRunner, n: int, settings: DecodeSettings, offset: int, clean: torch.Tensor | None,
                  deadline: float | None) -> int:
    """Denoise one block of ``n`` masks, ``offset`` answer tokens in, its first step committing ``clean``; returns
    the steps run. The host looks at the block every ``check_every`` steps under the threshold rule: the one host
    sync a step may have. Past ``deadline`` no further step starts."""
    static = settings.schedule == "static"
    total = len(tokens_per_step(n, settings.steps)) if static else settings.steps
    runner.start_block(n, offset, clean)
    runner.step()
    steps = 1
    while steps < total:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        if not static and steps % runner.check_every == 0 and not runner.masks_left():
            break
        runner.step()
        steps += 1
    return steps
