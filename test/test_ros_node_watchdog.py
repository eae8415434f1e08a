"""The watchdog: with a model that hangs, or takes twice the deadline, every frame still gets its flagged fallback
within ``deadline_ms`` + one watchdog period, from a timer independent of the inference thread; a plan that finishes
after its frame's fallback is discarded (counted), and the node stays alive and configurable. One process, own rclpy
context, the executor spinning in a thread, 100 frames at 10 Hz per case."""

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

from wamdiff_ros.ros.conversions import quaternion_from_yaw, to_time  # noqa: E402
from wamdiff_ros.ros.node import PlannerNode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(300)]
DEADLINE_MS, PERIOD_MS, FRAMES, FRAME_S = 300.0, 20.0, 100, 0.1
SLACK_S = 0.25  # scheduling: CI runs two test processes on 2 cores


class Running:
    def __init__(self, domain: int, wrap, model: str = "tiny-random", **overrides) -> None:
        """``wrap``: the planner's ``plan`` -> the stand-in the node calls instead."""
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        params = [Parameter("model", value=model), Parameter("blackbox_dir", value="none"),
                  Parameter("deadline_ms", value=DEADLINE_MS), Parameter("watchdog_period_ms", value=PERIOD_MS),
                  Parameter("default_command", value="follow"), Parameter("steps", value=2),
                  Parameter("schedule", value="static")]
        params += [Parameter(name, value=value) for name, value in overrides.items()]
        self.node = PlannerNode(context=self.ctx, parameter_overrides=params)
        assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        self.published = []  # (wall time, PlannerOutput)
        self.node.outputs.plan_pub.publish = lambda msg: self.published.append((self.node.now(), msg))
        self.node.planner.plan = wrap(self.node.planner.plan)
        assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.spinning = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinning.start()

    def drive(self, frames: int = FRAMES, image: np.ndarray | None = None) -> list[float]:
        """``frames`` frames (default: grey) at 10 Hz, each with its odometry; returns their stamps."""
        stamps = []
        image = np.full((64, 128, 3), 90, np.uint8) if image is None else image
        for _ in range(frames):
            now = self.node.now()
            odom = Odometry()
            odom.header.stamp, odom.header.frame_id, odom.child_frame_id = to_time(now), "odom", "base_link"
            odom.pose.pose.orientation = quaternion_from_yaw(0.0)
            odom.twist.twist.linear.x = 5.0
            self.node._on_odometry(odom)
            header = Header(stamp=to_time(now), frame_id="camera")
            self.node._accept_image(header, lambda: image)
            stamps.append(now)
            time.sleep(FRAME_S)
        time.sleep((DEADLINE_MS + 2 * PERIOD_MS) / 1e3 + SLACK_S)
        return stamps

    def close(self, release: threading.Event) -> None:
        release.set()
        self.node.trigger_deactivate()
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def _stamp(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _check_every_frame_got_its_fallback_in_time(run: Running, stamps: list[float]) -> None:
    fallbacks = {}
    for t, msg in run.published:
        if msg.fallback:
            fallbacks.setdefault(round(_stamp(msg), 3), (t, msg))  # frames are 0.1 s apart
    for stamp in stamps:
        t, msg = fallbacks[round(stamp, 3)]
        assert not msg.valid and msg.reason.startswith("watchdog: no plan")
        assert stamp + DEADLINE_MS / 1e3 <= t <= stamp + (DEADLINE_MS + PERIOD_MS) / 1e3 + SLACK_S, t - stamp
        xs = [p.pose.position.x for p in msg.waypoints_base_link]
        assert xs[0] > 0 and all(b >= a - 1e-6 for a, b in zip(xs, xs[1:]))  # a stop ahead, no reversing
    assert int(run.node.counters.watchdog) >= FRAMES


def test_a_hung_model_gets_every_frame_its_fallback(monkeypatch):
    release, calls = threading.Event(), []

    def hang(*args, **kwargs):
        calls.append(1)
        release.wait(60.0)
        raise RuntimeError("released")

    run = Running(51, lambda real: hang)
    try:
        stamps = run.drive()
        assert len(calls) == 1  # inference never came back
        _check_every_frame_got_its_fallback_in_time(run, stamps)
        assert run.node.get_parameter("deadline_ms").value == DEADLINE_MS  # still answering services
        run.node.set_parameters([Parameter("deadline_ms", value=400.0)])
        assert run.node.get_parameter("deadline_ms").value == 400.0
    finally:
        run.close(release)


def test_a_model_twice_as_slow_as_the_deadline_never_publishes_late_plans(monkeypatch):
    release = threading.Event()

    def slow(real):
        def plan(*args, **kwargs):
            time.sleep(2 * DEADLINE_MS / 1e3)
            return real(*args, **kwargs)
        return plan

    run = Running(52, slow)
    try:
        stamps = run.drive()
        _check_every_frame_got_its_fallback_in_time(run, stamps)
        assert not any(msg.valid for _, msg in run.published)  # every plan came after its frame's fallback
        assert run.node.counters.discarded >= 10 and run.node.counters.planned == run.node.counters.discarded
    finally:
        run.close(release)


def test_a_plan_cut_at_its_deadline_is_published_as_anytime(monkeypatch):
    """The decoder's clock passes the deadline at its 20th reading (the same cut whatever the machine's speed): the
    node publishes the best-so-far plan flagged anytime (not a fallback) with its per-waypoint confidence, or, where
    that plan is not valid, the fallback stop saying so."""
    import itertools

    from wamdiff_ros.decoding import block

    def cut(real):
        def plan(*args, deadline=None, **kwargs):
            assert deadline is not None  # the node gives every plan its deadline (anytime: true)
            counter = itertools.count()
            with monkeypatch.context() as m:
                m.setattr(block.time, "perf_counter", lambda: float(next(counter)))
                return real(*args, deadline=20.0, **kwargs)
        return plan

    run = Running(54, cut, model="wamdiff-tiny", steps=32, schedule="threshold")  # the shipped decode
    try:
        from wamdiff_ros.cli import load_rgb, sample_image_path

        run.drive(frames=20, image=load_rgb(sample_image_path()))  # a road: the trained model's plans are sane
        published = [msg for _, msg in run.published]
        assert published, (run.node.counters, run.node.side.scheduler.values())
        anytime = [m for m in published if m.anytime]
        assert anytime and all(m.valid and not m.fallback for m in anytime), [(m.valid, m.reason) for m in published]
        assert all(len(m.waypoint_confidence) == 8 and min(m.waypoint_confidence) > 0 for m in anytime)
        assert all(m.reason.startswith("invalid anytime plan") for m in published if m.fallback)
        assert run.node.counters.anytime == len(anytime) and run.node.counters.watchdog == 0
    finally:
        run.close(threading.Event())
