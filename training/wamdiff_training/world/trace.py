"""Where a planner's plan parts from the expert's along its own drive. ``wamdiff-train trace``.

The planner drives one closed-loop episode exactly as ``wamdiff-eval closed-loop`` runs it (``run_episode``, paused
or real time). At every plan request the privileged expert plans too, from the same state: it labels, it does not
drive, as in a DAgger export. Each row holds the time, the ego's pose and speed, the command, the route points the
planner was given (``World.route_points``), both plans (ego frame, x forward, y left)
and the **gap**: the distance between the two plans' last waypoints (4 s). A per-scenario driving score says that a
route was lost; the trace says when and how: whether the plan goes straight while the expert's already turns, or
brakes late for the car ahead.

With route variants (a model that reads the route line) the planner also plans from each state with another route
line, which does not drive: ``straight`` (the route straight ahead) or ``mirror`` (the world's route mirrored left to
right). Whether the plan moves with them says whether the model reads the route line at that state.

``plot`` draws the drive from above with both plans at every plan time (world frame) and the route points.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.world.closed_loop import ClosedLoopPlanner, LoopConfig, Observation, PlanResult, run_episode
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.metrics import EpisodeLog
from wamdiff_ros.world.report import draw_road, save_bev
from wamdiff_ros.world.scenarios import ScenarioSet, ScenarioSpec

PARTS_M = 2.0  # a sideways gap at 4 s of at least this counts as the plans parting (a lane is 4 m wide)
ROUTE_VARIANTS = ("straight", "mirror")


def route_variant(name: str, route: np.ndarray) -> np.ndarray:
    """``route`` (ego frame, (N, 2)) as the variant ``name`` asks: straight ahead at the same distances, or mirrored
    left to right."""
    route = np.asarray(route, np.float64)
    if name == "straight":
        return np.stack([np.asarray(fmt.ROUTE_AHEAD_M, np.float64), np.zeros(len(route))], axis=1)
    if name == "mirror":
        return route * (1.0, -1.0)
    raise ValueError(f"route variant: expected one of {ROUTE_VARIANTS}, got {name!r}")


def check_route_variants(names: tuple[str, ...]) -> None:
    """Raises ValueError unless every name is a route variant."""
    unknown = sorted(set(names) - set(ROUTE_VARIANTS))
    if unknown:
        raise ValueError(f"expected some of {', '.join(ROUTE_VARIANTS)}, got {', '.join(unknown)}")


@dataclass(frozen=True, slots=True)
class TraceRow:
    t: float
    pose: Pose2D
    speed: float
    command: str
    route: np.ndarray | None  # (len(ROUTE_AHEAD_M), 2) ego frame: the route points the planner was given
    planner: np.ndarray | None  # (8, 2) ego frame; None for an invalid plan
    expert: np.ndarray  # (8, 2) ego frame
    variants: dict[str, np.ndarray | None] = field(default_factory=dict)  # route variant -> its plan (None: invalid)

    @property
    def gap_m(self) -> float | None:
        """Distance between the two plans' last waypoints (None for an invalid plan)."""
        return None if self.planner is None else float(np.hypot(*(self.planner[-1] - self.expert[-1])))

    @property
    def sideways_gap_m(self) -> float | None:
        """The planner's last sideways offset minus the expert's (positive: further left)."""
        return None if self.planner is None else float(self.planner[-1, 1] - self.expert[-1, 1])

    def to_json(self) -> dict:
        def pts(a):
            return None if a is None else np.round(np.asarray(a, np.float64), 2).tolist()

        gap, side = self.gap_m, self.sideways_gap_m
        return {"t": round(self.t, 2), "x": round(self.pose.x, 2), "y": round(self.pose.y, 2),
                "heading": round(self.pose.heading, 4), "speed": round(self.speed, 2), "command": self.command,
                "route": pts(self.route), "planner": pts(self.planner), "expert": pts(self.expert),
                "gap_m": None if gap is None else round(gap, 2),
                "sideways_gap_m": None if side is None else round(side, 2),
                "variants": {k: pts(v) for k, v in self.variants.items()}}


class TracingPlanner:
    """Wraps a closed-loop planner: passes its plans through unchanged and records a ``TraceRow`` per plan, with
    the expert's plan from the same state."""

    def __init__(self, planner: ClosedLoopPlanner, route_variants: tuple[str, ...] = ()) -> None:
        check_route_variants(tuple(route_variants))  # before the episode
        self.inner, self.name, self.needs_camera = planner, planner.name, planner.needs_camera
        self.route_variants = tuple(route_variants)
        self.rows: list[TraceRow] = []
        self._expert: Expert | None = None

    def reset(self, world) -> None:
        self.inner.reset(world)
        self._expert, self.rows = Expert(world), []

    def plan(self, obs: Observation, route: np.ndarray | None = None) -> PlanResult:
        result = self.inner.plan(obs, route=route)
        expert = np.asarray(self._expert.plan().waypoints, np.float64)
        variants = {}
        for name in self.route_variants:
            other = self.inner.plan(obs, route=route_variant(name, route))
            variants[name] = np.asarray(other.waypoints, np.float64) if other.valid else None
        w = obs.world
        self.rows.append(TraceRow(float(w.t), w.ego_pose, float(w.ego_speed), obs.command.value,
                                  None if route is None else np.asarray(route, np.float64),
                                  np.asarray(result.waypoints, np.float64) if result.valid else None, expert,
                                  variants))
        return result


def trace(planner: ClosedLoopPlanner, spec: ScenarioSpec, seed: int, config: LoopConfig = LoopConfig(),
          scenarios: ScenarioSet | None = None,
          route_variants: tuple[str, ...] = ()) -> tuple[list[TraceRow], EpisodeLog]:
    """One episode of ``spec`` at ``seed`` driven by ``planner``: its rows and the episode's log."""
    tracing = TracingPlanner(planner, route_variants)
    result = run_episode(spec, seed, tracing, config, scenarios)
    return tracing.rows, result.log


def summarize(rows: list[TraceRow]) -> dict:
    """Plans, invalid plans, the mean and largest gap at 4 s, and when the plans first part sideways by
    ``PARTS_M`` (None: never)."""
    gaps = [r.gap_m for r in rows if r.gap_m is not None]
    parts = next((r.t for r in rows if r.sideways_gap_m is not None and abs(r.sideways_gap_m) >= PARTS_M), None)
    return {"plans": len(rows), "invalid_plans": sum(r.planner is None for r in rows),
            "mean_gap_m": round(float(np.mean(gaps)), 2) if gaps else None,
            "max_gap_m": round(float(np.max(gaps)), 2) if gaps else None,
            "parts_at_s": None if parts is None else round(parts, 2)}


def plot(rows: list[TraceRow], log: EpisodeLog, path: str | Path, road=None, title: str | None = None) -> Path:
    """Bird's-eye PNG around the drive: the ego's path, at every plan time the planner's plan (blue) and the
    expert's (orange) in the world frame, the route points (green), lane borders (grey) when ``road`` is given."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 9), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    seen: list[np.ndarray] = [np.stack([log.x, log.y], axis=1)] if log.steps else []
    labelled: set[str] = set()

    def label(name: str) -> str | None:  # each legend entry once
        return None if name in labelled or labelled.add(name) else name

    for r in rows:
        for pts, colour, name in ((r.planner, "C0", f"{log.planner} (drives)"), (r.expert, "C1", "expert (labels)")):
            if pts is None:
                continue
            xy = r.pose.to_world(np.vstack([[0.0, 0.0], pts]))
            seen.append(xy)
            ax.plot(xy[:, 0], xy[:, 1], "-", color=colour, linewidth=0.9, alpha=0.7, marker=".", markersize=3,
                    label=label(name), zorder=3)
        if r.route is not None:
            xy = r.pose.to_world(r.route)
            ax.plot(xy[:, 0], xy[:, 1], "x", color="C2", markersize=5, label=label("route points"), zorder=4)
    if log.steps:
        ax.plot(log.x, log.y, color="0.2", linewidth=1.8, label="driven", zorder=2)
        ax.plot(log.x[-1], log.y[-1], "s", color="0.2", markersize=6, zorder=5)
    pts = np.concatenate(seen) if seen else np.zeros((1, 2))
    lo, hi = pts.min(axis=0) - 10.0, pts.max(axis=0) + 10.0
    draw_road(ax, road)
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal", adjustable="box")
    ax.legend(loc="best", fontsize=8)
    return save_bev(fig, ax, path, title or f"{log.scenario} seed {log.seed}: {log.end_reason}")
