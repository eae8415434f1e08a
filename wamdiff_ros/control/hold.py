"""The last valid plan, held: what the node publishes for a frame it does not plan as new (a repeated camera frame,
``input_guard.RepeatedFrameGate``), for at most ``max_plan_age_s`` after that plan's image. No ROS."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.geometry import Pose2D


@dataclass(frozen=True, slots=True, eq=False)  # identity equality: it holds an array
class ValidPlan:
    """A published valid plan, kept to hold: its image's stamp, the ego pose then (odometry frame) and its waypoints
    in the odometry frame (waypoint k where the ego should be at ``stamp + (k + 1) * dt``)."""

    stamp: float
    pose: tuple[float, float, float]
    waypoints_odom: np.ndarray


def held_waypoints(plan: ValidPlan, now: float, pose: tuple[float, float, float],
                   dt: float = fmt.WAYPOINT_DT_S) -> np.ndarray:
    """``plan`` re-timed to ``now`` and re-expressed in the ego frame of ``pose``: waypoint k is where the plan puts
    the ego at ``now + (k + 1) * dt``, interpolated along its timed path (from its origin at ``plan.stamp``) and
    continued at its last step's velocity beyond its horizon. (8, 2) float32, ego frame."""
    path = np.concatenate([np.asarray(plan.pose[:2], np.float64)[None], np.asarray(plan.waypoints_odom, np.float64)])
    times = plan.stamp + dt * np.arange(len(path))
    wanted = now + dt * np.arange(1, fmt.NUM_WAYPOINTS + 1)
    out = np.stack([np.interp(wanted, times, path[:, i]) for i in (0, 1)], axis=1)
    beyond = wanted > times[-1]
    if beyond.any():
        velocity = (path[-1] - path[-2]) / dt
        out[beyond] = path[-1] + (wanted[beyond] - times[-1])[:, None] * velocity
    return Pose2D(*pose).to_ego(out).astype(np.float32)
