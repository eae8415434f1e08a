"""``~/input/route`` (nav_msgs/Path): the node turns the latest route into the planner's route points, refuses a
route in another frame than the odometry's (reported, planning goes on) and survives a malformed one; the Planner
decides whether the model's prompt takes them. One process, own rclpy context; the planning cycle is driven
directly, the route arrives over DDS."""

import math
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from geometry_msgs.msg import PoseStamped  # noqa: E402
from nav_msgs.msg import Odometry, Path  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402

from wamdiff_ros import format as fmt  # noqa: E402
from wamdiff_ros.model import DecodeMeta, tiny_random  # noqa: E402
from wamdiff_ros.ros.conversions import quaternion_from_yaw, to_time  # noqa: E402
from wamdiff_ros.ros.cycle import Frame  # noqa: E402
from wamdiff_ros.ros.node import PlannerNode  # noqa: E402
from wamdiff_training.checkpoint import save_checkpoint  # noqa: E402

pytestmark = pytest.mark.ros
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
EGO_X, EGO_Y, EGO_YAW = 5.0, 1.0, 0.1


@pytest.fixture(scope="module")
def route_model(tmp_path_factory) -> str:
    bundle = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8, route_points=True), hidden=64, layers=2)
    return str(save_checkpoint(bundle, tmp_path_factory.mktemp("route_model") / "ckpt"))


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> str:
    bundle = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8, route_points=False), hidden=64, layers=2)
    return str(save_checkpoint(bundle, tmp_path_factory.mktemp("plain_model") / "ckpt"))


class Running:
    """A configured node, a driver node publishing routes in the same context, and the planner's recorded calls."""

    def __init__(self, monkeypatch, model: str | None, domain: int) -> None:
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        params = [Parameter("blackbox_dir", value="none"), Parameter("steps", value=4),
                  Parameter("schedule", value="static"),
                  Parameter("ego_filter", value=False)]  # the odometry's pose exactly: the routes' conversion
        if model is not None:
            params += [Parameter("model", value=model), Parameter("block_size", value=8)]
        self.node = PlannerNode(context=self.ctx, parameter_overrides=params)
        assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        self.driver = rclpy.create_node("route_driver", context=self.ctx)
        self.route_pub = self.driver.create_publisher(Path, "/wamdiff_planner/input/route", LATCHED)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.executor.add_node(self.driver)
        self.published, self.diagnostics, self.calls = [], [], []
        monkeypatch.setattr(self.node.outputs.plan_pub, "publish", self.published.append)
        monkeypatch.setattr(self.node._diag_pub, "publish", self.diagnostics.append)
        real = self.node.planner.plan

        def record(*args, **kwargs):
            self.calls.append((args, kwargs))
            return real(*args, **kwargs)

        monkeypatch.setattr(self.node.planner, "plan", record)

    def send_route(self, xy, frame_id: str = "odom") -> None:
        msg = Path()
        msg.header.frame_id = frame_id
        msg.header.stamp = self.node.get_clock().now().to_msg()
        for x, y in xy:
            pose = PoseStamped()
            pose.header.frame_id = frame_id
            pose.pose.position.x, pose.pose.position.y = float(x), float(y)
            msg.poses.append(pose)
        before, bad = self.node.inputs.route, self.node.counters.bad_input
        self.route_pub.publish(msg)
        end = time.monotonic() + 10.0
        while time.monotonic() < end and self.node.inputs.route is before and self.node.counters.bad_input == bad:
            self.executor.spin_once(timeout_sec=0.05)
        assert self.node.inputs.route is not before or self.node.counters.bad_input != bad, "the route did not arrive"

    def cycle(self, frame_id: str = "odom"):
        """Odometry at (EGO_X, EGO_Y, EGO_YAW) in ``frame_id``, a command and an image of the same instant; one
        planning cycle; returns the ``route`` the planner got (or the sentinel ``"absent"``)."""
        now = self.node.get_clock().now().nanoseconds * 1e-9
        odom = Odometry()
        odom.header.stamp, odom.header.frame_id, odom.child_frame_id = to_time(now), frame_id, "base_link"
        odom.pose.pose.position.x, odom.pose.pose.position.y = EGO_X, EGO_Y
        odom.pose.pose.orientation = quaternion_from_yaw(EGO_YAW)
        odom.twist.twist.linear.x = 5.0
        self.node._on_odometry(odom)
        self.node.inputs.set_command(now, fmt.Command.LEFT)
        header = type("Header", (), {"stamp": to_time(now)})()
        n = len(self.published)
        self.node.worker.cycle(Frame(now, header, np.full((64, 128, 3), 80, np.uint8)))
        assert len(self.published) == n + 1 and self.node.counters.errors == 0  # it planned
        args, kwargs = self.calls[-1]
        assert len(args) == 3
        return kwargs.get("route", "absent")

    def diagnostics_values(self) -> dict:
        self.node._publish_diagnostics()
        return {kv.key: kv.value for kv in self.diagnostics[-1].status[0].values}

    def close(self) -> None:
        self.node.worker.stop()
        self.executor.shutdown()
        self.driver.destroy_node()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def _expected(route_xy) -> np.ndarray:
    """The route points by hand for a straight route along +x: the ego (EGO_X, EGO_Y) projects to (EGO_X, y0)."""
    y0 = route_xy[0][1]
    points = np.array([[EGO_X + d, y0] for d in fmt.ROUTE_AHEAD_M]) - (EGO_X, EGO_Y)
    c, s = math.cos(EGO_YAW), math.sin(EGO_YAW)
    return points @ np.array([[c, -s], [s, c]])


def test_a_model_that_wants_route_points_gets_them_from_the_route_topic(monkeypatch, route_model):
    run = Running(monkeypatch, route_model, domain=41)
    try:
        assert run.node.planner.bundle.meta.route_points
        assert run.cycle() is None  # no route yet: plans without
        values = run.diagnostics_values()
        assert values["route"] == "none" and values["route_in_prompt"] == "missing"

        straight = [(x, -2.0) for x in np.arange(0.0, 101.0, 1.0)]
        run.send_route(straight)
        got = run.cycle()
        assert got is not None and np.asarray(got).shape == (2, 2)
        np.testing.assert_allclose(got, _expected(straight), atol=1e-6)
        values = run.diagnostics_values()
        assert values["route"] == "used" and values["route_age_s"] != "none" and values["route_in_prompt"] == "used"
        bad = run.node.counters.bad_input

        assert run.published[-1].waypoints_odom[0].header.frame_id == "odom"  # the odometry's frame

        # a route in another frame than the odometry's: refused, reported, planning goes on without it
        run.send_route(straight, frame_id="map")
        assert run.cycle() is None and run.cycle() is None
        assert run.node.counters.bad_input == bad + 1  # reported once per message, not every cycle
        assert "'map'" in run.node.counters.last_error and "'odom'" in run.node.counters.last_error
        assert run.diagnostics_values()["route"].startswith("refused")
        # an empty frame id is accepted (either side)
        run.send_route(straight, frame_id="")
        np.testing.assert_allclose(run.cycle(), _expected(straight), atol=1e-6)
        run.send_route(straight, frame_id="map")
        np.testing.assert_allclose(run.cycle(frame_id=""), _expected(straight), atol=1e-6)
        assert run.published[-1].waypoints_odom[0].header.frame_id == "odom"  # odometry without a frame: odom
        run.send_route(straight, frame_id="map")
        np.testing.assert_allclose(run.cycle(frame_id="map"), _expected(straight), atol=1e-6)
        assert run.published[-1].waypoints_odom[0].header.frame_id == "map"  # carla-ros-bridge's odometry frame

        # malformed routes never stop the node: dropped, reported, the route is cleared
        for xy in ([(1.0, 2.0)], [(0.0, 0.0), (float("nan"), 1.0)], [(3.0, 3.0), (3.0, 3.0)]):
            run.send_route(straight)
            bad = run.node.counters.bad_input
            run.send_route(xy)
            assert run.node.counters.bad_input == bad + 1 and run.node.inputs.route is None
            assert run.cycle() is None
        run.send_route(straight)
        np.testing.assert_allclose(run.cycle(), _expected(straight), atol=1e-6)
        run.send_route([])  # an empty path clears the route quietly
        assert run.node.inputs.route is None and run.cycle() is None
    finally:
        run.close()


def test_a_model_without_route_points_plans_with_the_papers_prompt(monkeypatch, plain_model):
    run = Running(monkeypatch, plain_model, domain=42)
    prompts = []
    real_prompt = fmt.plan_prompt
    monkeypatch.setattr(fmt, "plan_prompt", lambda *a, **k: prompts.append(real_prompt(*a, **k)) or prompts[-1])
    try:
        assert not run.node.planner.bundle.meta.route_points
        straight = [(x, 0.0) for x in np.arange(0.0, 101.0, 1.0)]
        run.send_route(straight)
        np.testing.assert_allclose(run.cycle(), _expected(straight), atol=1e-6)  # the node passes what it has
        assert not fmt.has_route_line(prompts[-1])  # the planner leaves it out of this model's prompt
        assert run.diagnostics_values()["route_in_prompt"] == "unused"
    finally:
        run.close()
