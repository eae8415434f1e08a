"""The robustness report: closed-loop driving under each deployment perturbation (``perturb.py``) and severity next
to clean, paired by seed, for the model and the baselines, with the node's answers (``closed_loop.ANSWERS``) off and
on. ``wamdiff-eval robustness`` runs the cells (``run``) and writes ``robustness.md``, ``robustness.json`` and
``robustness.png`` (DS against severity); episodes go to ``episodes.jsonl`` as they finish, so a killed run resumes
where it stopped."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wamdiff_ros.world.metrics import EpisodeLog, EpisodeScore, score_episode
from wamdiff_ros.world.perturb import NAMES, SEVERITIES, Perturbation, label
from wamdiff_ros.world.summary import paired_difference_ci

CLEAN = "clean"


def default_cells(names: Sequence[str] = NAMES) -> list[tuple[Perturbation, ...]]:
    """Clean, then every named perturbation alone at each severity."""
    return [()] + [(Perturbation(name, severity),) for name in names for severity in SEVERITIES]


@dataclass(frozen=True, slots=True)
class Key:
    cell: str  # perturb.label
    answers: bool
    planner: str
    mode: str
    scenario: str
    seed: int


def key_of(record: dict) -> Key:
    return Key(record["cell"], bool(record["answers"]), record["planner"], record["mode"], record["scenario"],
               int(record["seed"]))


class EpisodeStore:
    """``episodes.jsonl``: one line per finished episode ({cell, answers, log}); what is there is not run again."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records: dict[Key, dict] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    try:
                        record = json.loads(line)
                        self.records[key_of({**record, **_log_key(record["log"])})] = record
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut by a kill: that episode runs again

    def add(self, cell: str, answers: bool, log: dict) -> None:
        record = {"cell": cell, "answers": answers, "log": log}
        self.records[key_of({**record, **_log_key(log)})] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut = False
        if self.path.is_file() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:
                f.seek(-1, 2)
                cut = f.read(1) != b"\n"
        with self.path.open("a") as f:
            f.write(("\n" if cut else "") + json.dumps(record) + "\n")  # after a line a kill cut short

    def __contains__(self, key: Key) -> bool:
        return key in self.records

    def scores(self) -> list[tuple[Key, EpisodeScore]]:
        return [(k, score_episode(EpisodeLog.from_json(r["log"]))) for k, r in sorted(
            self.records.items(), key=lambda kv: (kv[0].cell, kv[0].answers, kv[0].planner, kv[0].mode,
                                                  kv[0].scenario, kv[0].seed))]


def _log_key(log: dict) -> dict:
    return {"planner": log["planner"], "mode": log["mode"], "scenario": log["scenario"], "seed": log["seed"]}


def summarize(scores: Sequence[tuple[Key, EpisodeScore]], cells: Sequence[str], level: float = 0.9) -> dict:
    """Per (planner, mode, answers) and cell: episodes, mean DS, route completion, infractions per episode, and the
    paired DS difference against clean with its CI; per (planner, mode) and cell: answers on - off, paired."""
    by: dict[tuple, dict[tuple, EpisodeScore]] = {}
    for k, s in scores:
        by.setdefault((k.planner, k.mode, k.answers, k.cell), {})[(k.scenario, k.seed)] = s
    rows = []
    for planner, mode, answers in sorted({(p, m, a) for p, m, a, _ in by}):
        clean = by.get((planner, mode, answers, CLEAN), {})
        for cell in cells:
            mine = by.get((planner, mode, answers, cell))
            if not mine:
                continue
            ds = [s.driving_score for s in mine.values()]
            row = {"planner": planner, "mode": mode, "answers": answers, "cell": cell, "episodes": len(mine),
                   "ds": float(np.mean(ds)), "route_completion": float(np.mean([s.route_completion
                                                                                for s in mine.values()])),
                   "infractions_per_ep": float(np.mean([sum(s.infractions.values()) for s in mine.values()])),
                   "collisions_per_ep": float(np.mean([s.collisions for s in mine.values()]))}
            shared = sorted(mine.keys() & clean.keys())
            if cell != CLEAN and shared:
                diff, lo, hi = paired_difference_ci([mine[k].driving_score for k in shared],
                                                    [clean[k].driving_score for k in shared], level=level)
                row.update(vs_clean=diff, vs_clean_lo=lo, vs_clean_hi=hi, vs_clean_episodes=len(shared))
            rows.append(row)
    answers_rows = []
    for planner, mode in sorted({(p, m) for p, m, _, _ in by}):
        for cell in cells:
            on, off = by.get((planner, mode, True, cell), {}), by.get((planner, mode, False, cell), {})
            shared = sorted(on.keys() & off.keys())
            if not shared:
                continue
            diff, lo, hi = paired_difference_ci([on[k].driving_score for k in shared],
                                                [off[k].driving_score for k in shared], level=level)
            answers_rows.append({"planner": planner, "mode": mode, "cell": cell, "episodes": len(shared),
                                 "on_minus_off": diff, "lo": lo, "hi": hi})
    return {"level": level, "cells": list(cells), "rows": rows, "answers": answers_rows}


def markdown(summary: dict) -> str:
    pct = round(100 * summary["level"])
    lines = ["# Robustness (deployment perturbations after Bench2Drive-Robust)", "",
             f"DS per cell; in brackets the paired difference against clean with its {pct} % CI (same planner, "
             "answers and seeds).", "",
             "| planner | mode | answers | cell | episodes | DS | vs clean | RC % | infractions / ep |",
             "|---|---|---|---|---:|---:|---|---:|---:|"]
    for r in summary["rows"]:
        vs = (f"{r['vs_clean']:+.1f} [{r['vs_clean_lo']:+.1f}, {r['vs_clean_hi']:+.1f}]" if "vs_clean" in r
              else "")
        lines.append(f"| {r['planner']} | {r['mode']} | {'on' if r['answers'] else 'off'} | {r['cell']} | "
                     f"{r['episodes']} | {r['ds']:.1f} | {vs} | {r['route_completion']:.1f} | "
                     f"{r['infractions_per_ep']:.2f} |")
    if summary["answers"]:
        lines += ["", f"Answers on - off, paired DS difference [{pct} % CI]", "",
                  "| planner | mode | cell | episodes | on - off |", "|---|---|---|---:|---|"]
        for r in summary["answers"]:
            lines.append(f"| {r['planner']} | {r['mode']} | {r['cell']} | {r['episodes']} | "
                         f"{r['on_minus_off']:+.1f} [{r['lo']:+.1f}, {r['hi']:+.1f}] |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> Path:
    """DS against severity (0 = clean), one panel per planner and mode, a line per perturbation; answers on solid,
    off dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["planner"], r["mode"]) for r in summary["rows"]})
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 3.6), squeeze=False)
    colours = dict(zip(NAMES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (planner, mode) in zip(axes[0], groups):
        for answers, style in ((False, "--"), (True, "-")):
            table = {r["cell"]: r["ds"] for r in summary["rows"]
                     if (r["planner"], r["mode"], r["answers"]) == (planner, mode, answers)}
            if not table:
                continue
            for name in NAMES:
                xs, ys = [], []
                for severity in (0, *SEVERITIES):
                    cell = CLEAN if severity == 0 else label([Perturbation(name, severity)])
                    if cell in table:
                        xs.append(severity)
                        ys.append(table[cell])
                if len(xs) > 1:
                    ax.plot(xs, ys, style, marker="o", color=colours[name],
                            label=f"{name} ({'answers on' if answers else 'off'})")
        ax.set_title(f"{planner} ({mode})")
        ax.set_xticks([0, *SEVERITIES], ["clean", *(str(s) for s in SEVERITIES)])
        ax.set_xlabel("severity")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("driving score")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.12 if handles else 0, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
