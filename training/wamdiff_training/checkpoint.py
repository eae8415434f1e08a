"""Training checkpoints with exact resume.

``<out>/checkpoints/step-000040/`` is an HF checkpoint folder that ``Planner.from_pretrained`` loads as is (config,
safetensors, tokenizer, processor, ``wamdiff.json`` with the stage's decode metadata) plus ``train_state.pt``
(full optimiser state, scheduler, step, sampler position, per-rank python / numpy / torch RNG states, config
fingerprint, world size; tensors and plain containers only, read with ``weights_only=True``) and ``manifest.json``
(file sizes, written last). The folder is written as ``step-000040.tmp-<pid>`` and renamed into place;
``checkpoints/latest`` names the newest one and is replaced atomically, so a run killed at any moment leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model import LATEST_POINTER, META_FILE, DecodeMeta, ModelBundle, latest_checkpoint, load_checkpoint

STATE_FILE = "train_state.pt"
MANIFEST = "manifest.json"
LATEST = LATEST_POINTER
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def checkpoints_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def capture_rng() -> dict:
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "state": {"key": n["key"].numpy().astype(np.uint32),
                        "pos": n["pos"]}, "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _replace_dir(tmp: Path, final: Path) -> None:
    old = None
    if final.exists():  # the same step saved again after a resume
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save(
    out_dir: str | Path,
    step: int,
    *,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler_state: dict,
    bundle: ModelBundle,
    meta: DecodeMeta,
    fingerprint: str,
    stage: str,
    keep: int = 0,
    prefix: str = "model.",
) -> Path | None:
    """Collective: every rank calls it. Rank 0 writes; returns the checkpoint folder there, None elsewhere.
    ``module`` is the wrapped root whose parameter names carry ``prefix`` before the HF model's own."""
    model_sd = get_model_state_dict(module, options=FULL)
    optim_sd = get_optimizer_state_dict(module, optimizer, options=FULL)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rng = [capture_rng()]
    if world > 1:
        rng = [None] * world
        dist.all_gather_object(rng, capture_rng())
    folder = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        root = checkpoints_dir(out_dir)
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("step-*.tmp-*"):  # left by a run killed while saving
            shutil.rmtree(stale, ignore_errors=True)
        folder = root / step_name(step)
        tmp = root / f"{folder.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        _save_model(bundle, meta, {k.removeprefix(prefix): v for k, v in model_sd.items()}, tmp)
        torch.save({"step": step, "optimizer": optim_sd, "scheduler": scheduler.state_dict(),
                    "sampler": sampler_state, "rng": rng, "fingerprint": fingerprint, "world_size": world,
                    "stage": stage}, tmp / STATE_FILE)
        sizes = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"step": step, "stage": stage, "world_size": world, "fingerprint": fingerprint, "files": sizes}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _replace_dir(tmp, folder)
        _write_atomic(root / LATEST, folder.name + "\n")
        if keep:
            for old in sorted(root.glob("step-??????"))[:-keep]:
                if old != folder:
                    shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return folder


def save_checkpoint(bundle: ModelBundle, path: str | Path) -> Path:
    """``bundle`` as a checkpoint folder that ``wamdiff_ros.model.load_checkpoint`` reads: config.json +
    safetensors, the tokenizer, the image processor and ``wamdiff.json`` (the decode metadata)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    bundle.model.save_pretrained(str(folder), safe_serialization=True)
    bundle.tokenizer.save_pretrained(str(folder))
    bundle.image_processor.save_pretrained(str(folder))
    meta = {k: v for k, v in dataclasses.asdict(bundle.meta).items() if v is not None}  # unset optional keys stay out
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def _save_model(bundle: ModelBundle, meta: DecodeMeta, state_dict: dict, folder: Path) -> None:
    """The gathered weights into an HF folder via a parameter-less shell (no second copy of the model)."""
    with torch.device("meta"):
        shell = type(bundle.model)(bundle.model.config)
    shell.load_state_dict(state_dict, assign=True)
    shell.tie_weights()
    save_checkpoint(dataclasses.replace(bundle, model=shell, meta=meta), folder)


def resolve(resume: str | Path, out_dir: str | Path) -> Path:
    """``"latest"`` -> the folder ``<out>/checkpoints/latest`` names; anything else is a checkpoint folder."""
    return latest_checkpoint(out_dir) if str(resume) == LATEST else Path(resume)


def read_state(folder: str | Path, fingerprint: str, world_size: int, stage: str) -> dict:
    """The training state of ``folder`` after checking it is whole and belongs to this run; a mismatch or a damaged
    file is a ``CheckpointError`` naming the file."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        files = dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: missing or corrupt checkpoint manifest ({exc})") from exc
    for name, size in files.items():
        path = folder / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            what = "missing" if actual is None else f"truncated or altered ({actual} bytes, manifest says {size})"
            raise CheckpointError(f"{path}: {what}")
    path = folder / STATE_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        keys = {"step", "optimizer", "scheduler", "sampler", "rng", "fingerprint", "world_size", "stage"}
        if not isinstance(state, dict) or not keys <= state.keys():
            raise ValueError(f"missing keys {sorted(keys - set(state) if isinstance(state, dict) else keys)}")
    except Exception as exc:  # torch.load raises several types for a damaged file
        raise CheckpointError(f"{path}: corrupt training state ({exc})") from exc
    if state["stage"] != stage:
        raise CheckpointError(f"{path}: written by stage {state['stage']!r}, not {stage!r}")
    if state["fingerprint"] != fingerprint:
        raise CheckpointError(f"{path}: made with a different config (fingerprint {state['fingerprint'][:12]} vs "
                              f"{fingerprint[:12]}); resume with the config that wrote it")
    if state["world_size"] != world_size:
        raise CheckpointError(f"{path}: made with world size {state['world_size']}, this run has {world_size}; "
                              "the sampler shards and RNG streams would not line up")
    return state


def load_model(folder: str | Path) -> ModelBundle:
    """The checkpoint's weights (fp32, CPU), bit-exact as saved."""
    return load_checkpoint(folder, device="cpu", dtype=torch.float32)


def restore(state: dict, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: torch.optim.lr_scheduler.LRScheduler, rank: int) -> None:
    """Optimiser (each rank takes its shard of the full state), scheduler and this rank's RNG streams."""
    set_optimizer_state_dict(module, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    scheduler.load_state_dict(state["scheduler"])
    restore_rng(state["rng"][rank])
