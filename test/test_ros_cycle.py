"""The planning cycle's plain parts (no rclpy): latest-frame slot, odometry history, input checks, latency window,
fallback stop."""

import threading
import time

import numpy as np
import pytest

from wamdiff_ros.control.stop import fallback_stop, to_ego
from wamdiff_ros.ros.cycle import InputLimits, LatestSlot, StampedHistory, check_inputs
from wamdiff_ros.stats import Counters, LatencyWindow


def test_latest_slot_keeps_only_the_newest():
    slot: LatestSlot[int] = LatestSlot()
    for i in range(5):
        slot.put(i)
    assert slot.take(0) == 4 and slot.replaced == 4
    assert slot.take(0.01) is None


def test_latest_slot_wakes_a_waiting_taker_and_closes():
    slot: LatestSlot[str] = LatestSlot()
    got = []
    t = threading.Thread(target=lambda: got.append(slot.take(5.0)))
    t.start()
    time.sleep(0.05)
    slot.put("frame")
    t.join(2.0)
    assert got == ["frame"]
    t = threading.Thread(target=lambda: got.append(slot.take(5.0)))
    t.start()
    slot.close()
    t.join(2.0)
    assert not t.is_alive() and got[-1] is None


def test_stamped_history_answers_the_value_nearest_a_stamp_and_starts_over_when_time_goes_back():
    history: StampedHistory[str] = StampedHistory(size=3)
    assert history.at(1.0) is None and history.newest() is None
    for stamp in (0.75, 1.0, 1.25, 1.5):  # exact binary fractions: the tie below is a true tie
        history.add(stamp, f"odom {stamp}")
    assert len(history) == 3  # the oldest fell out
    assert history.at(1.2) == (1.25, "odom 1.25")
    assert history.at(1.375)[0] == 1.25  # equally near: the older
    assert history.at(0.0) == (1.0, "odom 1.0") and history.at(9.0) == (1.5, "odom 1.5")
    assert history.newest() == (1.5, "odom 1.5")
    history.add(0.5, "after a restart")
    assert len(history) == 1 and history.at(1.0) == (0.5, "after a restart")
    history.add(0.6, "b")
    history.drop_after(0.55)
    assert history.newest() == (0.5, "after a restart")
    history.drop_after(0.0)
    assert history.at(1.0) is None


def test_a_frame_whose_odometry_is_still_in_flight_waits_for_it():
    history: StampedHistory[str] = StampedHistory()
    history.add(0.95, "the previous tick")
    got = []
    t = threading.Thread(target=lambda: got.append(history.at(1.0, wait_s=5.0)))
    t.start()
    time.sleep(0.05)
    assert got == []  # still waiting: nothing stamped at or after the frame yet
    history.add(1.0, "the frame's own tick")
    t.join(2.0)
    assert got == [(1.0, "the frame's own tick")]
    start = time.monotonic()
    assert history.at(2.0, wait_s=0.05) == (1.0, "the frame's own tick")  # none comes: the nearest after the wait
    assert 0.04 <= time.monotonic() - start < 1.0


LIMITS = InputLimits(sync_tolerance_s=0.1, command_timeout_s=10.0, future_tolerance_s=0.5)


@pytest.mark.parametrize(
    "image, now, odom, command, reason",
    [
        (10.0, 10.05, 10.02, 9.0, None),
        (12.0, 10.0, 12.0, 9.0, "future stamp"),
        (10.0, 10.0, None, 9.0, "missing odometry"),
        (10.0, 10.0, 9.7, 9.0, "odometry out of sync: 300 ms"),
        (10.0, 10.0, 10.0, None, "missing command"),
        (30.0, 30.0, 30.0, 9.0, "stale command: 21.0 s"),
    ],
)
def test_check_inputs(image, now, odom, command, reason):
    got = check_inputs(image, now, odom, command, LIMITS)
    assert (got is None) if reason is None else got.startswith(reason)


def test_counters_group_skip_reasons():
    c = Counters()
    c.skip("odometry out of sync: 300 ms")
    c.skip("odometry out of sync: 200 ms")
    c.skip("missing command")
    assert c.skipped == 3 and c.reasons == {"odometry out of sync": 2, "missing command": 1}


def test_latency_window_percentiles():
    w = LatencyWindow(size=100)
    assert np.isnan(w.percentile(50))
    for i in range(1, 201):
        w.add(i / 1000)
    assert len(w) == 100
    assert w.percentile(50) == pytest.approx(0.1505, abs=1e-4)
    assert w.percentile(99) == pytest.approx(0.199, abs=1e-3)


def test_to_ego_inverts_the_pose():
    pose = (10.0, 5.0, np.pi / 2)  # facing +y in the odometry frame
    ego = to_ego(np.array([[10.0, 8.0], [7.0, 5.0]]), pose)
    np.testing.assert_allclose(ego, [[3.0, 0.0], [0.0, 3.0]], atol=1e-9)


def test_fallback_brakes_comfortably_to_rest_straight_ahead():
    wp = fallback_stop(6.0, None, (0.0, 0.0, 0.0), decel=2.0)
    assert wp.shape == (8, 2) and wp.dtype == np.float32
    np.testing.assert_allclose(wp[:, 1], 0.0)
    x = wp[:, 0]
    assert np.all(np.diff(x) >= -1e-6) and x[-1] == pytest.approx(9.0) and x[-2] == pytest.approx(9.0)  # v^2/2a
    assert x[0] == pytest.approx(6 * 0.5 - 0.25)
    speeds = np.diff(np.concatenate([[0.0], x])) / 0.5
    assert np.all(np.abs(np.diff(speeds)) / 0.5 <= 2.0 + 1e-3)  # never harder than decel


def test_fallback_follows_the_last_valid_path():
    # last path turns left: a quarter circle of radius 20 m starting at the ego
    theta = np.linspace(0.05, np.pi / 2, 12)
    path = np.stack([20 * np.sin(theta), 20 * (1 - np.cos(theta))], axis=1)
    wp = fallback_stop(8.0, path, (0.0, 0.0, 0.0))
    assert wp[-1, 1] > 0.5  # it bends left with the path
    r = np.hypot(wp[:, 0], wp[:, 1] - 20.0)
    assert np.all(np.abs(r[wp[:, 0] > 1] - 20.0) < 0.6)  # stays near the arc
    still = fallback_stop(0.0, path, (0.0, 0.0, 0.0))
    np.testing.assert_allclose(still, 0.0)
    nan_speed = fallback_stop(float("nan"), None, (0.0, 0.0, 0.0))
    np.testing.assert_allclose(nan_speed, 0.0)


def test_fallback_never_reverses_along_a_path_that_steps_back():
    # a noisy plan: waypoint 3 lies behind waypoint 2 (a trained tiny model's digits can do that)
    path = np.array([[4.0, 0.0], [9.0, 0.5], [6.0, 0.2], [14.0, 1.0], [19.0, 1.5], [17.0, 1.4], [25.0, 2.0],
                     [30.0, 2.5]])
    wp = fallback_stop(10.0, path, (0.0, 0.0, 0.0), decel=2.0)
    assert np.all(np.diff(wp[:, 0]) >= -1e-6) and wp[-1, 0] > 20.0  # forward only, and it still follows the path
    assert np.all(np.abs(wp[:, 1] - np.interp(wp[:, 0], [0, 4, 9, 14, 19, 25, 30], [0, 0, .5, 1, 1.5, 2, 2.5])) < 0.1)


def test_deadline_watch_answers_each_frame_once_newest_expired_first():
    from wamdiff_ros.ros.cycle import DeadlineWatch

    watch = DeadlineWatch()
    for stamp in (1.0, 1.1, 1.2, 1.3):
        watch.add(stamp, f"frame {stamp}")
    assert watch.expired(1.25, 0.3) is None  # nothing older than 0.3 s yet
    assert watch.expired(1.45, 0.3) == (1.1, "frame 1.1")  # the newest expired, and 1.0 with it
    assert len(watch) == 2 and not watch.claim(1.1)  # its plan, finishing now, stands down
    assert watch.claim(1.2) and len(watch) == 1  # a plan in time answers its frame
    watch.drop(1.3)  # a skipped cycle: no answer owed
    assert watch.expired(9.0, 0.3) is None and len(watch) == 0
    watch.add(0.5, "frame after a reset")  # time went backwards: start over
    assert watch.expired(0.9, 0.3) == (0.5, "frame after a reset")


def test_clock_rate_follows_the_node_clock_against_the_wall():
    from wamdiff_ros.ros.cycle import ClockRate

    rate = ClockRate(window_s=2.0)
    assert rate.rate() is None
    for i in range(11):  # a simulator at half speed over 1 s of wall time
        rate.add(100.0 + 0.1 * i, 500.0 + 0.05 * i)
    assert rate.rate() == pytest.approx(0.5)
    for i in range(11, 60):  # then paused: the window forgets the running part
        rate.add(100.0 + 0.1 * i, 500.5)
    assert rate.rate() == pytest.approx(0.0)
    rate.add(106.0, 10.0)  # the clock jumps back (a restarted simulator): start over
    assert rate.rate() is None


def test_cycle_inputs_pair_a_frame_with_its_instant_and_say_why_not():
    from wamdiff_ros.format import Command
    from wamdiff_ros.planner import EgoState
    from wamdiff_ros.ros.cycle import CycleInputs, Paired

    inputs, limits = CycleInputs(), InputLimits(sync_tolerance_s=0.1, command_timeout_s=5.0)
    assert inputs.pair(10.0, 10.0, limits, 0.0, "") == "missing odometry"
    for stamp, speed in ((9.95, 4.0), (10.02, 5.0)):
        inputs.add_odometry(stamp, "odom", (stamp, 0.0, 0.0), EgoState((speed, 0.0)))
    assert inputs.pair(10.0, 10.0, limits, 0.0, "") == "missing command"
    got = inputs.pair(10.0, 10.0, limits, 0.0, "follow")  # no command yet: the default one
    assert got == Paired((10.02, 0.0, 0.0), EgoState((5.0, 0.0)), Command.FOLLOW) and inputs.default_in_use
    inputs.set_command(9.0, Command.LEFT)
    assert inputs.pair(10.0, 10.0, limits, 0.0, "follow").command is Command.LEFT and not inputs.default_in_use
    assert inputs.pair(10.0, 14.5, limits, 0.0, "").startswith("stale command")
    assert not inputs.went_back(10.0, 0.1) and inputs.went_back(5.0, 0.1)  # a looping bag
    assert len(inputs.odometry) == 0  # the odometry from after the jump is gone


def test_cycle_inputs_route_points_are_taken_at_the_pose_and_a_foreign_frame_is_reported_once():
    from wamdiff_ros.ros.cycle import CycleInputs

    inputs = CycleInputs()
    assert inputs.route_points((0.0, 0.0, 0.0)).points is None and inputs.values(0.0)["route"] == "none"
    inputs.add_odometry(0.0, "odom", (0.0, 0.0, 0.0), None)
    inputs.set_route(0.0, "odom", np.array([[0.0, 0.0], [100.0, 0.0]]))
    got = inputs.route_points((20.0, 0.0, 0.0))
    np.testing.assert_allclose(got.points, [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)
    assert got.problem is None and inputs.values(0.0)["route"] == "used"
    inputs.set_route(0.0, "map", np.array([[0.0, 0.0], [100.0, 0.0]]))
    first, again = inputs.route_points((0.0, 0.0, 0.0)), inputs.route_points((0.0, 0.0, 0.0))
    assert first.points is None and first.report and "'map'" in str(first.problem)
    assert again.problem is not None and not again.report
    assert inputs.values(0.0)["route"].startswith("refused")
    from wamdiff_ros.errors import RouteError

    with pytest.raises(RouteError):
        inputs.set_route(0.0, "odom", np.array([[0.0, 0.0]]))  # one point is not a route


@pytest.mark.parametrize("rate, expected", [(1.0, 100.0 + 0.25 - 0.01), (0.5, 100.0 + 0.5 - 0.01), (None, None),
                                            (0.0, None)])
def test_decode_deadline_turns_the_time_left_on_the_node_clock_into_wall_time(rate, expected):
    from wamdiff_ros.ros.cycle import decode_deadline

    got = decode_deadline(image_stamp=50.0, now=50.05, start=100.0, deadline_s=0.3, margin_s=0.01, clock_rate=rate)
    assert got == pytest.approx(expected) if expected is not None else got is None
