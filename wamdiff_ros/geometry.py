"""Planar poses and the world <-> ego transforms (the one home of the rotation; ROS-free, numpy only).

Frames: a **world** frame is any fixed right-handed planar frame (a map, odom, the CPU world's east-north frame),
metres, headings counter-clockwise from its x axis in radians. The **ego** frame has its origin at the ego's
reference point, x forward, y left. The Python 3.7 CARLA agent (``carla_bridge/route.py``) keeps its own copy,
since it cannot import numpy-2-era package code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def wrap_angle(a: float) -> float:
    """``a`` wrapped to [-pi, pi)."""
    return (a + math.pi) % (2.0 * math.pi) - math.pi


def rotate_to_ego(dx, dy, heading: float):
    """A world-frame vector (dx, dy) -> its (forward, left) components in the ego frame of a pose with ``heading``
    (a rotation by -heading). Elementwise: floats or arrays of one shape, in their own dtype."""
    c, s = math.cos(heading), math.sin(heading)
    return c * dx + s * dy, -s * dx + c * dy


def world_to_ego(points_xy, x: float, y: float, heading: float) -> np.ndarray:
    """World points (N, 2) -> the ego frame of the pose (x, y, heading), float64 (N, 2)."""
    p = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2) - (x, y)
    return np.stack(rotate_to_ego(p[:, 0], p[:, 1], heading), axis=1)


def ego_to_world(points_xy, x: float, y: float, heading: float) -> np.ndarray:
    """Ego-frame points (N, 2) of the pose (x, y, heading) -> world points, float64 (N, 2)."""
    p = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
    c, s = math.cos(heading), math.sin(heading)
    return np.stack([x + c * p[:, 0] - s * p[:, 1], y + s * p[:, 0] + c * p[:, 1]], axis=1)


@dataclass(frozen=True, slots=True)
class Pose2D:
    x: float
    y: float
    heading: float

    def to_ego(self, points_xy: np.ndarray) -> np.ndarray:
        """World points (N, 2) -> this pose's ego frame (x forward, y left)."""
        return world_to_ego(points_xy, self.x, self.y, self.heading)

    def to_world(self, points_xy: np.ndarray) -> np.ndarray:
        """Ego-frame points (N, 2) of this pose -> world points."""
        return ego_to_world(points_xy, self.x, self.y, self.heading)

    def relative(self, other: Pose2D) -> Pose2D:
        """``other`` expressed in this pose's ego frame."""
        (x, y), = self.to_ego(np.array([[other.x, other.y]]))
        return Pose2D(float(x), float(y), wrap_angle(other.heading - self.heading))
