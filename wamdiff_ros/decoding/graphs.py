"""CUDA Graphs for the decode engine: the static buffers of one block and one AR answer, the denoising step per block
size (plain, and fused with the previous block's commit) and the AR decode step, captured over one engine's static
buffers into one shared memory pool, and their replay.

The decode loops (``block.py``, ``ar.py``) drive a runner through its public methods only. Per block the host plans
once (positions, attention metadata) and replays the step up to T times. The LM head and the unmask rule are inside
the graph: each replay writes the block's tokens, confidences and mask in place, so nothing reaches the host per
step. The AR graph feeds its own greedy token back and advances the positions in place, so a whole answer is N
replays with no host work in between.

The unmask rules are ``unmask.py``'s, and the plan grammar, where it is a product of per-position sets
(``grammar_mask.py``), is an allowed-token mask applied to the logits inside the step (``set_grammar``; the block's
rows are copied into a static buffer once per block). Shapes that were not captured (a short last block), and
everything on a machine without CUDA, run the very same step functions eagerly, the attention then planned on the
engine's eager backend: on the CPU this path computes what the host loop does, token for token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.unmask import SCHEDULES, tokens_per_step, unmask_confident, unmask_top_k

WARMUP_RUNS = 2  # eager runs on a side stream before capture: lazy initialisation stays out of the graph


class GraphRunner:
    """Static unmask buffers and captured graphs over ``engine``; reused across plans (prefill, then decode)."""

    def __init__(self, engine: DecoderEngine, mask_id: int, max_block: int = 64, check_every: int = 2,
                 use_graphs: bool | None = None, pool: tuple | None = None) -> None:
        """``check_every``: how many steps (or AR tokens) the decode loops run between two host looks ("any mask
        left?", "EOS yet?"). ``pool``: a ``torch.cuda.graph_pool_handle()`` to share with other runners (their graphs
        must not run concurrently); by default the runner's graphs share a pool of their own."""
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
        self._schedule, self._steps = "static", 1  # the unmask rule (``set_unmask``)
        self._n, self._n_clean, self._needs_plan = 0, 0, False  # the started block (``start_block``)
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

    def _predict(self, logits: torch.Tensor, refused: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's most probable token and its probability, with the grammar's ``refused`` (n, V) tokens
        out, or without a grammar [MASK] out (the grammar never allows it)."""
        if refused is not None:
            scores = logits.masked_fill(refused, float("-inf"))
        else:
            scores = logits.index_fill(-1, self._no_mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).max(-1)

    # -- one block (the block loop's interface) -----------------------------------------------------------------------
    def set_unmask(self, schedule: str, steps: int, threshold: float) -> None:
        """The unmask rule of the following blocks: ``schedule`` with T = ``steps`` (the static schedule's count
        per step) and the threshold rule's ``threshold`` (kept on the device, where the step reads it)."""
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule {schedule!r} is not one of {SCHEDULES}")
        self._schedule, self._steps = schedule, steps
        self._threshold.fill_(threshold)

    def start_block(self, n: int, offset: int = 0, clean: torch.Tensor | None = None,
                    tokens: torch.Tensor | None = None) -> None:
        """A block of ``n`` masks, ``offset`` answer tokens in, and the plan of its first step, which commits
        ``clean`` (the finished block before it, if any). ``tokens``: the block's (n,) start instead, its [MASK]
        positions to denoise and the others fixed anchors (reflection's in-place repair)."""
        if n > self.max_block:
            raise ValueError(f"block of {n} exceeds the runner's max_block {self.max_block}")
        n_clean = 0 if clean is None else clean.shape[0]
        if n_clean:
            self._clean[:n_clean].copy_(clean)
        self._reset_block(n, self._schedule, self._steps)
        if tokens is not None:
            self._block[:n].copy_(tokens)
            torch.eq(self._block[:n], self.mask_id, out=self._masked[:n])
        if self.constrained:
            self._blocked[:n].copy_(self._forbidden[offset:offset + n])
        self.engine.plan(n + n_clean, n_clean, eager=not self.use_graphs)
        self._n, self._n_clean, self._needs_plan = n, n_clean, False

    def step(self) -> torch.Tensor:
        """One denoising step of the started block (the first commits its clean tokens), replayed when captured;
        returns its logits (read them before the next step: graphs share one pool). After a commit the host plans
        once more, before the second step."""
        engine, n, n_clean, schedule = self.engine, self._n, self._n_clean, self._schedule
        if self._needs_plan:
            engine.plan(n, eager=not self.use_graphs)
            self._needs_plan = False
        logits = self._run((n, n_clean, schedule, self.constrained), lambda: self._step(n, n_clean, schedule))
        engine.length += n_clean  # the clean block is committed
        engine.forward_calls += 1
        if n_clean:
            self._n_clean, self._needs_plan = 0, True
        return logits

    def rewind(self, length: int) -> None:
        """Forget the cache from ``length`` on (the prompt and the answer blocks before it stay): a block decoded
        again is written over what was there."""
        if not 0 <= length <= self.engine.length:
            raise ValueError(f"rewind to {length}: the cache holds {self.engine.length} tokens")
        self.engine.length = length

    def masks_left(self) -> bool:
        """Whether the started block still has masks: a host sync."""
        return bool(self._masked[:self._n].any())

    def finish_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The started block's tokens (leftover masks take their last prediction) and confidences, on the device."""
        n = self._n
        masked = self._masked[:n]
        return torch.where(masked, self._pred[:n], self._block[:n]), torch.where(masked, self._prob[:n], self._conf[:n])

    @torch.inference_mode()
    def fill(self, clean: torch.Tensor | None, offset: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The anytime answer's rest: one eager forward that commits the finished block ``clean`` and predicts
        ``count`` masks after it (answer positions ``offset`` on) at once, each its argmax (under the grammar when
        set); returns those tokens and their probabilities."""
        engine = self.engine
        n_clean = 0 if clean is None else clean.shape[0]
        masks = torch.full((count,), self.mask_id, dtype=torch.long, device=engine.device)
        tokens = torch.cat([clean, masks]) if n_clean else masks
        engine.plan(count + n_clean, n_clean, eager=True)
        logits = engine.run_planned(tokens, n_clean)
        engine.length += n_clean
        engine.forward_calls += 1
        p, pred = self._predict(logits, self._forbidden[offset:offset + count] if self.constrained else None)
        return pred, p

    # -- AR (the AR loop's interface) ---------------------------------------------------------------------------------
    def start_ar(self, token: torch.Tensor, confidence: torch.Tensor) -> None:
        """An AR answer whose first token (the prefill's prediction) is ``token`` with ``confidence``; plans the one
        query that every ``ar_step`` then advances in place."""
        self._ar_tokens[:1].copy_(token.view(1))
        self._ar_conf[:1].copy_(confidence.view(1))
        self._ar_token.copy_(token.view(1))
        self._ar_index.fill_(1)
        self.engine.plan(1)

    def ar_step(self) -> torch.Tensor:
        """One AR forward of the last token (committed), its greedy successor appended to the answer; replayed when
        captured. Returns the logits (read them before the next step)."""
        logits = self._run(("ar",), self._ar_step)
        self.engine.length += 1
        self.engine.forward_calls += 1
        return logits

    def ar_answer(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The AR answer's first ``count`` tokens and confidences, on the device (views of the static buffers)."""
        return self._ar_tokens[:count], self._ar_conf[:count]

    def _ar_step(self) -> torch.Tensor:
        logits = self.engine.run_planned(self._ar_token, 0)
        p, token = torch.softmax(logits.float(), dim=-1).max(-1)
        self._ar_token.copy_(token)
        self._ar_tokens.index_copy_(0, self._ar_index, token)
        self._ar_conf.index_copy_(0, self._ar_index, p)
        self._ar_index.add_(1)
        self.engine.positions[:1].add_(1)
        return logits
