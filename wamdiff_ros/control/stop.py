"""The fallback stop: what a planner that has no usable plan in time answers (the node, the closed-loop world). No
ROS, torch or simulator imports."""

from __future__ import annotations

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.geometry import world_to_ego


def to_ego(points_odom: np.ndarray, pose: tuple[float, float, float]) -> np.ndarray:
    """Odometry-frame points -> the ego frame at ``pose`` (x, y, yaw)."""
    x, y, yaw = (float(v) for v in pose)
    return world_to_ego(points_odom, x, y, yaw)


def fallback_stop(
    speed: float, last_path_odom: np.ndarray | None, pose: tuple[float, float, float], decel: float = 2.0
) -> np.ndarray:
    """A comfortable stop: 8 ego-frame waypoints that brake at ``decel`` m/s^2 from ``speed`` along the last valid
    path (straight ahead without one), at rest from the stopping point on (if the 4 s horizon reaches it). Only the
    path's points that lie further ahead than every earlier one are followed, so a plan whose waypoints step back
    (a trained model's noisy plan can) still gives a stop that never reverses."""
    speed = max(0.0, float(speed)) if np.isfinite(speed) else 0.0
    t = fmt.WAYPOINT_DT_S * np.arange(1, fmt.NUM_WAYPOINTS + 1)
    t_stop = speed / decel
    s = np.where(t < t_stop, speed * t - 0.5 * decel * t**2, 0.5 * speed * t_stop)
    polyline = np.zeros((1, 2))
    if last_path_odom is not None and np.isfinite(last_path_odom).all():
        ahead = to_ego(last_path_odom, pose)
        ahead = ahead[ahead[:, 0] > np.maximum.accumulate(np.concatenate([[0.0], ahead[:-1, 0]]))]
        polyline = np.concatenate([polyline, ahead])
    if len(polyline) == 1:
        polyline = np.array([[0.0, 0.0], [1.0, 0.0]])
    seg = np.diff(polyline, axis=0)
    length = np.linalg.norm(seg, axis=1)
    keep = length > 1e-6
    seg, length = seg[keep], length[keep]
    start = np.concatenate([[0.0], np.cumsum(length)])[:-1]
    out = np.empty((len(s), 2))
    for i, si in enumerate(s):
        j = min(int(np.searchsorted(start, si, side="right")) - 1, len(seg) - 1)
        out[i] = polyline[:-1][keep][j] + seg[j] / length[j] * (si - start[j])
    return out.astype(np.float32)
