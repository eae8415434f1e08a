"""The contenders of ``wamdiff-bench plan``, one plan at a time, in this process or as a worker over a checkout.

``Contenders`` loads a model once and plans with it on request: ``ar`` (``Planner.plan``, decoded next-token),
``block`` (``Planner.plan`` with blocks: the planner's path, its engine and ``GraphRunner``) and ``host`` (the same
plan through the host loop, ``decode_blocks_host`` on the block planner's own engine: ``generate`` with a step trace,
which is how it chooses that loop). Each plan reports its wall time, the minor page faults the process took during it
(``getrusage``), its forward calls and tokens, and where the time went: the prompt and image preprocessing
(``encode_prompt``, timed by wrapping the planner's reference to it), vision, prefill and decode (``PlanStats``).

Run as a script (``python plan_contenders.py TREE``), it serves one JSON request per line on stdin with
``wamdiff_ros`` imported from the checkout ``TREE``: that is how ``wamdiff-bench plan --baseline-worktree`` times
another commit's code beside this one, plan by plan. So this file uses only what both sides have (``Planner``,
``DecodeSettings``, ``generate``, ``encode_prompt``, the planner's runner) and is never imported by the worker through
the package.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sys
import time

CONTENDERS = ("ar", "block", "host")
GRAMMAR_CHOICES = ("auto", "on", "off")
RANDOM_2B = "random-2b"  # ``gpu.build_bundle``: Qwen3-VL-2B dimensions, random bf16 weights, built in memory


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _no_trace(_step) -> None:
    """A step trace that keeps nothing: ``generate`` then decodes blocks on the host loop."""


class Contenders:
    def __init__(self, model: str, device: str = "cpu", dtype: str = "auto", names: tuple[str, ...] = CONTENDERS,
                 grammar: str = "auto", threads: int = 0) -> None:
        import numpy as np
        import torch

        import wamdiff_ros.planner as planner_module
        from wamdiff_ros.cli import load_rgb, sample_image_path
        from wamdiff_ros.decoding.settings import DecodeSettings
        from wamdiff_ros.model import load, torch_dtype
        from wamdiff_ros.planner import EgoState, Planner

        if grammar not in GRAMMAR_CHOICES:
            raise ValueError(f"grammar {grammar!r} is not one of {GRAMMAR_CHOICES}")
        unknown = set(names) - set(CONTENDERS)
        if unknown:
            raise ValueError(f"unknown contenders {sorted(unknown)}: expected some of {CONTENDERS}")
        if threads:
            torch.set_num_threads(threads)
        self.torch, self.device = torch, device
        if model == RANDOM_2B:
            from wamdiff_ros.bench.gpu import build_bundle

            bundle = build_bundle(False, torch.device(device))
        else:
            bundle = load(model, device=device, dtype=torch_dtype(dtype))
        self.bundle = bundle
        fields = {f.name for f in dataclasses.fields(DecodeSettings)}
        common = {"reflect": False} if "reflect" in fields else {}  # a newer feature, off on both sides
        block_size = min(DecodeSettings().block_size, bundle.meta.trained_block_size)
        block = Planner(bundle, DecodeSettings(block_size=block_size, constrain=grammar != "off", **common))
        in_step = block._grammar is not None  # the grammar can run inside the runner's step (fixed width)
        if grammar == "auto" and not in_step:  # WAM-Diff2's free width keeps the grammar on the host loop
            block = Planner(bundle, DecodeSettings(block_size=block_size, constrain=False, **common))
        self.grammar = "off" if block._constraint is None else "in the step" if in_step else "on the host"
        ar = Planner(bundle, DecodeSettings(block_size=1, constrain=block._constraint is not None, **common))
        ar.decode_mode = "ar"
        self.planners = {"ar": ar, "block": block, "host": block}
        self.names = tuple(names)
        self.image, self.ego = load_rgb(sample_image_path()), EgoState((6.0, 0.0))
        self.route = np.array([[10.0, 0.0], [30.0, 0.0]])
        self._prep_s = 0.0
        encode = planner_module.encode_prompt

        def timed_encode(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return encode(*args, **kwargs)
            finally:
                self._prep_s += time.perf_counter() - t0

        self._restore = lambda: setattr(planner_module, "encode_prompt", encode)
        planner_module.encode_prompt = self._encode = timed_encode
        import wamdiff_ros

        self.info = {
            "model": bundle.source, "device": device, "dtype": str(bundle.model.dtype), "grammar": self.grammar,
            "block_size": block_size, "torch_threads": torch.get_num_threads(), "package": wamdiff_ros.__file__,
            "vocab": int(bundle.model.get_output_embeddings().weight.shape[0]),
            "decode_path": {"ar": ar.backend, "block": block.backend, "host": "decode_blocks_host (CachedBackend)"},
        }

    def close(self) -> None:
        """Give the planner module its own ``encode_prompt`` back."""
        self._restore()

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _host_plan(self):
        """``Planner.plan``'s work with the block loop on the host: the prompt, ``generate`` on the planner's engine
        (a step trace makes it take ``decode_blocks_host``), the text and its parse."""
        from wamdiff_ros import format as fmt
        from wamdiff_ros.decoding.generate import generate

        planner = self.planners["host"]
        bundle, s = planner.bundle, planner.settings
        route = self.route if bundle.meta.route_points else None
        user = fmt.plan_prompt(fmt.Command("follow"), self.ego.velocity, self.ego.acceleration, route)
        prompt = self._encode(bundle, user, self.image)
        runner = planner._runner_for(prompt.length + s.max_new_tokens + s.block_size)
        generation = generate(bundle, prompt, s, planner._constraint, runner=runner, on_step=_no_trace)
        tokens = [t for t in generation.result.tokens if t != bundle.eos_token_id]
        text = bundle.tokenizer.decode(tokens, skip_special_tokens=False)
        fmt.parse_waypoints(text)
        r = generation.result
        return text, r.forward_calls, r.new_tokens, generation.vision_s, generation.prefill_s, generation.decode_s

    def plan(self, name: str) -> dict:
        """One plan of contender ``name``: its measurements."""
        torch = self.torch
        with torch.inference_mode():
            self._prep_s = 0.0
            self._sync()
            faults, t0 = _minor_faults(), time.perf_counter()
            if name == "host":
                text, calls, tokens, vision_s, prefill_s, decode_s = self._host_plan()
            else:
                plan = self.planners[name].plan(self.image, self.ego, "follow", route=self.route)
                st = plan.stats
                text, calls, tokens = plan.text, st.forward_calls, st.new_tokens
                vision_s, prefill_s, decode_s = st.vision_s, st.prefill_s, st.decode_s
            self._sync()
            elapsed, faults = time.perf_counter() - t0, _minor_faults() - faults
        return {"ms": 1e3 * elapsed, "minor_faults": faults, "forward_calls": calls, "new_tokens": tokens,
                "preprocess_ms": 1e3 * self._prep_s, "vision_ms": 1e3 * vision_s, "prefill_ms": 1e3 * prefill_s,
                "decode_ms": 1e3 * decode_s, "text": text}


def serve(tree: str) -> int:
    """The worker: requests on stdin, one JSON object a line (``{"op": "setup", ...}`` once, then ``{"op": "plan",
    "name": ...}``), answers on the original stdout; everything else anything prints goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    contenders = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "setup":
                contenders = Contenders(**request["args"])
                answer = {"ok": True, "info": {**contenders.info, "tree": tree}}
            elif request["op"] == "plan":
                answer = {"ok": True, "plan": contenders.plan(request["name"])}
            else:
                return 0
        except Exception as exc:  # reported to the parent, which stops
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.path[0] = os.path.abspath(sys.argv[1])  # the checkout's wamdiff_ros, and not this file's folder
    raise SystemExit(serve(sys.argv[1]))
