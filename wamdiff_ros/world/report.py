"""The closed-loop evaluation report: Markdown tables, ``report.json`` and bird's-eye trajectory plots.

Plots use matplotlib's Agg canvas directly (no pyplot), so nothing here touches a display or global figure state.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wamdiff_ros.world.metrics import COLLISIONS, EpisodeLog, EpisodeScore
from wamdiff_ros.world.summary import summarize
from wamdiff_ros.world.types import RoadGeometry


@dataclass(slots=True)
class ReportPaths:
    json: Path
    markdown: Path
    bev: list[Path] = field(default_factory=list)


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def markdown_table(summary: Mapping[str, Any]) -> str:
    """Markdown for a :func:`~wamdiff_ros.world.summary.summarize` result: one row per planner x mode (Bench2Drive
    columns: DS with its bootstrap CI, SR, RC, penalty; then collisions, comfort and plan latency), a per-scenario DS
    table, and the paired DS differences when two planners ran the same episodes."""
    level = round(100 * summary.get("level", 0.9))
    lines = [
        f"| planner | mode | episodes | DS [{level}% CI] | SR % | RC | penalty | collisions/ep | at-fault/ep "
        f"| comfort | plan p50 ms |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in summary["groups"]:
        lines.append(
            f"| {g['planner']} | {g['mode']} | {g['episodes']} | {_num(g['ds'])} [{_num(g['ds_lo'])}, "
            f"{_num(g['ds_hi'])}] | {_num(g['sr'])} | {_num(g['rc'])} | {_num(g['penalty'], 3)} "
            f"| {_num(g['collisions_per_ep'], 2)} | {_num(g['at_fault_per_ep'], 2)} | {_num(g['comfort'])} "
            f"| {_num(g['latency_p50_ms'])} |")
    columns = [(g["planner"], g["mode"]) for g in summary["groups"]]
    scenarios = sorted({row["scenario"] for row in summary["per_scenario"]})
    ds = {(row["scenario"], row["planner"], row["mode"]): row for row in summary["per_scenario"]}
    lines += ["", "Driving score per scenario (mean over seeds; episodes in parentheses)", "",
              "| scenario | " + " | ".join(f"{p} ({m})" for p, m in columns) + " |",
              "|---|" + "---:|" * len(columns)]
    for scenario in scenarios:
        cells = []
        for planner, mode in columns:
            row = ds.get((scenario, planner, mode))
            cells.append("-" if row is None else f"{_num(row['ds'])} ({row['episodes']})")
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    rest = [g for g in summary["groups"] if g.get("rest_starts")]
    if rest:
        lines += ["", "Starts from rest: the ego moved 10 m along its route within 5 s", "",
                  "| planner | mode | succeeded | of |", "|---|---|---:|---:|"]
        for g in rest:
            lines.append(f"| {g['planner']} | {g['mode']} | {g['rest_starts_ok']} "
                         f"({_num(100.0 * g['rest_starts_ok'] / g['rest_starts'])} %) | {g['rest_starts']} |")
    phases = [row for row in summary["per_scenario"] if row.get("unfinished_phases")]
    if phases:
        lines += ["", "Junction routes cut short: where each ended (before the ring or box, in it, past the point "
                  "where the route leaves it)", "",
                  "| scenario | planner | mode | approach | junction | exit |", "|---|---|---|---:|---:|---:|"]
        for row in phases:
            n = row["unfinished_phases"]
            lines.append(f"| {row['scenario']} | {row['planner']} | {row['mode']} | {n.get('approach', 0)} "
                         f"| {n.get('junction', 0)} | {n.get('exit', 0)} |")
    if summary.get("paired"):
        lines += ["", f"Paired DS difference over matched episodes (same scenario and seed), {level}% CI", "",
                  "| mode | A | B | episodes | DS A - B [CI] |", "|---|---|---|---:|---|"]
        for p in summary["paired"]:
            lines.append(f"| {p['mode']} | {p['a']} | {p['b']} | {p['episodes']} | {_num(p['ds_diff'])} "
                         f"[{_num(p['ds_diff_lo'])}, {_num(p['ds_diff_hi'])}] |")
    return "\n".join(lines) + "\n"


def _event_xy(log: EpisodeLog, t: float, x: float, y: float) -> tuple[float, float]:
    # Events the simulator logged without a location (0, 0) are drawn at the ego's position at that time.
    if (x != 0.0 or y != 0.0) or log.steps == 0:
        return x, y
    return float(np.interp(t, log.t, log.x)), float(np.interp(t, log.t, log.y))


def plot_bev(logs: Sequence[EpisodeLog], path: str | Path, road: RoadGeometry | None = None,
             title: str | None = None) -> Path:
    """Bird's-eye PNG of the episodes' ego trajectories in the world frame: one colour per planner (and mode),
    start (circle) / end (square) markers, collisions (X at fault, hollow circle not at fault), the road's lane
    borders in grey when ``road`` is given; equal aspect, legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=_figure_size(logs, road), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    draw_road(ax, road)
    palette = [f"C{i}" for i in range(10)]
    colours: dict[str, str] = {}
    labelled: set[str] = set()
    collided = {"at fault": False, "not at fault": False}
    for log in logs:
        name = f"{log.planner} ({log.mode})"
        colour = colours.setdefault(name, palette[len(colours) % len(palette)])
        label = None if name in labelled else name
        labelled.add(name)
        ax.plot(log.x, log.y, color=colour, linewidth=1.6, label=label, zorder=3)
        if log.steps:
            ax.plot(log.x[0], log.y[0], "o", color=colour, markersize=6, zorder=4)
            ax.plot(log.x[-1], log.y[-1], "s", color=colour, markersize=6, zorder=4)
        for e in log.events:
            if e.kind not in COLLISIONS:
                continue
            ex, ey = _event_xy(log, e.t, e.x, e.y)
            if e.at_fault:
                ax.plot(ex, ey, "X", color="red", markersize=10, markeredgecolor="black", zorder=5)
            else:
                ax.plot(ex, ey, "o", markerfacecolor="none", markeredgecolor="red", markersize=10, zorder=5)
            collided["at fault" if e.at_fault else "not at fault"] = True
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", color="0.3", linestyle="none", label="start"),
                Line2D([], [], marker="s", color="0.3", linestyle="none", label="end")]
    if collided["at fault"]:
        handles.append(Line2D([], [], marker="X", color="red", markeredgecolor="black", linestyle="none",
                              markersize=9, label="collision (at fault)"))
    if collided["not at fault"]:
        handles.append(Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="red", linestyle="none",
                              markersize=9, label="collision (not at fault)"))
    if road is not None:
        handles.append(Line2D([], [], color="0.6", linewidth=0.8, label="lane borders"))
    ax.legend(handles=handles, loc="best", fontsize=8)
    ax.set_aspect("equal", adjustable="datalim")
    if title is None and logs:
        title = ", ".join(sorted({f"{log.scenario} seed {log.seed}" for log in logs}))
    return save_bev(fig, ax, path, title)


def draw_road(ax, road: RoadGeometry | None) -> None:
    """The road's lane borders in grey under a bird's-eye plot (nothing without a road)."""
    if road is None:
        return
    for lane in road.lanes:
        for border in lane.borders():
            ax.plot(border[:, 0], border[:, 1], color="0.6", linewidth=0.8, zorder=1)


def save_bev(fig, ax, path: str | Path, title: str | None) -> Path:
    """A bird's-eye figure's axis labels (world frame, metres), title and grid, saved as a PNG at ``path``."""
    ax.set_xlabel("x east [m]")
    ax.set_ylabel("y north [m]")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _figure_size(logs: Sequence[EpisodeLog], road: RoadGeometry | None) -> tuple[float, float]:
    # Highway scenes are long and thin: shape the figure after the data so the equal-aspect plot is not a sliver.
    xs = [log.x for log in logs if log.steps] + ([lane.centre[:, 0] for lane in road.lanes] if road else [])
    ys = [log.y for log in logs if log.steps] + ([lane.centre[:, 1] for lane in road.lanes] if road else [])
    if not xs:
        return 9.0, 6.0
    span_x = max(float(np.ptp(np.concatenate(xs))), 1.0)
    span_y = max(float(np.ptp(np.concatenate(ys))), 1.0)
    return 10.0, float(np.clip(10.0 * span_y / span_x + 1.5, 4.0, 10.0))


def write_report(scores: Sequence[EpisodeScore], logs: Sequence[EpisodeLog], out_dir: str | Path,
                 roads: Mapping[str, RoadGeometry] | None = None, bev_per_scenario: int = 1,
                 level: float = 0.9) -> ReportPaths:
    """Write ``report.json`` (per-episode scores and the totals of :func:`summarize`), ``report.md`` (the tables of
    :func:`markdown_table`) and, for the first ``bev_per_scenario`` seeds of each scenario,
    ``bev/<scenario>_seed<N>.png`` with every planner's run of that episode (lanes from ``roads[scenario]``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(scores, level=level)
    json_path = out / "report.json"
    json_path.write_text(json.dumps({"episodes": [s.to_json() for s in scores], "summary": summary}, indent=1))
    md_path = out / "report.md"
    md_path.write_text("# Closed-loop evaluation (Bench2Drive / CARLA Leaderboard 2.0 metrics)\n\n"
                       + markdown_table(summary))
    by_episode: dict[tuple[str, int], list[EpisodeLog]] = defaultdict(list)
    for log in logs:
        by_episode[(log.scenario, log.seed)].append(log)
    seeds: dict[str, list[int]] = defaultdict(list)
    for scenario, seed in sorted(by_episode):
        seeds[scenario].append(seed)
    bev = []
    for scenario, scenario_seeds in seeds.items():
        for seed in scenario_seeds[:bev_per_scenario]:
            road = roads.get(scenario) if roads else None
            bev.append(plot_bev(by_episode[(scenario, seed)], out / "bev" / f"{_safe(scenario)}_seed{seed}.png",
                                road=road))
    return ReportPaths(json=json_path, markdown=md_path, bev=bev)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
