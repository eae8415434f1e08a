"""Model names every entry point accepts, without importing torch (the evaluator's baselines and the CARLA agent
stay light): a checkpoint folder, a model shipped inside the package by name, or ``tiny-random``."""

from __future__ import annotations

from pathlib import Path

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")  # auto: float32 on the CPU, the checkpoint's own on a GPU
TINY_RANDOM = "tiny-random"  # random weights, for tests and benchmarks of the machinery
# Trained checkpoints shipped inside the package. The default is the tiny B = 32 student that ``make train-tiny``
# trains on the package's own world (model card: wamdiff_ros/assets/wamdiff-tiny/README.md).
DEFAULT_MODEL = "wamdiff-tiny"
PACKAGED_MODELS = {DEFAULT_MODEL: Path(__file__).resolve().parent / "assets" / "wamdiff-tiny"}
MODEL_HELP = (f"checkpoint folder (a wamdiff-train run folder: its latest checkpoint), {DEFAULT_MODEL} (default: the "
              f"packaged trained student) or {TINY_RANDOM}")


def resolve(path: str | Path) -> str | Path:
    """A packaged model's name -> its folder; anything else unchanged."""
    return PACKAGED_MODELS.get(str(path), path)


def is_model(path: str | Path) -> bool:
    """Whether ``path`` names something the loader can try: tiny-random, a packaged name or a folder."""
    return str(path) == TINY_RANDOM or Path(resolve(path)).is_dir()
