"""The planner node over real rclpy and Fast DDS on loopback: the node runs in its own process, this test is a
second ROS 2 participant that feeds it and listens."""

import pytest

pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from ros_harness import FAST, NODE, Harness, NodeProcess, msgs, round_trip, set_param, start  # noqa: E402
from ros_harness import diagnostics_values, rgb_to_image, stamp_of  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def blackbox_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("blackbox")


@pytest.fixture(scope="module")
def harness(tmp_path_factory, blackbox_dir):
    node = NodeProcess(tmp_path_factory.mktemp("node") / "node.log", *FAST, "-p", f"blackbox_dir:={blackbox_dir}")
    h = Harness()
    start(h, node)
    h.send_command(msgs.DrivingCommand.LEFT)
    h.spin(1.0)  # discovery
    yield h
    h.close()
    node.stop()


def test_plans_are_stamped_with_their_image(harness):
    h = harness
    stamp, plan = round_trip(h)
    assert plan is not None, "no PlannerOutput for the published image"
    assert plan.valid and not plan.fallback
    assert len(plan.waypoints_base_link) == 8 and len(plan.waypoints_odom) == 8
    assert len(plan.waypoint_confidence) == 8 and plan.block_size == 32
    assert plan.forward_calls > 0 and plan.decode_ms > 0
    first = plan.waypoints_base_link[0].header.stamp
    assert abs(first.sec + first.nanosec * 1e-9 - (stamp + 0.5)) < 1e-6
    assert h.wait_for(lambda: any(abs(stamp_of(p) - stamp) < 1e-6 for p in h.paths), 5.0)


def test_lifecycle_services(harness):
    h = harness
    state = h.call(GetState, f"{NODE}/get_state", GetState.Request())
    assert state.current_state.label == "active"
    deactivated = h.call(ChangeState, f"{NODE}/change_state",
                         ChangeState.Request(transition=Transition(id=Transition.TRANSITION_DEACTIVATE)))
    assert deactivated.success
    assert h.call(GetState, f"{NODE}/get_state", GetState.Request()).current_state.label == "inactive"
    before = len(h.plans)
    h.send_frame()
    h.spin(2.0)
    assert len(h.plans) == before  # inactive: no inference
    activated = h.call(ChangeState, f"{NODE}/change_state",
                       ChangeState.Request(transition=Transition(id=Transition.TRANSITION_ACTIVATE)))
    assert activated.success


def test_live_parameters_apply_and_bad_ones_are_refused(harness):
    h = harness
    assert set_param(h, "block_size", 16)
    _, plan = round_trip(h)
    assert plan is not None and plan.block_size == 16
    assert not set_param(h, "block_size", 64)  # above the checkpoint's trained block size
    assert not set_param(h, "threshold", 2.0)  # out of the declared range
    assert not set_param(h, "schedule", "random")
    assert set_param(h, "block_size", 32)
    assert not set_param(h, "schedule", "prefix")  # not a schedule
    assert set_param(h, "schedule", "static")  # live
    _, plan = round_trip(h)
    assert plan is not None
    assert set_param(h, "schedule", "threshold")


def test_bad_inputs_leave_the_node_answering(harness):
    h = harness
    good = rgb_to_image(h.image, 0.0, "camera")
    bad = []
    unknown = rgb_to_image(h.image, 0.0, "camera")
    unknown.encoding = "yuv422_weird"
    bad.append(unknown)
    short = rgb_to_image(h.image, 0.0, "camera")
    short.data = bytes(good.data)[:100]
    bad.append(short)
    empty = Image(height=0, width=0, encoding="rgb8", step=0)
    bad.append(empty)
    for msg in bad:
        h.send_frame(msg)
        h.spin(0.3)
    h.send_frame(odom_ok=False)  # NaN odometry (and an image that then has no fresh odometry in sync)
    h.spin(1.0)
    assert round_trip(h)[1] is not None, "the node stopped answering after bad input"
    assert int(diagnostics_values(h)["bad_input"]) >= 4


def test_deadline_miss_gives_a_flagged_fallback_and_a_black_box_file(harness, blackbox_dir):
    h = harness
    assert set_param(h, "deadline_ms", 1.0)
    try:
        _, plan = round_trip(h)
        assert plan is not None and plan.fallback and not plan.valid and plan.reason.startswith(("late", "watchdog"))
        xs = [p.pose.position.x for p in plan.waypoints_base_link]
        assert all(b >= a - 1e-6 for a, b in zip(xs, xs[1:]))  # a stop along the path: no reversing
    finally:
        assert set_param(h, "deadline_ms", 30000.0)
    assert h.wait_for(lambda: any(blackbox_dir.glob("*.mcap")), 20.0)
    from wamdiff_ros.ros.bags import topic_counts

    counts = {topic: n for topic, (_, n) in topic_counts(next(blackbox_dir.glob("*.mcap"))).items()}
    assert counts.get(f"{NODE}/input/image", 0) >= 1 and counts.get(f"{NODE}/input/odometry", 0) >= 1


def test_question_gets_one_answer(harness):
    h = harness
    assert round_trip(h)[1] is not None  # the node has a frame to look at
    h.answers.clear()
    h.question_pub.publish(String(data="Is the lane to the left free?"))
    assert h.wait_for(lambda: len(h.answers) == 1, 30.0)
    assert isinstance(h.answers[0].data, str)


def test_input_faster_than_inference_drops_frames_not_queues(harness):
    h = harness
    before = int(diagnostics_values(h)["dropped"])
    assert set_param(h, "steps", 32)  # one token per forward: ~130 forwards a plan, slower than 100 Hz on any CPU
    try:
        dropped, n = before, 0
        for _ in range(3):
            t0 = h.send_frame()  # odometry that every frame of the burst is within sync tolerance of
            for i in range(1, 40):  # 100 Hz
                h.image_pub.publish(rgb_to_image(h.image, t0 + 0.001 * i, "camera"))
                h.spin(0.01)
            n += 40
            h.spin(1.0)
            dropped = int(diagnostics_values(h)["dropped"])
            if dropped > before:
                break
        assert dropped > before, (f"{n} frames at 100 Hz, none replaced before inference took it", {
            k: v for k, v in diagnostics_values(h).items() if k.startswith(("frames", "skipped", "planned"))})
    finally:
        assert set_param(h, "steps", 4)
    assert round_trip(h)[1] is not None, str(diagnostics_values(h))


def test_stale_command_is_skipped_with_a_reason(harness):
    h = harness
    assert set_param(h, "command_timeout_s", 0.0)
    try:
        h.send_frame()
        h.spin(2.0)  # even the command sent with the frame is older than 0 s by the time the cycle runs
        assert int(diagnostics_values(h).get("skipped.stale command", 0)) >= 1
    finally:
        assert set_param(h, "command_timeout_s", 10.0)
    assert round_trip(h)[1] is not None


def test_future_stamp_and_time_going_backwards(harness):
    h = harness
    now = h.node.get_clock().now().nanoseconds * 1e-9
    h.send_frame(stamp=now + 60.0)  # a clock far ahead
    h.spin(2.0)
    values = diagnostics_values(h)
    assert int(values.get("skipped.future stamp", 0)) >= 1
    resets = int(values["resets"])
    # A looping bag: time goes backwards -> reset, not a stall; the frame plans with the odometry sent with it (the
    # odometry history started over when its stamps went back)
    assert round_trip(h, stamp=now - 30.0)[1] is not None  # the plan of that very frame
    assert h.wait_for(lambda: int(diagnostics_values(h)["resets"]) > resets, 10.0)
    assert round_trip(h)[1] is not None
