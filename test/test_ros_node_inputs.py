"""Inputs a person can get right: a command publisher with incompatible QoS is reported (log and diagnostics, naming
the topic and the policy), and ``default_command`` lets the node plan without a command topic, saying so."""

import pytest

pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from ros_harness import FAST, NODE, Harness, NodeProcess, diagnostics_values, msgs, round_trip, set_param  # noqa: E402
from ros_harness import start  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    log = tmp_path_factory.mktemp("node") / "node.log"
    node = NodeProcess(log, *FAST, "-p", "blackbox_dir:=none", "-p", "default_command:=follow")
    h = Harness()
    h.command = None  # no command topic at all
    start(h, node)
    h.spin(1.0)
    yield h, log
    h.close()
    node.stop()


def test_default_command_plans_without_a_command_topic(running):
    h, _ = running
    stamp, plan = round_trip(h)
    assert plan is not None and plan.valid, "no plan without a command although default_command is set"
    values = diagnostics_values(h)
    assert values["command_source"] == "default_command (follow)"
    assert not set_param(h, "default_command", "sideways")  # refused, named
    assert set_param(h, "default_command", "")  # '' = skip cycles without a command, as before
    before = len(h.plans)
    h.send_frame()
    h.spin(2.0)
    assert len(h.plans) == before
    assert set_param(h, "default_command", "follow")


def test_a_command_publisher_with_default_qos_is_reported(running):
    h, log = running
    volatile = h.node.create_publisher(msgs.DrivingCommand, f"{NODE}/input/command", 10)  # what a quick script does
    topic = f"{NODE}/input/command"
    assert h.wait_for(lambda: topic in diagnostics_values(h).get("qos_incompatible", ""), 20.0)
    assert diagnostics_values(h)["qos_incompatible"] == f"{topic}: DURABILITY"
    text = log.read_text()
    assert text.count(f"a publisher on {topic} has an incompatible DURABILITY QoS policy") == 1
    assert "reliable, transient_local, depth 1" in text
    h.node.destroy_publisher(volatile)


def test_diagnostics_report_the_decode_path(running):
    h, _ = running
    assert diagnostics_values(h)["decode_path"] == "attention sdpa, cuda_graph off (cpu), grammar in the step"
