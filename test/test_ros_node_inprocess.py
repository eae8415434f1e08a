"""The node's planning cycle driven directly (one process, own rclpy context): a model that raises mid-inference."""

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from rclpy.parameter import Parameter  # noqa: E402

from wamdiff_ros import format as fmt  # noqa: E402
from wamdiff_ros.planner import EgoState  # noqa: E402
from wamdiff_ros.ros.cycle import Frame  # noqa: E402
from wamdiff_ros.ros.node import PlannerNode  # noqa: E402

pytestmark = pytest.mark.ros


def test_a_model_error_becomes_a_flagged_fallback_and_the_node_goes_on(monkeypatch):
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=7)
    node = PlannerNode(context=ctx, parameter_overrides=[
        Parameter("blackbox_dir", value="none"), Parameter("steps", value=4), Parameter("schedule", value="static"),
        Parameter("implausible_action", value="publish")])  # a synthetic frame's plan may fail the checker
    try:
        from rclpy.lifecycle import TransitionCallbackReturn

        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        published = []
        monkeypatch.setattr(node.outputs.plan_pub, "publish", published.append)
        now = node.get_clock().now().nanoseconds * 1e-9
        node.inputs.odometry.add(now, ((0.0, 0.0, 0.0), EgoState((5.0, 0.0))))
        node.inputs.set_command(now, fmt.Command.LEFT)
        header = type("Header", (), {"stamp": node.get_clock().now().to_msg()})()
        frame = Frame(now, header, np.full((64, 128, 3), 80, np.uint8))

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        real_plan = node.planner.plan
        monkeypatch.setattr(node.planner, "plan", broken)
        node.worker.cycle(frame)
        assert node.counters.errors == 1 and node.counters.fallback == 1
        out = published[-1]
        assert out.fallback and not out.valid and "model error" in out.reason and "illegal memory" in out.reason
        assert len(out.waypoints_base_link) == 8
        monkeypatch.setattr(node.planner, "plan", real_plan)
        later = node.get_clock().now().nanoseconds * 1e-9  # the next frame (a frame is answered once)
        node.inputs.odometry.add(later, ((0.0, 0.0, 0.0), EgoState((5.0, 0.0))))
        node.worker.cycle(Frame(later, type("Header", (), {"stamp": node.get_clock().now().to_msg()})(),
                          np.full((64, 128, 3), 80, np.uint8)))
        assert published[-1].valid and not published[-1].fallback and node.counters.fallback == 1
    finally:
        node.worker.stop()
        node.destroy_node()
        rclpy.shutdown(context=ctx)
