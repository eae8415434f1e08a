"""CUDA Graphs for the decode engine: the static buffers of one block and one AR answer, the denoising step per block
size (plain, and fused with the previous block's commit) and the AR decode step, captured over one engine's static
buffers into one shared memory pool, and their replay.

The decode loops (``block.py``, ``ar.py``) drive a runner through its public methods only. Per block the host plans
once (positions, attention metadata) and replays the step up to T times. The LM head and the unmask rule are inside
the graph: each replay writes the block's tokens, confidences and mask in place, so nothing reaches the host per
step. The AR graph feeds its own greedy token back and advances the positions in place, so a whole answer is N
replays with no host work in between. Whatever a step touches that scales with block x vocabulary (the LM head's
logits, the scores under the grammar, their softmax) is a buffer of the runner's, made once: a step allocates
nothing of that size, on the CPU as on the GPU (``_predict``), and answers what a softmax made per step answered, bit
for bit (``test_step_buffers.py``).

The unmask rules are ``unmask.py``'s, and the plan grammar, where it is a product of per-position sets
(``grammar_mask.py``), is an allowed-token mask applied to the logits inside the step (``set_grammar``; the block's
rows are copied into a static buffer once per block). Shapes that were not captured (a short last block), and
everything on a machine without CUDA, run the very same step functions eagerly, the attention then planned on the
engine's eager backend: on the CPU this path computes what the host loop does, token for token. Eagerly on the CPU a
step also skips the softmax of the positions its block already fixed (``_open_rows``: a host look, free there),
and runs the LM head and the softmax in cache-sized pieces; each row is computed as before, so the same bits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.unmask import SCHEDULES, tokens_per_step, unmask_confident, unmask_top_k

WARMUP_RUNS = 2  # eager runs on a side stream before capture: lazy initialisation stays out of the graph
CHUNKS = (256, 128, 64, 32, 16, 8)  # the first-argmax's chunk width: the widest that divides the vocabulary
CPU_SOFTMAX_ROWS = 4  # on the CPU the softmax and the chunk maxima go this many rows at a time (still in cache)
WIDE_VOCAB = 32768  # from this many columns a step's (n, V) passes are what it costs (``_wide``), not its ops


class GraphRunner:
    """Static unmask buffers and captured graphs over ``engine``; reused across plans (prefill, then decode)."""

    def __init__(self, engine: DecoderEngine, mask_id: int, max_block: int = 64, check_every: int = 2,
                 use_graphs: bool | None = None, pool: tuple | None = None, candidates: int = 0) -> None:
        """``check_every``: how many steps (or AR tokens) the decode loops run between two host looks ("any mask
        left?", "EOS yet?"). ``pool``: a ``torch.cuda.graph_pool_handle()`` to share with other runners (their graphs
        must not run concurrently); by default the runner's graphs share a pool of their own. ``candidates``: k > 0
        keeps, per block position, the k most probable tokens and their probabilities from the step that fixed it
        (``block_candidates``); a setting of the runner's, so every graph it captures has it (0: no top-k at all)."""
        if check_every < 1:
            raise ValueError(f"check_every {check_every} must be >= 1")
        if candidates < 0:
            raise ValueError(f"candidates {candidates} must be >= 0")
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
        # The step's static buffers (``_predict``): whatever scales with block x vocabulary is made here, once, on
        # the CPU as on the GPU, so that a step allocates nothing of that size (a 151,936-row vocabulary's (32, V)
        # float is 19 MB: made per step, the CPU allocator may hand it back to the kernel and fault it in again).
        vocab = engine.lm_head.weight.shape[0]
        f32 = dict(dtype=torch.float32, device=dev)
        i64 = dict(dtype=torch.long, device=dev)
        self.vocab = vocab
        self._logits = torch.zeros(max_block, vocab, dtype=engine.dtype, device=dev)  # the LM head writes here
        self._probs = torch.zeros(max_block, vocab, **f32)  # the softmax of the scores
        self._views: dict[int, tuple] = {}  # n -> the buffers' first n rows (``_first_rows``)
        self._scores: torch.Tensor | None = None  # (max_block, V) float32, the refused tokens at -inf (``_scratch``)
        # wide: a vocabulary where a step's (n, V) passes cost more than its ops (a real one); on the CPU the step
        # then goes in cache-sized pieces, over the rows still open, and keeps the logits' [MASK] column aside
        # instead of copying them
        self._wide = vocab >= WIDE_VOCAB
        self._pieces = self._wide and dev.type == "cpu"
        if engine.dtype != torch.float32 or not self._wide:
            self._scratch()
        self._saved = torch.zeros(max_block, 1, dtype=engine.dtype, device=dev)  # the [MASK] column, put back
        self._neg_inf = torch.tensor(float("-inf"), **f32)
        self._step_pred = torch.zeros(max_block, **i64)  # ``_predict``'s answer: argmax and its probability
        self._step_prob = torch.zeros(max_block, **f32)
        # the first argmax in two small passes: each chunk's max, then the first chunk that holds the row's max
        self._chunk = next((c for c in CHUNKS if vocab % c == 0 and vocab > c), 0)
        width, chunks = (self._chunk, vocab // self._chunk) if self._chunk else (1, 1)
        self._chunk_max = torch.zeros(max_block, chunks, **f32)
        self._chunk_index = torch.zeros(max_block, **i64)
        self._chunk_cols = torch.zeros(max_block, width, **i64)
        self._chunk_vals = torch.zeros(max_block, width, **f32)
        self._chunk_arange = torch.arange(width, device=dev)
        self._within = torch.zeros(max_block, **i64)
        self._within_max = torch.zeros(max_block, **f32)
        # candidates: the last step's top-k per position, and the top-k of the step that fixed each position
        self.candidates = min(candidates, vocab)
        k = max(self.candidates, 1)
        top_chunks = min(k, chunks)
        self._cand_tokens = torch.zeros(max_block, k, **i64)
        self._cand_probs = torch.zeros(max_block, k, **f32)
        self._chosen_tokens = torch.zeros(max_block, k, **i64)
        self._chosen_probs = torch.zeros(max_block, k, **f32)
        self._fixed_here = torch.zeros(max_block, dtype=torch.bool, device=dev)  # fixed by a step of this block
        self._top_chunk_vals = torch.zeros(max_block, top_chunks, **f32)
        self._top_chunks = torch.zeros(max_block, top_chunks, **i64)
        self._top_cols = torch.zeros(max_block, top_chunks, width, **i64)
        self._top_vals = torch.zeros(max_block, top_chunks * width, **f32)
        self._top_at = torch.zeros(max_block, k, **i64)
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
        self._scratch()
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
        logits = self.engine.run_planned(tokens, n_clean, out=self._first_rows(n)[0])
        p, pred = self._predict(logits, self._blocked[:n] if self.constrained else None, rows=self._open_rows(n))
        if schedule == "static":
            select = unmask_top_k(p, masked, self._k.index_select(0, self._step_index))
        else:
            select = unmask_confident(p, masked, self._threshold)
        block.copy_(torch.where(select, pred, block))
        self._conf[:n].copy_(torch.where(select, p, self._conf[:n]))
        self._pred[:n].copy_(pred)
        self._prob[:n].copy_(p)
        if self.candidates:
            self._keep_candidates(n, select)
        if self.candidates or self._pieces:
            self._fixed_here[:n].logical_or_(select)
        masked.copy_(masked & ~select)
        self._step_index.add_(1)
        return logits

    def _reset_block(self, n: int, schedule: str, steps: int) -> None:
        self._block[:n].fill_(self.mask_id)
        self._masked[:n].fill_(True)
        self._conf[:n].zero_()
        self._fixed_here[:n].fill_(False)
        self._step_index.zero_()
        if schedule == "static":
            key = (n, steps)
            if key not in self._schedules:
                self._schedules[key] = torch.tensor(tokens_per_step(n, steps), device=self.engine.device)
            ks = self._schedules[key]
            self._k[: ks.shape[0]].copy_(ks)

    def _scratch(self) -> torch.Tensor:
        """The (max_block, V) float32 scores buffer: needed under a grammar, and where the logits are not float32
        (made once, outside any capture)."""
        if self._scores is None:
            self._scores = torch.zeros_like(self._probs)
            self._views.clear()
        return self._scores

    def _first_rows(self, n: int) -> tuple:
        """Views of the step buffers' first ``n`` rows (logits, probabilities, scores or None, the prediction's
        probability and token), made once per n: a small vocabulary's step is a few dozen ops, each view one more."""
        views = self._views.get(n)
        if views is None:
            scores = None if self._scores is None else self._scores[:n]
            views = self._views[n] = (self._logits[:n], self._probs[:n], scores, self._step_prob[:n],
                                      self._step_pred[:n])
        return views

    def _open_rows(self, n: int) -> list[int] | None:
        """On the CPU, the block positions a step must predict: those no step of this block fixed yet (the masks,
        and the anchors of ``start_block``'s ``tokens``, whose candidates are the last step's); a fixed position's
        prediction is read by nothing. A host sync, free on the CPU; None (every row, no sync) elsewhere, where the
        step is what a CUDA Graph captures, and for a vocabulary narrower than ``WIDE_VOCAB``."""
        if not self._pieces:
            return None
        return torch.nonzero(~self._fixed_here[:n]).view(-1).tolist()

    def _predict(self, logits: torch.Tensor, refused: torch.Tensor | None, no_mask: bool = True,
                 rows: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's most probable token and its probability, with the grammar's ``refused`` (n, V) tokens
        out, or without a grammar [MASK] out (the grammar never allows it; ``no_mask`` False: nothing out, the AR
        step); ``logits`` (n, V), n <= max_block, keep their values. ``rows``: only these rows' softmax (the others
        keep what they were); each row's is its own, so the same bits either way.

        Everything of size n x V lives in the runner's static buffers: the exclusion is applied in place (a wide
        vocabulary's float32 logits get their [MASK] column set to -inf and put back after; else they are copied
        into the scores buffer and excluded there; the grammar is written into it by one ``where``), the softmax
        goes into ``_probs`` (the same kernel on the same values as ``torch.softmax``: the same bits, no tensor
        made), and its first argmax is found in two cheap passes (``_first_max``). On a GPU the same ops are what a
        CUDA Graph captures. Returns views of ``_step_prob`` / ``_step_pred``."""
        n = logits.shape[0]
        _, probs, all_scores, prob, pred = self._first_rows(n)
        spans = self._spans(n, rows)
        if refused is None and logits.dtype == torch.float32 and self._wide:
            if no_mask:
                torch.index_select(logits, 1, self._no_mask, out=self._saved[:n])
                logits.index_fill_(1, self._no_mask, float("-inf"))
            for a, b in spans:
                self._softmax(logits[a:b], a)
            if no_mask:
                logits.index_copy_(1, self._no_mask, self._saved[:n])
        else:
            if all_scores is None:
                all_scores = self._scratch()[:n]
            for a, b in spans:
                whole = b - a == n  # no views to make: the common case of a small vocabulary
                scores, part = (all_scores, logits) if whole else (self._scores[a:b], logits[a:b])
                if refused is not None:
                    refused_part = refused if whole else refused[a:b]
                    if logits.dtype == torch.float32:
                        torch.where(refused_part, self._neg_inf, part, out=scores)
                    else:
                        scores.copy_(part)
                        scores.masked_fill_(refused_part, float("-inf"))
                else:
                    scores.copy_(part)
                    if no_mask:
                        scores.index_fill_(1, self._no_mask, float("-inf"))
                self._softmax(scores, a, probs if whole else None)
        return self._first_max(probs, prob, pred)

    def _spans(self, n: int, rows: list[int] | None) -> list[tuple[int, int]]:
        """The row ranges ``_predict`` works in: on the CPU at most ``CPU_SOFTMAX_ROWS`` rows each (of ``rows``, or
        all), so a range's probabilities are still in cache when its chunk maxima read them; elsewhere, and for a
        vocabulary narrower than ``WIDE_VOCAB`` (where one op per piece would cost more than it saves), all at
        once."""
        if not self._pieces:
            return [(0, n)]
        spans: list[tuple[int, int]] = []
        for r in range(n) if rows is None else rows:
            if spans and spans[-1][1] == r and r - spans[-1][0] < CPU_SOFTMAX_ROWS:
                spans[-1] = (spans[-1][0], r + 1)
            else:
                spans.append((r, r + 1))
        return spans

    def _softmax(self, scores: torch.Tensor, first: int, probs: torch.Tensor | None = None) -> None:
        """Rows ``first``... of ``_probs`` (``probs``: those rows, when the caller has them) = softmax(``scores``)
        over the vocabulary (``torch.softmax``'s kernel and bits) and, where ``_first_max`` chunks the vocabulary,
        each chunk's maximum into ``_chunk_max``."""
        rows, c = scores.shape[0], self._chunk
        if probs is None:
            probs = self._probs[first:first + rows]
        torch._softmax(scores, -1, False, out=probs)
        if c:
            torch.amax(probs.view(rows, -1, c), -1, out=self._chunk_max[first:first + rows])

    def _first_max(self, probs: torch.Tensor, value: torch.Tensor,
                   index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``probs.max(-1)`` into ``value`` / ``index``: the maximum and its first index, as ``torch.max`` gives
        them. On the CPU ``max`` with indices is a scalar loop (about 5x a vectorised ``amax`` over a real
        vocabulary), so where a chunk width divides V it is each chunk's ``amax`` (``_softmax`` took them), the
        first chunk holding the row's maximum, then the first index inside that chunk: the same answer."""
        n, c = probs.shape[0], self._chunk
        if not c:
            return torch.max(probs, -1, out=(value, index))
        chunk_max, chunk = self._chunk_max[:n], self._chunk_index[:n]
        torch.max(chunk_max, -1, out=(value, chunk))
        cols, within = self._chunk_cols[:n], self._within[:n]
        torch.add(self._chunk_arange, chunk[:, None], alpha=c, out=cols)
        vals = torch.gather(probs, 1, cols, out=self._chunk_vals[:n])
        torch.max(vals, -1, out=(self._within_max[:n], within))
        torch.add(within, chunk, alpha=c, out=index)
        return value, index

    def _top_candidates(self, n: int) -> None:
        """The last ``_predict``'s top-k tokens per position and their probabilities into ``_cand_tokens`` /
        ``_cand_probs``, the most probable first and the first column the prediction itself (a tie with it keeps its
        probability). Where ``_first_max`` chunks the vocabulary, from its chunk maxima: the k best tokens lie in the
        k chunks with the highest maxima, so only those k x width probabilities are ranked."""
        probs, k, c = self._probs[:n], self.candidates, self._chunk
        tokens, values = self._cand_tokens[:n], self._cand_probs[:n]
        if not c:
            torch.topk(probs, k, -1, out=(values, tokens))
        else:
            top = self._top_chunks[:n]
            torch.topk(self._chunk_max[:n], top.shape[1], -1, out=(self._top_chunk_vals[:n], top))
            cols = self._top_cols[:n]
            torch.add(self._chunk_arange, top[:, :, None], alpha=c, out=cols)
            cols = cols.view(n, -1)
            vals = torch.gather(probs, 1, cols, out=self._top_vals[:n])
            at = self._top_at[:n]
            torch.topk(vals, k, -1, out=(values, at))
            torch.gather(cols, 1, at, out=tokens)
        pred = self._step_pred[:n, None]
        tokens.copy_(torch.where(tokens == pred, tokens[:, :1], tokens))  # a tie listed elsewhere swaps with it
        tokens[:, :1].copy_(pred)

    def _keep_candidates(self, n: int, select: torch.Tensor) -> None:
        """After a step: its candidates, and for the positions it fixes (``select``) the chosen ones."""
        self._top_candidates(n)
        fix = select[:, None]
        chosen_tokens, chosen_probs = self._chosen_tokens[:n], self._chosen_probs[:n]
        torch.where(fix, self._cand_tokens[:n], chosen_tokens, out=chosen_tokens)
        torch.where(fix, self._cand_probs[:n], chosen_probs, out=chosen_probs)

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

    def block_candidates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The started block's candidates (runner made with ``candidates`` k > 0): per position the k most probable
        tokens (n, k) long and their probabilities (n, k) float32, the most probable first, from the step that fixed
        the position; a position no step of the block fixed (a leftover mask, or an anchor of ``start_block``'s
        ``tokens``) takes the last step's, as ``finish_block`` does for its token. Column 0 is the token the step
        predicted there: the one ``finish_block`` answers, but at an anchor. On the device."""
        if not self.candidates:
            raise RuntimeError("block_candidates needs a runner made with candidates > 0")
        n = self._n
        fixed = self._fixed_here[:n, None]
        return (torch.where(fixed, self._chosen_tokens[:n], self._cand_tokens[:n]),
                torch.where(fixed, self._chosen_probs[:n], self._cand_probs[:n]))

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
        logits = engine.run_planned(tokens, n_clean, out=self._logits[:count] if count <= self.max_block else None)
        engine.length += n_clean
        engine.forward_calls += 1
        preds, probs = [], []
        for a in range(0, count, self.max_block):  # the step's prediction, max_block rows at a time
            rows = logits[a:a + self.max_block]
            refused = self._forbidden[offset + a:offset + a + rows.shape[0]] if self.constrained else None
            p, pred = self._predict(rows, refused)
            preds.append(pred.clone())
            probs.append(p.clone())
        return torch.cat(preds), torch.cat(probs)

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
        logits = self.engine.run_planned(self._ar_token, 0, out=self._logits[:1])
        p, token = self._predict(logits, None, no_mask=False)
        self._ar_token.copy_(token)
        self._ar_tokens.index_copy_(0, self._ar_index, token)
        self._ar_conf.index_copy_(0, self._ar_index, p)
        self._ar_index.add_(1)
        self.engine.positions[:1].add_(1)
        return logits
