"""Training metrics on disk: ``metrics.csv`` (rank 0) and TensorBoard scalars where TensorBoard is installed."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

log = logging.getLogger("wamdiff_training")


class MetricsLog:
    """``metrics.csv`` on rank 0 (columns fixed by the first row, floats at full precision) and TensorBoard scalars
    when ``torch.utils.tensorboard`` imports. A resumed run drops the rows past its checkpoint and appends."""

    def __init__(self, out_dir: str | Path, enabled: bool, start: int, tensorboard: bool) -> None:
        self.path, self.enabled = Path(out_dir) / "metrics.csv", enabled
        self.fields: list[str] | None = None
        self.writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict] = []
        if start and self.path.is_file():
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                kept = [row for row in reader if int(row["step"]) <= start]
                self.fields = reader.fieldnames
        with self.path.open("w", newline="") as f:
            if self.fields:
                w = csv.DictWriter(f, self.fields)
                w.writeheader()
                w.writerows(kept)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.info("tensorboard is not installed: metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=start + 1)

    def write(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        new = self.fields is None
        if new:
            self.fields = ["step", *values]
        with self.path.open("a", newline="") as f:
            w = csv.DictWriter(f, self.fields, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({"step": step, **{k: repr(float(v)) for k, v in values.items()}})
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
