"""``route_points_ahead``: the route points (``fmt.route_line``) from a route polyline and the ego pose in its frame,
the helper the ROS node (``~/input/route``) uses; checked by hand and against ``World.route_points``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import RouteError
from wamdiff_ros.route_points import route_points_ahead


def _line(start, end, step=1.0) -> np.ndarray:
    start, end = np.asarray(start, float), np.asarray(end, float)
    n = int(round(np.linalg.norm(end - start) / step))
    return start + np.linspace(0.0, 1.0, n + 1)[:, None] * (end - start)


def test_a_straight_path_ahead_gives_10_and_30_m_straight_ahead():
    points = route_points_ahead(_line((0.0, 0.0), (100.0, 0.0)), (0.0, 0.0), 0.0)
    assert points.shape == (len(fmt.ROUTE_AHEAD_M), 2) and points.dtype == np.float64
    np.testing.assert_allclose(points, [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)
    # only two points: the segment is enough
    np.testing.assert_allclose(route_points_ahead([[0.0, 0.0], [100.0, 0.0]], (0.0, 0.0), 0.0),
                               [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)


def test_the_ego_is_projected_onto_the_path_from_an_offset_and_from_behind():
    path = _line((0.0, 0.0), (100.0, 0.0))
    # 2 m left of the path at x = 20: the projection is (20, 0); the points lie 2 m to the ego's right
    np.testing.assert_allclose(route_points_ahead(path, (20.0, 2.0), 0.0), [[10.0, -2.0], [30.0, -2.0]], atol=1e-9)
    # 5 m behind the path's start: the walk starts at its first point
    np.testing.assert_allclose(route_points_ahead(path, (-5.0, 0.0), 0.0), [[15.0, 0.0], [35.0, 0.0]], atol=1e-9)
    # between two samples of a coarse path: the projection lies on the segment, not on its nearest vertex
    coarse = np.array([[0.0, 0.0], [50.0, 0.0], [100.0, 0.0]])
    np.testing.assert_allclose(route_points_ahead(coarse, (12.3, -1.0), 0.0), [[10.0, 1.0], [30.0, 1.0]],
                               atol=1e-9)


def test_an_l_shaped_right_turn_puts_the_far_point_to_the_right():
    """A path 20 m north, then east (a right turn for an ego heading north): the 10 m point is straight ahead, the
    30 m point 10 m along the east leg, i.e. 20 m ahead and 10 m to the right."""
    path = np.concatenate([_line((0.0, 0.0), (0.0, 20.0)), _line((0.0, 20.0), (60.0, 20.0))[1:]])
    points = route_points_ahead(path, (0.0, 0.0), math.pi / 2)
    np.testing.assert_allclose(points, [[10.0, 0.0], [20.0, -10.0]], atol=1e-9)
    assert points[1, 1] < 0.0
    left = route_points_ahead(path * (-1.0, 1.0), (0.0, 0.0), math.pi / 2)  # mirrored: a left turn
    np.testing.assert_allclose(left, [[10.0, 0.0], [20.0, 10.0]], atol=1e-9)


def test_the_points_stop_at_the_paths_last_point():
    path = _line((0.0, 0.0), (100.0, 0.0))
    np.testing.assert_allclose(route_points_ahead(path, (85.0, 0.0), 0.0), [[10.0, 0.0], [15.0, 0.0]], atol=1e-9)
    np.testing.assert_allclose(route_points_ahead(path, (120.0, 0.0), 0.0), [[-20.0, 0.0], [-20.0, 0.0]],
                               atol=1e-9)


@pytest.mark.parametrize("yaw", [0.3, -1.2, math.pi, 2.5])
def test_the_ego_yaw_rotates_the_points_into_the_ego_frame(yaw):
    """The same straight path seen from an ego turned ``yaw`` left of it: the points turn ``yaw`` to the right;
    and a path rotated with the ego (the whole scene rotated and shifted) gives the same ego-frame points."""
    path = _line((0.0, 0.0), (100.0, 0.0))
    expected = np.array([[d * math.cos(yaw), -d * math.sin(yaw)] for d in fmt.ROUTE_AHEAD_M])
    np.testing.assert_allclose(route_points_ahead(path, (0.0, 0.0), yaw), expected, atol=1e-9)
    c, s = math.cos(yaw), math.sin(yaw)
    turned = path @ np.array([[c, s], [-s, c]]) + (7.0, -3.0)  # rotate by yaw, then shift
    np.testing.assert_allclose(route_points_ahead(turned, (7.0, -3.0), yaw), [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)


def test_repeated_points_are_ignored():
    path = np.array([[0.0, 0.0], [0.0, 0.0], [50.0, 0.0], [50.0, 0.0], [100.0, 0.0]])
    np.testing.assert_allclose(route_points_ahead(path, (45.0, 0.0), 0.0), [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)


@pytest.mark.parametrize(
    ("path", "ego", "yaw", "message"),
    [
        (np.zeros((1, 2)), (0.0, 0.0), 0.0, "at least 2 points"),
        (np.zeros((0, 2)), (0.0, 0.0), 0.0, "at least 2 points"),
        (np.zeros((3, 3)), (0.0, 0.0), 0.0, "shape"),
        (np.zeros(4), (0.0, 0.0), 0.0, "shape"),
        ([[0.0, 0.0], [math.nan, 1.0]], (0.0, 0.0), 0.0, "finite"),
        ([[0.0, 0.0], [math.inf, 1.0]], (0.0, 0.0), 0.0, "finite"),
        ([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], (0.0, 0.0), 0.0, "zero length"),
        ([[0.0, 0.0], [10.0, 0.0]], (math.nan, 0.0), 0.0, "finite"),
        ([[0.0, 0.0], [10.0, 0.0]], (0.0, 0.0), math.inf, "finite"),
        ([[0.0, 0.0], [10.0, 0.0]], (0.0, 0.0, 0.0), 0.0, "finite"),
        ("ahead", (0.0, 0.0), 0.0, "expected"),
    ],
)
def test_bad_input_raises_a_route_error(path, ego, yaw, message):
    with pytest.raises(RouteError, match=message) as info:
        route_points_ahead(path, ego, yaw)
    assert isinstance(info.value, ValueError)


def test_it_agrees_with_the_worlds_route_points_at_an_intersection():
    """The route lanes of a right-turn intersection episode sampled every 0.5 m (in the world frame, as
    ``World.route_points`` mirrors them) and the ego pose in that frame: the helper gives the world's points within
    0.1 m, far from the turn and close to it (the far point in the turn)."""
    from wamdiff_training.world.recoveries import displace_ego
    from wamdiff_ros.world.scenarios import load_scenarios
    from wamdiff_ros.world.sim import World, mirror

    scenarios = load_scenarios()
    spec = scenarios.get("intersection")
    seed = next(s for s in range(50) if World(spec, s, scenarios).exit_direction == "right")
    first = World(spec, seed, scenarios)
    room = first.ego.lane.length - first.ego.lane.local_coordinates(first.ego.position)[0]
    turned = 0
    for along, offset, heading in [(0.0, 0.0, 0.0), (room - 25.0, 0.5, 0.05), (room - 8.0, -0.4, -0.1),
                                   (room - 2.0, 0.0, 0.0)]:
        world = World(spec, seed, scenarios)
        displace_ego(world, world.ego.lane_index[2], along, offset, heading)
        route, k = world.route, world._k
        lanes = route.lane_sequence(k, route.nearest_lane(k, world.ego.position))
        samples = [lane.position(s, 0.0) for lane in lanes for s in np.arange(0.0, lane.length, 0.5)]
        samples.append(lanes[-1].position(lanes[-1].length, 0.0))
        pose = world.ego_pose
        expected = world.route_points()
        got = route_points_ahead(mirror(np.asarray(samples)), (pose.x, pose.y), pose.heading)
        np.testing.assert_allclose(got, expected, atol=0.1)
        turned += expected[1, 1] < -5.0
    assert turned >= 2  # the states near the box do reach into the right turn
