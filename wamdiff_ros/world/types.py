"""Plain data shared by the world, the renderer, the expert and the metrics (poses: ``wamdiff_ros.geometry``).

Frame convention (stated once; ``wamdiff_ros.format`` states the ego frame the text uses):
- **world frame**: right-handed map frame, x east, y north, metres; heading counter-clockwise from +x, radians.
  highway-env's own frame is a screen frame (y down); ``wamdiff_ros.world.sim`` mirrors it (y -> -y,
  heading -> -heading) and nothing else ever sees highway-env coordinates.
- **ego frame**: origin at the ego's reference point (highway-env: the box centre), x forward, y left, z up.
- Steering angles are front-wheel angles in radians, positive turns left (counter-clockwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wamdiff_ros.geometry import Pose2D


@dataclass(frozen=True, slots=True)
class VehicleBox:
    """Another road user (or static obstacle) as an oriented box; ``pose`` is its centre at ground level."""

    id: int
    pose: Pose2D
    length: float = 5.0
    width: float = 2.0
    height: float = 1.5
    speed: float = 0.0
    rgb: tuple[int, int, int] = (200, 40, 40)
    static: bool = False


# highway-env line types, by name (its LineType ints: NONE 0, STRIPED 1, CONTINUOUS 2, CONTINUOUS_LINE 3)
LINE_NONE, LINE_DASHED, LINE_SOLID = "none", "dashed", "solid"


@dataclass(frozen=True, slots=True)
class LaneStrip:
    """One lane: its centre line sampled in the world frame (N, 2), the width at each sample (N,), and the marking
    on its left and right border (as seen driving along it): ``none`` | ``dashed`` | ``solid`` (a solid outer line is
    the road edge)."""

    centre: np.ndarray
    width: np.ndarray
    left_line: str = LINE_NONE
    right_line: str = LINE_NONE

    def borders(self) -> tuple[np.ndarray, np.ndarray]:
        """(left, right) border polylines (N, 2) in the world frame."""
        c = np.asarray(self.centre, dtype=np.float64)
        d = np.gradient(c, axis=0) if len(c) > 1 else np.array([[1.0, 0.0]])
        d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)
        normal_left = np.stack([-d[:, 1], d[:, 0]], axis=1)
        half = np.asarray(self.width, dtype=np.float64).reshape(-1, 1) / 2.0
        return c + normal_left * half, c - normal_left * half


@dataclass(frozen=True, slots=True)
class RoadGeometry:
    """Every lane of the map, sampled once per episode; the renderer draws surfaces, markings and edges from it.
    ``stop_lines``: painted stop lines, each its two ends (2, 2) in the world frame."""

    lanes: tuple[LaneStrip, ...]
    stop_lines: tuple[np.ndarray, ...] = ()
