"""Temporal plan blending: a new plan averaged with the still-running earlier plans at the same instants.

A planner that re-plans every ``1 / rate`` seconds gives a fresh 4 s plan each time, and consecutive plans of a
small model disagree: the follower then chases whichever came last. ``PlanBlender`` replaces each new plan by the
weighted mean, waypoint by waypoint, of where the recent valid plans put the ego at that waypoint's instant (world
frame, linear in time along each plan; a plan whose horizon ended before that instant drops out). A plan weighs
``exp(-age / tau_s)``, its age counted back from the new plan's stamp, so the new plan weighs 1; ``tau_s = 0`` turns
blending off. Invalid plans pass through and are not remembered. Plans are blended raw: a blended plan never feeds
the next blend.

The price is reaction time: a plan that suddenly brakes is followed at the blend's speed, which reaches the new
plan's only as the earlier plans fade (at 5 Hz and tau 0.5 s the eight kept plans weigh ~2 together, the new one 1).
Pulling blended waypoints back to the newest plan's distance from the ego, so that a stop passes unblended, drove
worse on the validation episodes (45.0 against 54.3; docs/experiments.md, plan blending): it makes
every blend at most as fast as the slowest recent plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from wamdiff_ros.control.follower import TrackedPlan

MIN_WEIGHT = 1e-3  # plans that would weigh less are skipped


class PlanBlender:
    def __init__(self, tau_s: float, keep: int = 8) -> None:
        if not (math.isfinite(tau_s) and tau_s >= 0):
            raise ValueError(f"tau_s: expected a finite number >= 0, got {tau_s}")
        if keep < 1:
            raise ValueError(f"keep: expected >= 1, got {keep}")
        self.tau_s = float(tau_s)
        # per remembered plan: its stamp, the instants of its path (origin first) and that path in the world frame,
        # computed once when it is remembered rather than at every later blend
        self._plans: deque[tuple[float, np.ndarray, np.ndarray]] = deque(maxlen=keep)

    def reset(self) -> None:
        self._plans.clear()

    def __call__(self, plan: TrackedPlan) -> TrackedPlan:
        if not plan.valid or self.tau_s == 0.0:
            return plan
        times = plan.stamp + plan.dt * np.arange(1, len(plan.waypoints) + 1)
        total = plan.origin.to_world(plan.waypoints)
        weight = np.ones(len(times))
        for stamp, old_times, world in self._plans:
            age = plan.stamp - stamp
            w = math.exp(-age / self.tau_s) if age >= 0 else 0.0
            if w < MIN_WEIGHT:
                continue
            inside = times <= old_times[-1] + 1e-9
            if not inside.any():
                continue
            total[inside] += w * np.stack([np.interp(times[inside], old_times, world[:, i]) for i in (0, 1)], axis=1)
            weight[inside] += w
        self._plans.append((plan.stamp, plan.stamp + plan.dt * np.arange(len(times) + 1),
                            plan.origin.to_world(plan.path())))
        return dataclasses.replace(plan, waypoints=plan.origin.to_ego(total / weight[:, None]))
