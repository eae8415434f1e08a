"""The node's language and detection outputs through real rclpy: with tiny-random and frames at 10 Hz, boxes
(~/output/boxes) and descriptions (~/output/description) arrive at detect_hz and describe_hz within 20 %, and every
output carries the stamp (and frame id) of the frame it was made from; ~/debug/image draws the planned frame while
someone subscribes. One process, own rclpy context, the node's executor spinning in a thread and a listener node
on the same context receiving over DDS."""

import os
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wamdiff_ros.draw import STRIP_HEIGHT  # noqa: E402
from wamdiff_ros.msg import Detection2DArray, PlannerOutput, SceneDescription  # noqa: E402
from wamdiff_ros.ros.conversions import quaternion_from_yaw, to_time  # noqa: E402
from wamdiff_ros.ros.node import PlannerNode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]
DETECT_HZ, DESCRIBE_HZ, DEBUG_HZ, SECONDS, FRAME_S = 2.0, 1.0, 2.0, 12.0, 0.1
NODE = "/wamdiff_planner"
FRAME = "outputs_test_camera"


def _stamp(msg) -> tuple[int, int]:
    return msg.header.stamp.sec, msg.header.stamp.nanosec


def _keep(messages: list, msg) -> None:
    """Only the frames this test sends (never another node's that shares the domain)."""
    if msg.header.frame_id in (FRAME, "base_link"):  # the plan's header names base_link
        messages.append((time.monotonic(), msg))


def _rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0])


@pytest.fixture(scope="module")
def run():
    ctx = rclpy.Context()
    # a domain per xdist worker: both workers may build this module's fixture at once, and each listener must hear
    # its own node only
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    rclpy.init(context=ctx, domain_id=33 + int(worker.removeprefix("gw") or 0) % 5)
    params = [Parameter("model", value="tiny-random"), Parameter("blackbox_dir", value="none"),
              Parameter("deadline_ms", value=1000.0), Parameter("default_command", value="follow"),
              Parameter("steps", value=2), Parameter("schedule", value="static"),
              Parameter("detect_hz", value=DETECT_HZ), Parameter("describe_hz", value=DESCRIBE_HZ),
              Parameter("debug_image_hz", value=DEBUG_HZ), Parameter("reflect", value=False)]  # random weights
    node = PlannerNode(context=ctx, parameter_overrides=params)
    listener = rclpy.create_node("wamdiff_outputs_listener", context=ctx)
    got: dict[str, list] = {"plan": [], "boxes": [], "description": [], "image": []}
    for key, cls, topic in (("plan", PlannerOutput, "output/plan"), ("boxes", Detection2DArray, "output/boxes"),
                            ("description", SceneDescription, "output/description"), ("image", Image, "debug/image")):
        listener.create_subscription(cls, f"{NODE}/{topic}", lambda msg, key=key: _keep(got[key], msg), 50)
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    executor = MultiThreadedExecutor(num_threads=2, context=ctx)
    executor.add_node(node)
    executor.add_node(listener)
    threading.Thread(target=executor.spin, daemon=True).start()
    time.sleep(0.5)  # discovery
    image, stamps = np.full((64, 128, 3), 90, np.uint8), []
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        now = node.now()
        odom = Odometry()
        odom.header.stamp, odom.header.frame_id, odom.child_frame_id = to_time(now), "odom", "base_link"
        odom.pose.pose.orientation = quaternion_from_yaw(0.0)
        odom.twist.twist.linear.x = 5.0
        node._on_odometry(odom)
        stamp = to_time(now)
        node._accept_image(Header(stamp=stamp, frame_id=FRAME), lambda: image)
        stamps.append((stamp.sec, stamp.nanosec))
        time.sleep(FRAME_S)
    time.sleep(1.5)
    yield node, got, stamps
    node.trigger_deactivate()
    executor.shutdown()
    listener.destroy_node()
    node.destroy_node()
    rclpy.shutdown(context=ctx)


@pytest.mark.parametrize("key, hz", [("boxes", DETECT_HZ), ("description", DESCRIBE_HZ)])
def test_side_tasks_arrive_at_their_rates(run, key, hz):
    node, got, _ = run
    times = [t for t, _ in got[key]]
    assert len(times) >= hz * SECONDS * 0.6, len(times)
    assert 0.8 * hz <= _rate(times) <= 1.2 * hz, (_rate(times), [round(t - times[0], 2) for t in times],
                                                  node.side.scheduler.values())


def test_every_output_carries_its_frames_stamp(run):
    node, got, stamps = run
    planned = {_stamp(m) for _, m in got["plan"] if m.valid} & set(stamps)  # plans say base_link: by their stamps
    assert len(planned) >= 0.5 * len(stamps)  # plans keep up with most frames while the side tasks run
    for key in ("boxes", "description", "image"):
        assert got[key], key
        for _, msg in got[key]:
            assert _stamp(msg) in planned, key  # made from a frame that was planned, with its stamp
            assert msg.header.frame_id == FRAME, key
    for _, msg in got["boxes"]:
        assert (msg.image_width, msg.image_height) == (128, 64)
        for det in msg.detections:
            assert _stamp(det) == _stamp(msg) and det.results and 0 <= det.bbox.center_x <= 128
    for _, msg in got["description"]:
        assert list(msg.questions) == list(node.get_parameter("describe_questions").value)
    _, image = got["image"][-1]
    assert (image.width, image.height, image.encoding) == (128 + 64, 64 + STRIP_HEIGHT, "rgb8")
    assert 0.8 * DEBUG_HZ <= _rate([t for t, _ in got["image"]]) <= 1.2 * DEBUG_HZ


def test_diagnostics_report_each_task(run):
    node, got, _ = run
    values = node.side.scheduler.values()
    for task in ("plan", "detect", "describe"):
        assert values[f"{task}.runs"] > 0 and values[f"{task}.p50_ms"] > 0 and values[f"{task}.p99_ms"] > 0
    assert values["detect.rate_hz"] == pytest.approx(DETECT_HZ, rel=0.2)
    assert "detect.skips" in values and "plans_delayed_by_side_tasks" in values
    assert values["plans_delayed_and_late"] == 0  # the deadline (1 s) leaves room: the rule never made one late
