"""The plan prompt's optional route points (``fmt.route_line``) from a route polyline: ROS-free, numpy only.

A route source (a ROS ``nav_msgs/Path``, the CARLA agent's dense route) gives the route as points in some fixed
frame; ``route_points_ahead`` turns that and the ego pose in the same frame into the (2, 2) ego-frame array that
``Planner.plan(..., route=)`` takes: the route ``fmt.ROUTE_AHEAD_M`` metres ahead of the ego along the polyline, the
way ``World.route_points`` reads it from the CPU world's lanes.
"""

from __future__ import annotations

import math

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import RouteError
from wamdiff_ros.geometry import world_to_ego

# What a route source publishes for it in the CPU world (the ROS bridge's route/path): the route lane's centre every
# metre from the ego's projection to 60 m ahead, past ``fmt.ROUTE_AHEAD_M``'s farthest point. ``World.route_points``
# counts lane coordinates, which on highway-env's sine lanes (roundabout entries) run longer than the curve: there the
# two differ by up to ~4.5 m at 30 m.
ROUTE_PATH_M = tuple(float(d) for d in range(0, 61))


def route_points_ahead(path_xy, ego_xy, ego_yaw: float, distances=fmt.ROUTE_AHEAD_M) -> np.ndarray:
    """The route ``distances`` metres (default ``fmt.ROUTE_AHEAD_M``) ahead of the ego along the polyline
    ``path_xy`` ((N, 2), N >= 2, metres, in a fixed frame), in the ego frame (x forward, y left), float64
    (len(distances), 2).

    The ego (``ego_xy`` and ``ego_yaw``: radians, counter-clockwise from the frame's x axis) is projected onto the
    nearest point of any segment of the polyline (the earliest segment on a tie); from there the points lie
    ``distances`` metres further along it, clamped at its last point. An ego before the first point starts at the
    first point. Repeated points (zero-length segments) are ignored. Raises ``RouteError`` (a ``ValueError``) for
    fewer than 2 points, a wrong shape, non-finite values or a path of zero length."""
    try:
        path = np.asarray(path_xy, dtype=np.float64)
        ego = np.asarray(ego_xy, dtype=np.float64)
        yaw = float(ego_yaw)
    except (TypeError, ValueError):
        raise RouteError("route path", "expected an (N, 2) array of (x, y) points, an (x, y) ego position and a "
                                       f"yaw; got {path_xy!r}, {ego_xy!r}, {ego_yaw!r}") from None
    if path.ndim != 2 or path.shape[1] != 2:
        raise RouteError("route path", f"expected shape (N, 2), got {path.shape}")
    if len(path) < 2:
        raise RouteError("route path", f"needs at least 2 points, got {len(path)}")
    if not np.isfinite(path).all():
        raise RouteError("route path", "points must be finite")
    if ego.shape != (2,) or not np.isfinite(ego).all() or not math.isfinite(yaw):
        raise RouteError("route ego pose", f"expected a finite (x, y) and yaw, got {ego.tolist()!r}, {yaw!r}")
    ahead = np.asarray(distances, dtype=np.float64).reshape(-1)
    if not np.isfinite(ahead).all():
        raise RouteError("route distances", f"must be finite, got {ahead.tolist()}")

    step = np.diff(path, axis=0)
    length = np.hypot(step[:, 0], step[:, 1])
    keep = np.concatenate([[True], length > 0.0])  # drop repeated points: every segment has a length
    path = path[keep]
    if len(path) < 2:
        raise RouteError("route path", "has zero length (all its points are the same)")
    step = np.diff(path, axis=0)
    length = np.hypot(step[:, 0], step[:, 1])
    along = np.concatenate([[0.0], np.cumsum(length)])  # arc length at each point, strictly increasing

    # the ego's projection: the nearest point on any segment
    t = np.clip(np.einsum("ij,ij->i", ego - path[:-1], step) / length**2, 0.0, 1.0)
    nearest = path[:-1] + t[:, None] * step
    i = int(np.argmin(np.sum((nearest - ego) ** 2, axis=1)))
    s = np.minimum(along[i] + t[i] * length[i] + ahead, along[-1])
    points = np.stack([np.interp(s, along, path[:, 0]), np.interp(s, along, path[:, 1])], axis=1)

    return world_to_ego(points, float(ego[0]), float(ego[1]), yaw)
