"""What ``wamdiff-train eval`` writes: eval.json, eval.csv and the figures -- the exposure-bias curve (per-waypoint
L2), the threshold sweep (L2 vs forward calls per token) and the training curves of the runs the checkpoints come from.

Figures are built with ``matplotlib.figure.Figure`` and the Agg canvas directly: no pyplot, so no global figure
state and no GUI backend, whoever imports this.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

METRICS_FILE = "metrics.csv"
SEARCH_LEVELS = 3  # <run>/checkpoints/step-N: the run's metrics.csv is two levels above the checkpoint


@dataclass(slots=True)
class SweepPoint:
    threshold: float | None  # None: AR (no threshold)
    l2_mean: float
    forward_calls_per_token: float


@dataclass(slots=True)
class CheckpointCurves:
    """What the plots need of one evaluated checkpoint."""

    legend: str  # label and decode mode, e.g. "run/step-000040 · B=8"
    l2_per_waypoint: Sequence[float]  # (8,), nan where no valid plan
    sweep: list[SweepPoint] = field(default_factory=list)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def plot_l2_per_waypoint(curves: Sequence[CheckpointCurves], path: str | Path) -> Path:
    """One line per checkpoint: mean L2 (m) at waypoint 1..8 (0.5 s apart) on the held-out plans."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for c in curves:
        ys = [float("nan") if v is None else v for v in c.l2_per_waypoint]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=c.legend)
    ax.set(xlabel="waypoint (0.5 s apart)", ylabel="L2 to the reference (m)",
           title="Per-waypoint L2 (exposure bias)", xticks=range(1, 9))
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, Path(path))


def plot_threshold_sweep(curves: Sequence[CheckpointCurves], path: str | Path) -> Path:
    """Mean plan L2 against forward calls per token, one line per checkpoint through its thresholds."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for c in curves:
        points = [p for p in c.sweep if math.isfinite(p.forward_calls_per_token)]
        xs = [p.forward_calls_per_token for p in points]
        ys = [p.l2_mean for p in points]
        line, = ax.plot(xs, ys, marker="o", label=c.legend)
        for p in points:
            if p.threshold is not None:
                ax.annotate(f"{p.threshold:g}", (p.forward_calls_per_token, p.l2_mean), fontsize=7,
                            textcoords="offset points", xytext=(4, 4), color=line.get_color())
    ax.set(xlabel="decoder forward calls per token", ylabel="mean plan L2 (m)",
           title="Confidence-threshold sweep (labels: threshold)")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, Path(path))


def find_metrics(checkpoint: str | Path) -> Path | None:
    """The ``metrics.csv`` in the checkpoint folder or up to ``SEARCH_LEVELS`` folders above it."""
    folder = Path(checkpoint).resolve()
    for candidate in [folder, *folder.parents][: SEARCH_LEVELS + 1]:
        if (candidate / METRICS_FILE).is_file():
            return candidate / METRICS_FILE
    return None


def read_losses(path: str | Path) -> tuple[list[int], list[float]]:
    """(steps, losses) of a training ``metrics.csv``; rows without a numeric loss are skipped."""
    steps, losses = [], []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                step, loss = int(row["step"]), float(row["loss"])
            except (KeyError, TypeError, ValueError):
                continue
            steps.append(step)
            losses.append(loss)
    return steps, losses


def plot_training_curves(runs: dict[str, Path], path: str | Path) -> Path | None:
    """Loss per step of each run (``{legend: metrics.csv}``); None (no file) when no run has a loss to show."""
    series = {name: read_losses(csv_path) for name, csv_path in runs.items()}
    series = {name: s for name, s in series.items() if s[0]}
    if not series:
        return None
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, (steps, losses) in series.items():
        ax.plot(steps, losses, label=name)
    ax.set(xlabel="optimizer step", ylabel="training loss", title="Training curves (metrics.csv)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, Path(path))


# -- eval.json / eval.csv -------------------------------------------------------------------------------------------

CSV_FIELDS = ("checkpoint", "label", "mode", "block_size", "threshold", "plans", "invalid", "invalid_rate", "l2_mean",
              *(f"l2_wp{i}" for i in range(1, 9)), "forward_calls_per_token", "tokens_per_s", "token_accuracy",
              "rho_k", "det_precision", "det_recall", "det_map50", "ask_exact_match", "driving_score",
              "driving_score_lo", "driving_score_hi")


def json_ready(value):
    """NaN / inf -> None (strict JSON), numpy scalars -> Python, recursively."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def csv_rows(result: dict) -> list[dict]:
    """One row per checkpoint x threshold; the checkpoint-level metrics repeat on each of its rows."""
    rows = []
    for e in result["checkpoints"]:
        cl, rho = e.get("closed_loop") or {}, e.get("rho") or {}
        ci = cl.get("driving_score_ci") or [None, None]
        for r in e["plan"]["sweep"]:
            rows.append({
                "checkpoint": e["path"], "label": e["label"], "mode": e["decode"]["mode"],
                "block_size": e["decode"]["block_size"], "threshold": r["threshold"], "plans": r["plans"],
                "invalid": r["invalid"], "invalid_rate": r["invalid_rate"], "l2_mean": r["l2_mean"],
                **{f"l2_wp{i + 1}": v for i, v in enumerate(r["l2_per_waypoint"])},
                "forward_calls_per_token": r["forward_calls_per_token"], "tokens_per_s": r["tokens_per_s"],
                "token_accuracy": e["teacher_forced"]["token_accuracy"], "rho_k": rho.get("value"),
                "det_precision": e["detection"]["precision"], "det_recall": e["detection"]["recall"],
                "det_map50": e["detection"]["map50"], "ask_exact_match": e["ask"]["exact_match"],
                "driving_score": cl.get("driving_score"), "driving_score_lo": ci[0], "driving_score_hi": ci[1]})
    return json_ready(rows)


def write_outputs(result: dict, out: str | Path) -> list[Path]:
    """eval.json, eval.csv, l2_per_waypoint.png, threshold_sweep.png and (when a run's metrics.csv was found)
    training_curves.png; the figure paths are recorded in eval.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = [CheckpointCurves(e["legend"], e["plan"]["sweep"][0]["l2_per_waypoint"],
                               [SweepPoint(r["threshold"], r["l2_mean"], r["forward_calls_per_token"])
                                for r in e["plan"]["sweep"]]) for e in result["checkpoints"]]
    figures = [plot_l2_per_waypoint(curves, out / "l2_per_waypoint.png"),
               plot_threshold_sweep(curves, out / "threshold_sweep.png")]
    runs = {}
    for e in result["checkpoints"]:
        path = Path(e["metrics_csv"]) if e.get("metrics_csv") else None
        if path is not None and path not in runs.values():
            runs[path.parent.name if path.parent.name not in runs else str(path.parent)] = path
    training = plot_training_curves(runs, out / "training_curves.png")
    figures += [training] if training else []
    result["figures"] = [str(p) for p in figures]
    with (out / "eval.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(result))
    (out / "eval.json").write_text(json.dumps(json_ready(result), indent=1) + "\n")
    return [out / "eval.json", out / "eval.csv", *figures]
