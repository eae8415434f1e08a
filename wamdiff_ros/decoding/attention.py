"""Attention backends of the decode engine: one small interface, chosen by name with a logged fallback.

Every decode forward runs B query tokens over the cached prefix plus themselves, bidirectionally (block diffusion's
mask with the whole prefix visible; causal attention over one token is the AR case). A commit fused with the next
block's first step adds ``n_clean`` leading queries that must not see the block behind them.

A backend is used in three calls: ``plan(prefix_len, n_query, n_clean)`` on the host once per block (every step of
a block has the same metadata), ``begin(positions, n_clean)`` once at the start of each forward and
``run(q, keys, values)`` once per layer. ``begin`` and ``run`` of a ``graph_safe`` backend read only device
buffers, so a CUDA Graph can replay them after a new ``plan``.

- ``sdpa``: the reference. Eagerly it slices the cache to the planned length (exactly what the engine always did);
  its graph-safe twin (``StaticSdpaAttention``) attends over the whole static capacity under a mask built on the
  device from the query positions, so it needs no host metadata at all.
- ``flashinfer``: ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=False`` over the engine's own cache, read
  in place as HND pages of ``page_size`` tokens (a strided view of ``(1, kv_heads, capacity, head_dim)``: FlashInfer
  takes the page / head / token strides from the tensor), so the kernel can split the prefix over more CTAs. The
  fused commit is a batch of two requests over the same pages: the clean tokens with kv length
  ``prefix + n_clean``, the block with ``prefix + n_query`` - exact, no custom mask, one kernel.
"""

from __future__ import annotations

import itertools
import logging
from typing import Protocol

import torch
import torch.nn.functional as F

log = logging.getLogger("wamdiff_ros")

CHOICES = ("auto", "sdpa", "flashinfer")
FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-kv partial results)
_logged: set[str] = set()


class AttentionUnavailable(RuntimeError):
    """A backend was requested with ``strict=True`` and cannot run here; the message says why."""


class AttentionBackend(Protocol):
    name: str
    graph_safe: bool

    def plan(self, prefix_len: int, n_query: int, n_clean: int = 0) -> None: ...

    def begin(self, positions: torch.Tensor, n_clean: int) -> None: ...

    def run(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        ...  # q (1, H, n, D), keys/values (1, H_kv, capacity, D) -> (1, H, n, D)


class SdpaAttention:
    """The reference: the cache sliced to ``[0, prefix + n)``; a fused commit gets an explicit bool mask."""

    name = "sdpa"
    graph_safe = False

    def __init__(self, scale: float, device: torch.device) -> None:
        self.scale = scale
        self.device = device
        self._end = 0
        self._mask: torch.Tensor | None = None

    def plan(self, prefix_len: int, n_query: int, n_clean: int = 0) -> None:
        self._end = prefix_len + n_query
        self._mask = None
        if n_clean:  # the clean tokens see the prefix and each other, not the block
            visible = torch.ones(n_query, self._end, dtype=torch.bool, device=self.device)
            visible[:n_clean, prefix_len + n_clean:] = False
            self._mask = visible[None, None]

    def begin(self, positions: torch.Tensor, n_clean: int) -> None:
        pass

    def run(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        end = self._end
        return F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=self._mask, scale=self.scale, enable_gqa=True
        )


class StaticSdpaAttention:
    """Graph-safe SDPA: every forward attends over the full static capacity; query row r sees key j iff
    ``j <= positions[last of r's group]`` (the group is the clean tokens or the block), so the mask follows the
    positions buffer on the device and an AR graph that advances the positions in place stays correct."""

    name = "sdpa"
    graph_safe = True

    def __init__(self, scale: float, capacity: int, heads: int, kv_heads: int, device: torch.device) -> None:
        self.scale = scale
        self.group = heads // kv_heads
        self._columns = torch.arange(capacity, device=device)
        self._mask: torch.Tensor | None = None

    def plan(self, prefix_len: int, n_query: int, n_clean: int = 0) -> None:
        pass  # everything it needs is in the engine's positions buffer

    def begin(self, positions: torch.Tensor, n_clean: int) -> None:
        n = positions.shape[0]
        last = positions[n - 1:].expand(n - n_clean)
        limit = torch.cat([positions[n_clean - 1:n_clean].expand(n_clean), last]) if n_clean else last
        mask = self._columns[None, :] <= limit[:, None]
        # GQA folded into the query length: q head h = kv_head * group + r, rows ordered (r, token)
        self._mask = mask.repeat(self.group, 1)[None, None]

    def run(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        _, heads, n, dim = q.shape
        folded = q.reshape(1, heads // self.group, self.group * n, dim)
        o = F.scaled_dot_product_attention(folded, keys, values, attn_mask=self._mask, scale=self.scale)
        return o.reshape(1, heads, n, dim)


class FlashInferAttention:
    """FlashInfer's paged prefill kernel (``causal=False``) over the engine's cache viewed as HND pages; one
    CUDA-Graph-ready wrapper per query shape, planned on the host once per block."""

    name = "flashinfer"
    graph_safe = True

    def __init__(
        self, flashinfer, *, scale: float, capacity: int, heads: int, kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device, kernel: str = "fa2", page_size: int = 16,
    ) -> None:
        self._fi = flashinfer
        self.scale = scale
        self.capacity = capacity
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.kernel = kernel  # fa2: FlashInfer's own pick for <= 64 query rows per request; one module to build
        self.page_size = page_size if capacity % page_size == 0 else capacity
        self.pages = capacity // self.page_size
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers: dict[tuple[int, int], object] = {}
        self._planned: dict[tuple[int, int], torch.cuda.Event] = {}
        self._active = None

    def _wrapper(self, key: tuple[int, int]):
        if key not in self._wrappers:
            batch = 2 if key[1] else 1
            i32 = dict(dtype=torch.int32, device=self.device)
            self._wrappers[key] = self._fi.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace, "HND", use_cuda_graph=True, backend=self.kernel,
                qo_indptr_buf=torch.zeros(batch + 1, **i32), paged_kv_indptr_buf=torch.zeros(batch + 1, **i32),
                paged_kv_indices_buf=torch.zeros(batch * self.pages, **i32),
                paged_kv_last_page_len_buf=torch.zeros(batch, **i32),
            )
        return self._wrappers[key]

    def plan(self, prefix_len: int, n_query: int, n_clean: int = 0) -> None:
        key = (n_query, n_clean)
        wrapper = self._wrapper(key)
        # plan() writes its schedule to a page-locked buffer and copies it asynchronously: re-planning the same
        # wrapper before that copy ran would change the schedule under the previous block's replays.
        if key in self._planned:
            self._planned[key].synchronize()
        if n_clean:
            qo, kv_lens = [0, n_clean, n_query], [prefix_len + n_clean, prefix_len + n_query]
        else:
            qo, kv_lens = [0, n_query], [prefix_len + n_query]
        pages = [-(-kv // self.page_size) for kv in kv_lens]
        wrapper.plan(
            torch.tensor(qo, dtype=torch.int32),
            torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32),
            torch.cat([torch.arange(p, dtype=torch.int32) for p in pages]),  # every request reads pages 0, 1, ...
            torch.tensor([kv - (p - 1) * self.page_size for kv, p in zip(kv_lens, pages)], dtype=torch.int32),
            self.heads, self.kv_heads, self.head_dim, self.page_size,
            causal=False, sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
        )
        if self.device.type == "cuda":
            if key not in self._planned:
                self._planned[key] = torch.cuda.Event()
            self._planned[key].record()
        self._active = wrapper

    def begin(self, positions: torch.Tensor, n_clean: int) -> None:
        pass

    def _paged(self, cache: torch.Tensor) -> torch.Tensor:
        """(1, H_kv, capacity, D) -> a (pages, H_kv, page_size, D) view of the same memory."""
        return cache[0].view(self.kv_heads, self.pages, self.page_size, self.head_dim).transpose(0, 1)

    def run(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        o = self._active.run(q[0].transpose(0, 1).contiguous(), (self._paged(keys), self._paged(values)))
        return o.transpose(0, 1)[None]  # (n, H, D) -> (1, H, n, D)


def _flashinfer_reason(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int):
    """(module, None) when FlashInfer can run this model here, else (None, why not)."""
    if device.type != "cuda":
        return None, f"device is {device.type}, FlashInfer needs CUDA"
    if dtype not in FLASHINFER_DTYPES:
        return None, f"dtype {dtype} is not float16/bfloat16"
    if head_dim not in FLASHINFER_HEAD_DIMS:
        return None, f"head_dim {head_dim} is not one of {FLASHINFER_HEAD_DIMS}"
    if heads % kv_heads:
        return None, f"{heads} query heads are not a multiple of {kv_heads} KV heads"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return None, "compute capability below 8.0"
    try:
        import flashinfer
    except Exception as exc:  # a missing package, or one of its native dependencies failing to load
        return None, f"flashinfer is not importable ({type(exc).__name__}: {exc})"
    return flashinfer, None


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.log(level, message)


def select_attention(
    requested: str, *, scale: float, capacity: int, heads: int, kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device, strict: bool = False,
) -> tuple[AttentionBackend, AttentionBackend, str]:
    """Resolve ``requested`` to (eager backend, graph-safe backend, reason), logging the choice once.

    ``auto`` takes FlashInfer where it can run and SDPA elsewhere; an explicit ``flashinfer`` that cannot run
    falls back to SDPA with a warning, or raises ``AttentionUnavailable`` when ``strict``."""
    if requested not in CHOICES:
        raise ValueError(f"attention {requested!r} is not one of {CHOICES}")
    device = torch.device(device)
    module, why_not = (None, "requested") if requested == "sdpa" else _flashinfer_reason(
        device, dtype, heads, kv_heads, head_dim)
    if module is not None:
        backend = FlashInferAttention(module, scale=scale, capacity=capacity, heads=heads, kv_heads=kv_heads,
                                      head_dim=head_dim, dtype=dtype, device=device)
        version = getattr(module, "__version__", "?")
        reason = f"{requested}: flashinfer {version} on {torch.cuda.get_device_name(device)}"
        _log_once(logging.INFO, f"attention backend: flashinfer ({reason})")
        return backend, backend, reason
    if requested == "flashinfer" and strict:
        raise AttentionUnavailable(f"attention 'flashinfer' cannot run: {why_not}")
    reason = why_not if requested == "sdpa" else f"{requested}: fell back to sdpa, {why_not}"
    _log_once(logging.WARNING if requested == "flashinfer" else logging.INFO, f"attention backend: sdpa ({reason})")
    return (SdpaAttention(scale, device), StaticSdpaAttention(scale, capacity, heads, kv_heads, device), reason)
