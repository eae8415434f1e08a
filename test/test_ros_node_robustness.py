"""The node's answers to imperfect inputs, through real rclpy: a repeated camera frame is not planned as new and is
answered by the last valid plan re-timed (flagged held) until ``max_plan_age_s``, then by the fallback stop; the
ego-state filter counts implausible odometry jumps; the diagnostics name every answer's counter. One process, own
rclpy context, the executor spinning in a thread, frames at 10 Hz."""

import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from nav_msgs.msg import Odometry  # noqa: E402
from std_msgs.msg import Header  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from wamdiff_ros.control.hold import ValidPlan, held_waypoints  # noqa: E402
from wamdiff_ros.ros.conversions import quaternion_from_yaw, to_time  # noqa: E402
from wamdiff_ros.ros.node import PlannerNode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]
FRAME_S, SPEED = 0.1, 5.0


class Running:
    def __init__(self, domain: int, **overrides) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        params = [Parameter("model", value="tiny-random"), Parameter("blackbox_dir", value="none"),
                  Parameter("default_command", value="follow"), Parameter("steps", value=2),
                  Parameter("schedule", value="static"), Parameter("reflect", value=False),
                  Parameter("deadline_ms", value=5000.0), Parameter("anytime", value=False)]
        params += [Parameter(name, value=value) for name, value in overrides.items()]
        self.node = PlannerNode(context=self.ctx, parameter_overrides=params)
        assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        self.published = []
        self.node.outputs.plan_pub.publish = self.published.append
        self.diagnostics = []
        self.node._diag_pub.publish = self.diagnostics.append
        self.calls = 0
        real = self.node.planner.plan

        def plan(*args, **kwargs):  # every plan valid and straight ahead, so held plans have something to hold
            self.calls += 1
            result = real(*args, **kwargs)
            t = np.arange(1, 9, dtype=np.float32) * 0.5
            result.waypoints = np.stack([SPEED * t, np.zeros_like(t)], axis=1)
            result.valid, result.reason = True, ""
            return result

        self.node.planner.plan = plan
        assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.spinning = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinning.start()
        self.x, self.t0 = 0.0, None

    def odometry(self, now: float, x: float | None = None) -> None:
        odom = Odometry()
        odom.header.stamp, odom.header.frame_id, odom.child_frame_id = to_time(now), "odom", "base_link"
        odom.pose.pose.position.x = self.x if x is None else x
        odom.pose.pose.orientation = quaternion_from_yaw(0.0)
        odom.twist.twist.linear.x = SPEED
        self.node._on_odometry(odom)

    def frame(self, image: np.ndarray) -> float:
        now = self.node.now()
        self.t0 = now if self.t0 is None else self.t0
        self.x = SPEED * (now - self.t0)  # the car drives on at 5 m/s, whatever the frames' spacing
        self.odometry(now)
        self.node._accept_image(Header(stamp=to_time(now), frame_id="camera"), lambda: image)
        self.settle()
        return now

    def settle(self) -> None:
        """Wait until the worker has answered the last frame (one frame in flight at a time)."""
        end = time.monotonic() + 30.0
        while len(self.node.worker.watch) and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(max(FRAME_S - 0.01, 0.0))

    def close(self) -> None:
        self.node.trigger_deactivate()
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def _image(value: int) -> np.ndarray:
    return np.full((64, 128, 3), value, np.uint8)


def test_a_repeated_frame_is_held_then_falls_back():
    run = Running(61, repeated_frame_check=True, max_plan_age_s=0.45)
    try:
        first = run.frame(_image(90))
        stamps = [run.frame(_image(90)) for _ in range(8)]  # the camera froze while the car drives on
        run.frame(_image(91))  # it comes back
        msgs = run.published
        assert len(msgs) == 10 and run.calls == 2  # only the first and the last frame were planned
        assert msgs[0].valid and not msgs[0].held and not msgs[-1].held and msgs[-1].valid
        repeats = msgs[1:9]
        ages = [s - first for s in stamps]
        for msg, age in zip(repeats, ages):
            if age <= 0.45:
                assert msg.held and msg.valid and not msg.fallback and msg.reason.startswith("held: repeated")
                # the first plan (5 m/s straight ahead) re-timed: its waypoints seen from the car, now
                xs = [p.pose.position.x for p in msg.waypoints_base_link]
                np.testing.assert_allclose(xs, SPEED * (np.arange(1, 9) * 0.5 + age) - SPEED * age, atol=0.3)
            else:
                assert msg.fallback and not msg.valid and not msg.held
                assert msg.reason.startswith("fallback") or "repeated camera frame" in msg.reason
        assert any(m.held for m in repeats) and any(m.fallback for m in repeats)
        c = run.node.counters
        assert c.repeated_frames == 8 and c.held == sum(m.held for m in repeats) and c.planned == 2
        run.node._publish_diagnostics()
        keys = {kv.key for kv in run.diagnostics[-1].status[0].values}
        assert {"repeated_frames", "held", "pose_jumps", "speed_scaled"} <= keys
    finally:
        run.close()


def test_without_the_check_a_repeated_frame_is_planned():
    run = Running(62)
    try:
        for _ in range(3):
            run.frame(_image(90))
        assert run.calls == 3 and not any(m.held for m in run.published)
        assert run.node.counters.repeated_frames == 0
    finally:
        run.close()


def test_the_ego_filter_counts_an_odometry_jump_and_keeps_planning_from_its_estimate():
    run = Running(63, ego_filter=True)
    try:
        seen = []
        real = run.node.inputs.add_odometry
        run.node.inputs.add_odometry = lambda stamp, frame, pose, ego: (seen.append(pose), real(stamp, frame, pose,
                                                                                                 ego))
        now = run.node.now()
        for k in range(20):
            run.odometry(now + 0.05 * k, x=SPEED * 0.05 * k + (40.0 if k == 10 else 0.0))
        assert run.node.counters.pose_jumps == 1
        assert abs(seen[10][0] - SPEED * 0.5) <= 2.0 + 1e-6  # pulled at most as far as the gate
        run.frame(_image(90))
        assert run.published and run.published[-1].valid
    finally:
        run.close()


def test_held_waypoints_retime_the_plan_and_continue_it_past_its_horizon():
    t = np.arange(1, 9) * 0.5
    plan = ValidPlan(10.0, (100.0, 0.0, 0.0), np.stack([100.0 + 4.0 * t, np.zeros(8)], axis=1))
    same = held_waypoints(plan, 10.0, (100.0, 0.0, 0.0))
    np.testing.assert_allclose(same[:, 0], 4.0 * t, atol=1e-5)
    later = held_waypoints(plan, 11.0, (104.0, 0.0, 0.0))  # 1 s on, the car where the plan put it
    np.testing.assert_allclose(later[:, 0], 4.0 * t, atol=1e-5)  # the rest of the plan, then its last step's speed
    turned = held_waypoints(plan, 10.5, (102.0, 0.0, np.pi / 2))  # seen from a car facing left
    np.testing.assert_allclose(turned[:, 1], -4.0 * t, atol=1e-5)
