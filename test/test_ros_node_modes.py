"""The planner node started in other modes: a bad model path, compressed images, simulated time."""

import io

import pytest

pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from lifecycle_msgs.srv import GetState  # noqa: E402
from PIL import Image as PILImage  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from ros_harness import FAST, NODE, Harness, NodeProcess, diagnostics_values, msgs, round_trip, start  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from wamdiff_ros.ros.conversions import to_time  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]


@pytest.fixture
def run(tmp_path):
    started = []

    def launch(*args: str, status: str = "active", sim_time: float | None = None) -> Harness:
        node = NodeProcess(tmp_path / "node.log", *FAST, "-p", "blackbox_dir:=none", *args)
        h = Harness()
        started.append((h, node))
        if sim_time is not None:
            # timers run on /clock, and the node reports "active" from its diagnostics timer: a clock that stood still
            # from the start fired that timer once, when /clock first came, which may be before activation. So the
            # clock runs (from 100 s before sim_time, at the wall clock's pace) until the node is active, then it
            # jumps to sim_time and stands still there.
            h.clock_pub = h.node.create_publisher(Clock, "/clock", 10)
            h.sim_now = sim_time - 100.0

            def tick() -> None:
                h.sim_now = min(sim_time, h.sim_now + 0.05)
                h.clock_pub.publish(Clock(clock=to_time(h.sim_now)))

            h.node.create_timer(0.05, tick)
        start(h, node, status)
        if sim_time is not None:
            h.sim_now = sim_time
            h.spin(0.2)
        return h

    yield launch
    for h, node in started:
        h.close()
        node.stop()


def test_bad_model_path_fails_configure_with_an_error_diagnostic(run):
    h = run("-p", "model:=/no/such/checkpoint", status="model not loaded")
    values = diagnostics_values(h)
    assert values["level"] == b"\x02" and "/no/such/checkpoint" in values["message"]
    state = h.call(GetState, f"{NODE}/get_state", GetState.Request())
    assert state.current_state.label == "unconfigured"


def _jpeg(h: Harness) -> CompressedImage:
    buf = io.BytesIO()
    PILImage.fromarray(h.image).save(buf, format="JPEG", quality=90)
    return CompressedImage(format="jpeg", data=buf.getvalue())


def test_compressed_images(run):
    h = run("-p", "compressed:=true", "-p", "image_width:=256", "-p", "image_height:=128")
    h.send_frame(image_msg=_jpeg(h), topic="compressed")  # no command yet: skipped, counted
    h.spin(1.0)
    assert h.wait_for(lambda: int(diagnostics_values(h).get("skipped.missing command", 0)) >= 1, 10.0)
    h.send_command(msgs.DrivingCommand.RIGHT)
    h.spin(1.0)
    _, plan = round_trip(h, image_msg=_jpeg(h), topic="compressed")
    assert plan is not None and plan.valid
    broken = CompressedImage(format="jpeg", data=b"\xff\xd8 not a jpeg")
    h.send_frame(image_msg=broken, topic="compressed")
    h.spin(1.0)
    assert int(diagnostics_values(h)["bad_input"]) >= 1
    assert round_trip(h, image_msg=_jpeg(h), topic="compressed")[1] is not None


def test_simulated_time_drives_stamps_and_the_deadline(run):
    sim = 500.0
    h = run("-p", "use_sim_time:=true", "-p", "deadline_ms:=1.0", sim_time=sim)
    h.send_command(msgs.DrivingCommand.STRAIGHT)
    h.spin(1.0)
    # the simulator's clock stands still while the node plans: 1 ms of sim time never passes, so no deadline miss
    for _ in range(5):
        stamp = h.send_frame(stamp=sim)
        h.wait_for(lambda: any(abs(p.header.stamp.sec + p.header.stamp.nanosec * 1e-9 - stamp) < 1e-6
                               for p in h.plans), 15.0)
        if h.plans:
            break
    assert h.plans, "no plan under simulated time"
    plan = h.plans[-1]
    assert plan.header.stamp.sec == 500 and plan.valid and not plan.fallback
