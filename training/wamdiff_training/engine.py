"""The training engine: processes, wrapping, optimiser and schedule, and the loop over a ``Stage``.

Loss averaging: a stage returns the mean of its loss terms (answer tokens for AR) and how many there were
(``metrics["weight"]``, default: the number of samples). Each micro-batch back-propagates ``mean * weight``; once a
step's micro-batches are done the gradients are scaled by ``world_size / total weight`` (the wrapper already
averaged over ranks), so a step's gradient is the mean over every loss term of the global batch, however it is split
into ranks and micro-batches. The logged loss is the same global mean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn

from wamdiff_ros.model import DecodeMeta, ModelBundle, load_checkpoint, tiny_random
from wamdiff_training import checkpoint
from wamdiff_training.config import Config, ConfigError
from wamdiff_training.data import Sample, SampleDataset, load_records, mix_group, read_manifest
from wamdiff_training.metrics_log import MetricsLog
from wamdiff_training.sampling import TaskMix, TaskMixSampler

log = logging.getLogger("wamdiff_training")


class Stage(Protocol):
    name: str

    def loss(self, model: nn.Module, samples: list[Sample], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean loss over the loss terms of ``samples``; metrics may carry ``weight`` (the number of terms).
        Forwards go through ``model(fn)``, which runs ``fn(hf_model)`` inside the wrapper (see ``Runner``)."""

    def decode_meta(self, meta: DecodeMeta) -> DecodeMeta:
        """The decode metadata its checkpoints are saved with."""


StageFactory = Callable[[Config, ModelBundle], Stage]


@dataclass(slots=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # this process created the group (and destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(wrap: str) -> DistContext:
    """torchrun's environment -> a process group (nccl on GPU, gloo on CPU); a plain process with a ``ddp`` /
    ``fsdp2`` wrap gets a group of one, so the same config runs both ways."""
    cuda = torch.cuda.is_available()
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not launched and wrap == "none":
        return DistContext(device=torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if cuda else "gloo"
        if launched:
            dist.init_process_group(backend, timeout=timedelta(minutes=30))
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, device, owns)


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.barrier()  # a rank leaving while another still gathers aborts the group
        dist.destroy_process_group()


class Runner(nn.Module):
    """The root every training forward goes through, so the DDP / FSDP2 hooks fire: ``runner(fn)`` runs
    ``fn(hf_model)`` as this module's forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[nn.Module], object]) -> object:
        return fn(self.model)


def wrap(runner: Runner, how: str, ctx: DistContext, bf16: bool, source: str = "<config>") -> nn.Module:
    """``fsdp2``: ``fully_shard`` per vision block, the vision tower, per decoder layer, then the root; ``ddp``;
    ``none``. Returns the module to call (the DDP wrapper, or the runner itself)."""
    if how == "none":
        if ctx.world_size > 1:
            raise ConfigError(source, "train.wrap", f"'none' cannot train on {ctx.world_size} processes")
        return runner
    if how == "ddp":
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(runner, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kwargs = {"mesh": mesh, **({"mp_policy": mp} if mp else {})}
    inner = runner.model.model
    for block in inner.visual.blocks:
        fully_shard(block, **kwargs)
    fully_shard(inner.visual, **kwargs)
    for layer in inner.language_model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(runner, **kwargs)
    return runner


def lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimiser step ``step`` (0-based): linear warm-up to 1 over ``warmup`` steps
    ((step + 1) / warmup), then cosine from 1 down to ``min_ratio`` at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(runner: nn.Module, config: Config) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW; weight decay on matrices (linear layers, embeddings), none on norm gains and biases."""
    t = config.train
    params = [p for p in runner.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), eps=t.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, t.steps, t.warmup, t.min_lr_ratio))
    return optimizer, scheduler


@dataclass(slots=True)
class StepStats:
    loss: float  # global mean over loss terms
    weight: float  # global number of loss terms
    metrics: dict[str, float]  # global weighted means


def _sync_gradients(module: nn.Module, how: str, sync: bool) -> contextlib.AbstractContextManager:
    if how == "ddp" and not sync:
        return module.no_sync()
    if how == "fsdp2":
        module.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def accumulate_gradients(module: nn.Module, stage: Stage, micro_batches: list[list[Sample]], step: int,
                         how: str = "none", world_size: int = 1,
                         autocast: contextlib.AbstractContextManager | None = None) -> StepStats:
    """Forward/backward every micro-batch, then scale the summed gradients to the global per-term mean. A stage
    must return the same metric keys on every call and rank (they are all-reduced as one vector)."""
    sums: dict[str, float] = {}
    for i, micro in enumerate(micro_batches):
        with _sync_gradients(module, how, i == len(micro_batches) - 1), (autocast or contextlib.nullcontext()):
            loss, metrics = stage.loss(module, micro, step)
            weight = float(metrics.pop("weight", len(micro)))
            (loss * weight).backward()
        for key, value in {"loss": float(loss.detach()), **metrics}.items():
            sums[key] = sums.get(key, 0.0) + float(value) * weight
        sums["weight"] = sums.get("weight", 0.0) + weight
    keys = sorted(sums)
    totals = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(totals)
    total = dict(zip(keys, totals.tolist()))
    weight = total.pop("weight")
    scale = world_size / max(weight, 1e-12)
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(scale)
    means = {k: v / max(weight, 1e-12) for k, v in total.items()}
    return StepStats(means.pop("loss"), weight, means)


def _grad_norm(module: nn.Module, clip: float) -> float:
    params = [p for p in module.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def build_bundle(config: Config) -> ModelBundle:
    init = config.model.init
    if init == "tiny-random":
        tiny = config.model.tiny
        return tiny_random(seed=tiny.seed, hidden=tiny.hidden, layers=tiny.layers,
                           vision_hidden=tiny.vision_hidden, vision_depth=tiny.vision_depth)
    if "${" in init or init.startswith("$"):
        raise ConfigError(config.source, "model.init", f"{init!r}: its environment variable is not set")
    return load_checkpoint(init, device="cpu", dtype=torch.float32)


@dataclass(slots=True)
class TrainResult:
    steps: int
    losses: list[float]  # per step run by this call
    checkpoint: Path | None  # the last one written (rank 0)
    steps_per_s: float
    samples_per_s: float


def train(config: Config, build_stage: StageFactory, stage_name: str, *, resume: str | Path | None = None,
          stop_after: int | None = None, progress: bool = True) -> TrainResult:
    """Run ``config.train.steps`` optimiser steps (from a checkpoint when ``resume`` names one or is ``"latest"``).
    ``stop_after``: leave with ``os._exit`` right after that step (and its checkpoint), as a kill would."""
    ctx = init_distributed(config.train.wrap)
    try:
        return _train(config, build_stage, stage_name, ctx, resume, stop_after, progress)
    finally:
        shutdown(ctx)


def _train(config: Config, build_stage: StageFactory, stage_name: str, ctx: DistContext,
           resume: str | Path | None, stop_after: int | None, progress: bool) -> TrainResult:
    t, out = config.train, config.out
    torch.manual_seed(t.seed + ctx.rank)  # every rank its own stream: stage noise differs across ranks
    random.seed(t.seed + ctx.rank)
    np.random.seed(t.seed + ctx.rank)
    state = None
    if resume is not None:
        folder = checkpoint.resolve(resume, out.dir)
        state = checkpoint.read_state(folder, config.fingerprint(), ctx.world_size, stage_name)
        bundle = checkpoint.load_model(folder)
    else:
        bundle = build_bundle(config)
    records = load_records(config.data.train, config.data.root, config.data.turns)[: config.data.limit]
    dataset = SampleDataset(records, bundle, config.data.cache_size)
    data_format = export_format(config.data.train, config.source)  # saved with every checkpoint
    weights = config.data.task_weights
    sampler = TaskMixSampler([mix_group(r, weights) for r in records], TaskMix(weights), t.batch_size * t.grad_accum,
                             seed=t.seed, rank=ctx.rank, world_size=ctx.world_size, epoch_size=config.data.epoch_size)
    stage = build_stage(config, bundle)
    bf16 = ctx.device.type == "cuda" and t.precision in ("auto", "bf16")
    if t.precision == "bf16" and not bf16 and ctx.main:
        log.warning("train.precision bf16 needs a GPU; training in fp32 on %s", ctx.device)
    if t.wrap != "fsdp2":  # fully_shard moves each unit to the device as it shards it: no full copy there
        bundle.model.to(ctx.device)
    bundle.model.train()
    runner = Runner(bundle.model)
    module = wrap(runner, t.wrap, ctx, bf16, config.source)
    optimizer, scheduler = build_optimizer(runner, config)
    start = 0
    if state is not None:
        checkpoint.restore(state, runner, optimizer, scheduler, ctx.rank)
        sampler.load_state_dict(state["sampler"])
        start = int(state["step"])
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    metrics_log = MetricsLog(out.dir, ctx.main, start, out.tensorboard)
    if ctx.main:  # the resolved config beside the run's checkpoints: what produced them, every default spelled out
        Path(out.dir).mkdir(parents=True, exist_ok=True)
        (Path(out.dir) / "config.yaml").write_text(yaml.safe_dump(config.as_dict(), sort_keys=False))
    bar = _progress(progress and ctx.main, start, t.steps)
    batches = sampler.stream()
    global_batch = t.batch_size * t.grad_accum * ctx.world_size
    losses, saved, began = [], None, time.perf_counter()
    for step in range(start, t.steps):
        tick = time.perf_counter()
        samples = dataset.batch(next(batches))
        micro = [samples[i:i + t.batch_size] for i in range(0, len(samples), t.batch_size)]
        stats = accumulate_gradients(module, stage, micro, step, t.wrap, ctx.world_size, autocast())
        grad_norm = _grad_norm(module, t.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        done, elapsed = step + 1, time.perf_counter() - tick
        losses.append(stats.loss)
        if done % out.log_every == 0 or done == t.steps:
            metrics_log.write(done, {"loss": stats.loss, "lr": lr, "grad_norm": grad_norm, "tokens": stats.weight,
                                     "samples_per_s": global_batch / elapsed, **stats.metrics})
        if bar is not None:
            bar.set_postfix(loss=f"{stats.loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{global_batch / elapsed:.1f}")
            bar.update(1)
        elif ctx.main and done % out.log_every == 0:
            log.info("step %d/%d loss %.4f lr %.2e %.1f samples/s", done, t.steps, stats.loss, lr,
                     global_batch / elapsed)
        if (out.checkpoint_every and done % out.checkpoint_every == 0) or done == t.steps:
            spe = sampler.steps_per_epoch  # the trainer's own count, whatever the iterator fetched ahead
            position = {**sampler.state_dict(), "epoch": done // spe, "position": done % spe}
            saved = checkpoint.save(out.dir, done, module=runner, optimizer=optimizer, scheduler=scheduler,
                                    sampler_state=position, bundle=bundle,
                                    meta=_meta(stage, bundle, data_format),
                                    fingerprint=config.fingerprint(), stage=stage_name, keep=out.keep) or saved
        if stop_after is not None and done >= stop_after:
            metrics_log.close()
            os._exit(17)  # no cleanup, as if killed
    if bar is not None:
        bar.close()
    metrics_log.close()
    ran, wall = t.steps - start, time.perf_counter() - began
    rate = ran / wall if wall > 0 else 0.0
    return TrainResult(t.steps, losses, saved, rate, rate * global_batch)


def export_format(files: Sequence[str | Path], source: str = "data.train") -> dict | None:
    """The answers' waypoint format and whether the plan prompts carry the route line, as the exports of ``files``
    wrote them into their manifests (``{"format_version": 3, "route_points": True}``); None when no file has a
    manifest (hand-written data: the checkpoint keeps its model's decode metadata). Exports written in two formats
    are refused: a model learns one, and its checkpoint records which."""
    found: dict[tuple, str] = {}
    for file in files:
        manifest = read_manifest(file)
        if manifest is not None:
            found.setdefault((manifest["format_version"], bool(manifest.get("route_points", False))), str(file))
    if len(found) > 1:
        (a, fa), (b, fb) = list(found.items())[:2]
        raise ConfigError(source, "data.train", f"{fa} was exported with format_version {a[0]}, route_points {a[1]} "
                                                f"but {fb} with {b[0]}, {b[1]}: a run trains on one format")
    if not found:
        return None
    (version, route), = found
    return {"format_version": version, "route_points": route}


def _meta(stage: Stage, bundle: ModelBundle, data_format: dict | None) -> DecodeMeta:
    """The stage's decode metadata, with the waypoint format and the route line of the data it trained on (when its
    exports say)."""
    meta = stage.decode_meta(bundle.meta)
    return meta if data_format is None else dataclasses.replace(meta, **data_format)


def _progress(enabled: bool, start: int, total: int):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, desc="train")
