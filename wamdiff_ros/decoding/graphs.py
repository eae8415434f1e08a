"""CUDA Graphs for the decode engine: the denoising step per block size (plain, and fused with the previous block's
commit) and the AR decode step, captured over one engine's static buffers into one shared memory pool.

Per block the host plans once (positions, attention metadata) and replays the step T times. The LM head and the
unmask rule are inside the graph: each replay writes the block's tokens, confidences and mask in place, so nothing
reaches the host per step. With the static schedule the step count is known up front; with the threshold rule the
host asks "any mask left?" only every ``check_every`` steps (a step with nothing left to fix changes nothing; it
only costs its forward, which is counted). The AR graph feeds its own greedy token back and advances the positions
in place, so a whole answer is N replays with no host work in between.

Same decisions as ``host.decode_blocks_host`` / ``ar.decode_ar``: the unmask rules are ``unmask.py``'s, and the plan
grammar, where it is a product of per-position sets (``grammar_mask.py``), is an allowed-token mask applied to the
logits inside the step (``set_grammar``; the block's rows are copied into a static buffer once per block). Shapes that
were not captured (a short last block), and everything on a machine without CUDA, run the very same step functions
eagerly, the attention then planned on the engine's eager backend: on the CPU this path computes what the host loop
does, token for token.

Anytime: with a ``deadline`` (a ``time.perf_counter()`` value) the host stops refining when it passes, between two
steps. The answer is then the best so far: the tokens fixed by then, the cut block's masks its last step's
predictions, and every later position one forward's argmax (``fill``: the cut block committed and all the rest as
one block of masks, under the grammar when the runner has one). It is flagged ``anytime``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.settings import DecodeResult, DecodeSettings
from wamdiff_ros.decoding.unmask import SCHEDULES, tokens_per_step, unmask_confident, unmask_top_k

WARMUP_RUNS = 2  # eager runs on a side stream before capture: lazy initialisation stays out of the graph


class GraphRunner:
    """Static unmask buffers and captured graphs over ``engine``; reused across plans (prefill, then decode)."""

    def __init__(self, engine: DecoderEngine, mask_id: int, max_block: int = 64, check_every: int = 2,
                 use_graphs: bool | None = None, pool: tuple | None = None) -> None:
        """``pool``: a ``torch.cuda.graph_pool_handle()`` to share with other runners (their graphs must not run
        concurrently); by default the runner's graphs share a pool of their own."""
        if check_every < 1:
            raise ValueError(f"check_every {check_every} must be >= 1")
        if not engine.graph_attention.graph_safe:
            raise ValueError(f"the engine's graph attention {engine.graph_attention.name!r} is not graph-safe")
        self.engine = engine
        self.mask_id = mask_id
        self.max_block = max_block
        self.check_every = check_every
        self.use_graphs = engine.device.type == "cuda" if use_graphs is None else use_graphs
        dev = engine.device
        self._block = torch.full((max_block,), mask_id, dtype=torch.long, device=dev)
        self._clean = torch.zeros(max_block, dtype=torch.long, device=dev)
        self._masked = torch.ones(max_block, dtype=torch.bool, device=dev)
        self._conf = torch.zeros(max_block, dtype=torch.float32, device=dev)
        self._pred = torch.zeros(max_block, dtype=torch.long, device=dev)
        self._prob = torch.zeros(max_block, dtype=torch.float32, device=dev)
        self._k = torch.zeros(max_block + WARMUP_RUNS + 1, dtype=torch.long, device=dev)  # static: tokens per step
        self._step_index = torch.zeros(1, dtype=torch.long, device=dev)
        self._threshold = torch.tensor(0.9, dtype=torch.float32, device=dev)
        self._no_mask = torch.tensor([mask_id], device=dev)
        self._grammar_source = 0  # data_ptr of the mask ``set_grammar`` last took
        self._forbidden: torch.Tensor | None = None  # (answer positions, V) bool: what the grammar refuses
        self._blocked: torch.Tensor | None = None  # (max_block, V) bool: the current block's rows of it
        self._schedules: dict[tuple[int, int], torch.Tensor] = {}
        self._ar_token = torch.zeros(1, dtype=torch.long, device=dev)
        self._ar_index = torch.zeros(1, dtype=torch.long, device=dev)
        self._ar_tokens = torch.zeros(engine.capacity, dtype=torch.long, device=dev)
        self._ar_conf = torch.zeros(engine.capacity, dtype=torch.float32, device=dev)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = (pool or torch.cuda.graph_pool_handle()) if self.use_graphs else None

    @property
    def captured(self) -> list[tuple]:
        return sorted(self._graphs, key=str)

    @property
    def constrained(self) -> bool:
        return self._forbidden is not None

    def set_grammar(self, mask: torch.Tensor | None) -> None:
        """The plan grammar as a per-position allowed-token mask (``grammar_mask.grammar_mask``), or None to decode
        unconstrained; graphs are captured per setting (the block buffer keeps its address)."""
        if mask is None:
            self._forbidden = None
            return
        if self._forbidden is not None and mask.data_ptr() == self._grammar_source:
            return  # the same mask again (every plan sets it)
        self._grammar_source = mask.data_ptr()
        self._forbidden = ~mask.to(self.engine.device)
        if self._blocked is None or self._blocked.shape[1] != mask.shape[1]:
            self._blocked = torch.zeros(self.max_block, mask.shape[1], dtype=torch.bool, device=self.engine.device)

    @property
    def ar_supported(self) -> bool:
        """The AR graph advances the positions in place; only a backend that needs no host plan per token
        (the static SDPA) follows them."""
        return self.engine.graph_attention.name == "sdpa"

    # -- capture ------------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self, block_sizes: tuple[int, ...] = (), schedules: tuple[str, ...] = ("static",),
                ar: bool = False) -> None:
        """Capture the step graphs (plain and commit-fused) for each block size and schedule, and the AR step.

        Capture writes scratch K/V from the start of the cache, so it runs before a prefill (length 0). A no-op
        when graphs are off (CPU): every step then runs eagerly."""
        if not self.use_graphs:
            return
        engine = self.engine
        if engine.length:
            raise RuntimeError("capture before the prefill: capturing writes scratch K/V at the start of the cache")
        for n in block_sizes:
            if n > self.max_block:
                raise ValueError(f"block size {n} exceeds the runner's max_block {self.max_block}")
            for schedule in schedules:
                if schedule not in SCHEDULES:
                    raise ValueError(f"schedule {schedule!r} is not one of {SCHEDULES}")
                for n_clean in (0, n):
                    engine.plan(n + n_clean, n_clean)
                    self._reset_block(n, schedule, n)
                    self._graphs[(n, n_clean, schedule, self.constrained)] = self._capture(
                        lambda n=n, c=n_clean, s=schedule: self._step(n, c, s))
        if ar:
            if not self.ar_supported:
                raise ValueError(f"the AR graph needs the sdpa backend, not {self.engine.graph_attention.name}")
            engine.plan(1)
            self._graphs[("ar",)] = self._capture(self._ar_step)
        self._reset_block(self.max_block, "static", 1)

    def _capture(self, fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        stream = torch.cuda.Stream(self.engine.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        return graph, out

    def _run(self, key: tuple, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Replay the graph for ``key`` if captured, else run ``fn`` eagerly; returns the step's logits (read them
        before the next replay: graphs share one pool)."""
        captured = self._graphs.get(key)
        if captured is None:
            return fn()
        captured[0].replay()
        return captured[1]

    # -- one denoising step (graph body) ------------------------------------------------------------------------------
    def _step(self, n: int, n_clean: int, schedule: str) -> torch.Tensor:
        block, masked = self._block[:n], self._masked[:n]
        tokens = torch.cat([self._clean[:n_clean], block]) if n_clean else block
        logits = self.engine.run_planned(tokens, n_clean)
        p, pred = self._predict(logits, self._blocked[:n] if self.constrained else None)
        if schedule == "static":
            select = unmask_top_k(p, masked, self._k.index_select(0, self._step_index))
        else:
            select = unmask_confident(p, masked, self._threshold)
        block.copy_(torch.where(select, pred, block))
        self._conf[:n].copy_(torch.where(select, p, self._conf[:n]))
        self._pred[:n].copy_(pred)
        self._prob[:n].copy_(p)
        masked.copy_(masked & ~select)
        self._step_index.add_(1)
        return logits

    def _reset_block(self, n: int, schedule: str, steps: int) -> None:
        self._block[:n].fill_(self.mask_id)
        self._masked[:n].fill_(True)
        self._conf[:n].zero_()
        self._step_index.zero_()
        if schedule == "static":
            key = (n, steps)
            if key not in self._schedules:
                self._schedules[key] = torch.tensor(tokens_per_step(n, steps), device=self.engine.device)
            ks = self._schedules[key]
            self._k[: ks.shape[0]].copy_(ks)

    # -- one block ----------------------------------------------------------------------------------------------------
    def run_block(self, n: int, n_clean: int, settings: DecodeSettings, offset: int = 0,
                  deadline: float | None = None) -> int:
        """Denoise one block of ``n`` masks after a prefill or a finished block of ``n_clean`` tokens (committed by
        the first step), ``offset`` answer tokens in; returns the steps run. The result is read with
        ``block_result``. The host looks at the block every ``check_every`` steps ("any mask left?"): the one host
        sync a step may have. Past ``deadline`` (``time.perf_counter()``) no further step starts."""
        engine = self.engine
        if n > self.max_block:
            raise ValueError(f"block of {n} exceeds the runner's max_block {self.max_block}")
        if n_clean:
            self._clean[:n_clean].copy_(self._block[:n_clean])
        schedule = settings.schedule
        total = len(tokens_per_step(n, settings.steps)) if schedule == "static" else settings.steps
        self._reset_block(n, schedule, settings.steps)
        if self.constrained:
            self._blocked[:n].copy_(self._forbidden[offset:offset + n])
        eager = not self.use_graphs
        engine.plan(n + n_clean, n_clean, eager=eager)
        self._run((n, n_clean, schedule, self.constrained), lambda: self._step(n, n_clean, schedule))
        engine.length += n_clean  # the clean block is committed
        steps = 1
        if steps < total:
            engine.plan(n, eager=eager)
        while steps < total:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            if schedule != "static" and steps % self.check_every == 0 and not bool(self._masked[:n].any()):
                break
            self._run((n, 0, schedule, self.constrained), lambda: self._step(n, 0, schedule))
            steps += 1
        engine.forward_calls += steps
        return steps

    def block_result(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The finished block (leftover masks take their last prediction) and its confidences, on the device; the
        tokens stay in the block buffer as the next block's clean tokens."""
        masked = self._masked[:n]
        block = torch.where(masked, self._pred[:n], self._block[:n])
        conf = torch.where(masked, self._prob[:n], self._conf[:n])
        self._block[:n].copy_(block)
        return block, conf

    @torch.inference_mode()
    def fill(self, n_clean: int, offset: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The anytime answer's rest: one eager forward that commits the finished block's ``n_clean`` tokens and
        predicts ``count`` masks after them (answer positions ``offset`` on) at once, each its argmax (under the
        grammar when set); returns those tokens and their probabilities."""
        engine = self.engine
        masks = torch.full((count,), self.mask_id, dtype=torch.long, device=engine.device)
        tokens = torch.cat([self._block[:n_clean], masks]) if n_clean else masks
        engine.plan(count + n_clean, n_clean, eager=True)
        logits = engine.run_planned(tokens, n_clean)
        engine.length += n_clean
        engine.forward_calls += 1
        p, pred = self._predict(logits, self._forbidden[offset:offset + count] if self.constrained else None)
        return pred, p

    def _predict(self, logits: torch.Tensor, refused: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's most probable token and its probability, with the grammar's ``refused`` (n, V) tokens
        out, or without a grammar [MASK] out (the grammar never allows it)."""
        if refused is not None:
            scores = logits.masked_fill(refused, float("-inf"))
        else:
            scores = logits.index_fill(-1, self._no_mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).max(-1)

    @torch.inference_mode()
    def step_logits(self, n: int, clean: torch.Tensor | None = None, schedule: str = "static") -> torch.Tensor:
        """Logits of one step on a fresh block of ``n`` masks at the engine's length, committing ``clean`` in the
        same forward when given (a block's first step); through the graph when captured. For correctness checks."""
        c = 0 if clean is None else clean.shape[0]
        if c:
            self._clean[:c].copy_(clean)
        self._reset_block(n, schedule, n)
        self.engine.plan(n + c, c)
        logits = self._run((n, c, schedule, self.constrained), lambda: self._step(n, c, schedule)).clone()
        self.engine.length += c
        return logits

    @torch.inference_mode()
    def ar_step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """Logits of one AR forward of ``token`` at the engine's length (committed); through the graph when
        captured. For correctness checks."""
        self._ar_token.copy_(token.view(1))
        self._ar_index.fill_(1)
        self.engine.plan(1)
        logits = self._run(("ar",), self._ar_step).clone()
        self.engine.length += 1
        return logits

    # -- AR -----------------------------------------------------------------------------------------------------------
    def _ar_step(self) -> torch.Tensor:
        logits = self.engine.run_planned(self._ar_token, 0)
        p, token = torch.softmax(logits.float(), dim=-1).max(-1)
        self._ar_token.copy_(token)
        self._ar_tokens.index_copy_(0, self._ar_index, token)
        self._ar_conf.index_copy_(0, self._ar_index, p)
        self._ar_index.add_(1)
        self.engine.positions[:1].add_(1)
        return logits


@torch.inference_mode()
def decode_blocks_graphed(runner: GraphRunner, settings: DecodeSettings, eos_id: int,
                          ignore_eos: bool = False, deadline: float | None = None) -> DecodeResult:
    """``host.decode_blocks_host`` on the runner's graphs, constrained by the runner's grammar mask if it has one
    (``set_grammar``): one host sync per block (the EOS check; none with ``ignore_eos``), one every ``check_every``
    steps under the threshold rule, and one at the end. ``deadline`` (``time.perf_counter()``): past it the answer
    is the best so far (the module's "Anytime"), flagged ``anytime``."""
    engine = runner.engine
    runner._threshold.fill_(settings.threshold)
    calls_before = engine.forward_calls
    blocks, confs, steps_per_block = [], [], []
    produced, pending, anytime = 0, 0, False
    while produced < settings.max_new_tokens:
        if deadline is not None and time.perf_counter() >= deadline:
            block, conf = runner.fill(pending, produced, settings.max_new_tokens - produced)
            blocks.append(block)
            confs.append(conf)
            anytime = True
            break
        n = min(settings.block_size, settings.max_new_tokens - produced)
        steps_per_block.append(runner.run_block(n, pending, settings, produced, deadline))
        if deadline is not None and time.perf_counter() >= deadline and bool(runner._masked[:n].any()):
            anytime = True  # cut inside the block: its masks take the last step's argmax
        block, conf = runner.block_result(n)
        blocks.append(block)
        confs.append(conf)
        produced += n
        if not ignore_eos and bool((block == eos_id).any()):
            break
        pending = n
    tokens, confidence = torch.cat(blocks).tolist(), torch.cat(confs).tolist()
    if not ignore_eos and eos_id in tokens:
        cut = tokens.index(eos_id) + 1
        tokens, confidence = tokens[:cut], confidence[:cut]
    return DecodeResult(tokens, confidence, engine.forward_calls - calls_before, steps_per_block, anytime)


@torch.inference_mode()
def decode_ar_graphed(runner: GraphRunner, first_logits: torch.Tensor, max_new_tokens: int, eos_id: int,
                      ignore_eos: bool = False) -> DecodeResult:
    """``ar.decode_ar`` (unconstrained) on the runner's AR graph; EOS is looked for every ``check_every`` tokens,
    so up to ``check_every - 1`` forwards may run past it (counted; their tokens are dropped)."""
    if not runner.ar_supported:
        raise ValueError(f"the AR graph needs the sdpa backend, not {runner.engine.graph_attention.name}")
    engine = runner.engine
    if max_new_tokens > engine.capacity - engine.length:
        raise ValueError(f"{max_new_tokens} new tokens do not fit the cache after a {engine.length}-token prompt")
    p, token = torch.softmax(first_logits.float(), dim=-1).max(-1)
    runner._ar_tokens[:1].copy_(token.view(1))
    runner._ar_conf[:1].copy_(p.view(1))
    runner._ar_token.copy_(token.view(1))
    runner._ar_index.fill_(1)
    engine.plan(1)
    forwards = 0
    for i in range(1, max_new_tokens):
        if not ignore_eos and i % runner.check_every == 0 and bool((runner._ar_tokens[:i] == eos_id).any()):
            break
        runner._run(("ar",), runner._ar_step)
        forwards += 1
    engine.length += forwards
    engine.forward_calls += forwards
    tokens = runner._ar_tokens[: forwards + 1].tolist()
    confidence = runner._ar_conf[: forwards + 1].tolist()
    if not ignore_eos and eos_id in tokens:
        cut = tokens.index(eos_id) + 1
        tokens, confidence = tokens[:cut], confidence[:cut]
    return DecodeResult(tokens, confidence, forwards, [])
