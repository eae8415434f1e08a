"""The CARLA control bridge in-process (real rclpy topics, discovery off so tests may run in parallel): a fake
carla-ros-bridge publishes odometry (and /clock) and a fake planner a PlannerOutput; the node answers one command per
tick, stamped with sim time, and brakes when plans stop for 1 s of wall time."""

import importlib.util
import math
import time
from types import SimpleNamespace

import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from geometry_msgs.msg import PoseStamped, Twist, TwistStamped  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402

from wamdiff_ros.errors import InputError  # noqa: E402
from wamdiff_ros.msg import PlannerOutput  # noqa: E402
from wamdiff_ros.ros.bridge import messages as bm  # noqa: E402
from wamdiff_ros.ros.bridge.sync import bicycle_yaw_rate  # noqa: E402
from wamdiff_ros.ros.conversions import stamp_ns, time_ns  # noqa: E402
from wamdiff_ros.geometry import Pose2D  # noqa: E402

DOMAIN_ID = 232
HAVE_CARLA_MSGS = importlib.util.find_spec("carla_msgs") is not None
DT_NS = 50_000_000  # CARLA's 20 Hz


def test_vehicle_control_message_fields_and_ranges():
    class Control(SimpleNamespace):  # stands in for carla_msgs/CarlaEgoVehicleControl
        def __init__(self):
            super().__init__(header=SimpleNamespace(stamp=None), throttle=0.0, steer=0.0, brake=0.0,
                             hand_brake=True, reverse=True, gear=0, manual_gear_shift=True)

    msg = bm.vehicle_control_msg(Control, 12_345_000_000, 0.5, -0.25, 0.0)
    assert (msg.throttle, msg.steer, msg.brake) == (0.5, -0.25, 0.0)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 345_000_000)
    assert not (msg.hand_brake or msg.reverse or msg.manual_gear_shift)
    for bad in ((1.5, 0.0, 0.0), (0.0, -1.5, 0.0), (0.0, 0.0, float("nan")), (-0.1, 0.0, 0.0)):
        with pytest.raises(InputError):
            bm.vehicle_control_msg(Control, 0, *bad)


def test_bicycle_yaw_rate_turns_left_for_positive_steer():
    assert bicycle_yaw_rate(10.0, 0.1, 2.875) == pytest.approx(10.0 * math.tan(0.1) / 2.875)
    assert bicycle_yaw_rate(10.0, -0.1, 2.875) < 0 < bicycle_yaw_rate(10.0, 0.1, 2.875)
    assert bicycle_yaw_rate(0.0, 0.5, 2.875) == 0.0


class Rig:
    """The control node plus a fake carla-ros-bridge / planner node in one isolated context."""

    def __init__(self, **params) -> None:
        from wamdiff_ros.ros.bridge.carla_control import PLAN_TOPIC, CarlaControl

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=DOMAIN_ID)
        self.node = CarlaControl(context=self.ctx, parameter_overrides=[Parameter(k, value=v) for k, v in
                                                                       params.items()])
        self.fake = rclpy.create_node("fake_carla", context=self.ctx)
        self.odom_pub = self.fake.create_publisher(Odometry, "/carla/hero/odometry", 10)
        self.plan_pub = self.fake.create_publisher(PlannerOutput, PLAN_TOPIC, 10)
        self.clock_pub = self.fake.create_publisher(Clock, "/clock", 10)
        self.twists = []
        twist_type = TwistStamped if params.get("twist", "stamped") == "stamped" else Twist
        self.fake.create_subscription(twist_type, "/wamdiff_carla_control/output/twist", self.twists.append, 100)
        self.controls = []
        if HAVE_CARLA_MSGS:
            from carla_msgs.msg import CarlaEgoVehicleControl

            self.fake.create_subscription(CarlaEgoVehicleControl, "/carla/hero/vehicle_control_cmd",
                                          self.controls.append, 100)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.executor.add_node(self.fake)
        self.spin(0.2)

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.01)

    def wait_for(self, predicate, seconds: float = 5.0) -> bool:
        end = time.monotonic() + seconds
        while not predicate() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.01)
        return predicate()

    def odometry(self, k: int, speed: float = 8.0, nan: bool = False) -> int:
        """Tick k: the ego drives along +x at ``speed``."""
        ns = 1_000_000_000 + k * DT_NS
        msg = bm.odometry_msg(ns, Pose2D(speed * k * DT_NS * 1e-9, 0.0, 0.0), (speed, 0.0), 0.0, "map", "hero")
        if nan:
            msg.pose.pose.position.x = float("nan")
        self.odom_pub.publish(msg)
        return ns

    def plan(self, ns: int, lateral: float = 0.0, speed: float = 8.0) -> None:
        """A plan at ``speed`` m/s drifting ``lateral`` m/s to the left."""
        out = PlannerOutput(valid=True)
        out.header.stamp = time_ns(ns)
        for k in range(8):
            pose = PoseStamped()
            pose.pose.position.x, pose.pose.position.y = speed * 0.5 * (k + 1), lateral * 0.5 * (k + 1)
            out.waypoints_base_link.append(pose)
        self.plan_pub.publish(out)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.fake.destroy_node()
        rclpy.try_shutdown(context=self.ctx)


@pytest.fixture
def rig_factory(monkeypatch):
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "OFF")
    rigs = []

    def make(**params):
        rigs.append(Rig(**params))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.close()


def _ns(msg) -> int:
    return stamp_ns(msg.header.stamp)


@pytest.mark.ros
def test_one_command_per_odometry_tick_stamped_with_it_then_brakes_after_1s_without_plans(rig_factory):
    rig = rig_factory()
    ns = rig.odometry(0)
    assert rig.wait_for(lambda: len(rig.twists) == 1)
    first = rig.twists[0]
    assert _ns(first) == ns and first.twist.linear.x == 0.0 and first.twist.angular.z == 0.0  # no plan yet: stop
    assert first.header.frame_id == "hero"  # the odometry's child frame (REP-105)
    rig.plan(ns, lateral=1.5)  # the image of tick 0 asks to drift left
    rig.spin(0.1)
    stamps = []
    for k in range(1, 21):  # one simulated second at 20 Hz
        stamps.append(rig.odometry(k))
        assert rig.wait_for(lambda: len(rig.twists) == k + 1), f"no command for tick {k}"
    tracking = rig.twists[1:]
    assert [_ns(t) for t in tracking] == stamps  # one per tick, stamped with the tick's sim time
    assert all(0.0 <= t.twist.linear.x <= 15.0 and abs(t.twist.angular.z) < 3.0 for t in tracking)
    assert all(t.twist.linear.x > 5.0 for t in tracking) and tracking[-1].twist.angular.z > 0.0  # moving, turning left
    assert rig.node.counters.tracking == 20 and rig.node.counters.brake_no_plan == 1  # tick 0
    if HAVE_CARLA_MSGS:
        assert rig.wait_for(lambda: len(rig.controls) == 21)  # published beside each twist: may come a bit after
        assert rig.controls[-1].steer < 0.0  # CARLA: positive steer is right
    rig.spin(1.1)  # no fresh plan for more than plan_timeout_s (1 s, wall)
    ns = rig.odometry(21)
    assert rig.wait_for(lambda: len(rig.twists) == 22)
    last = rig.twists[-1]
    assert _ns(last) == ns and last.twist.linear.x == 0.0 and last.twist.angular.z == 0.0
    assert rig.node.counters.brake_no_plan == 2 and rig.node._braking
    if HAVE_CARLA_MSGS:
        assert rig.wait_for(lambda: len(rig.controls) == 22)
        assert (rig.controls[-1].throttle, rig.controls[-1].brake) == (0.0, 1.0)
    rig.plan(ns, lateral=0.0)  # plans come back: tracking resumes
    rig.spin(0.1)
    rig.odometry(22)
    assert rig.wait_for(lambda: len(rig.twists) == 23) and rig.twists[-1].twist.linear.x > 5.0


@pytest.mark.ros
def test_timer_ticks_on_sim_time_and_bad_messages_do_not_stop_the_node(rig_factory):
    rig = rig_factory(tick_source="timer", use_sim_time=True)
    clock = [1_000_000_000 + k * DT_NS for k in range(40)]
    for k in range(3):
        rig.clock_pub.publish(bm.clock_msg(clock[k]))
        rig.odometry(k)
        rig.spin(0.05)
    rig.plan(1_000_000_000 + DT_NS)
    bad = PlannerOutput(valid=True)
    bad.header.stamp = time_ns(clock[2])
    rig.plan_pub.publish(bad)  # no waypoints
    rig.odometry(3, nan=True)
    rig.spin(0.1)
    before = len(rig.twists)
    for k in range(3, 40):  # sim time advances 0.05 s per /clock message; a plan every other tick (10 Hz camera)
        rig.clock_pub.publish(bm.clock_msg(clock[k]))
        rig.odometry(k)
        if k % 2 == 0:
            rig.plan(clock[k])
        rig.spin(0.02)
    ticks = len(rig.twists) - before
    assert 30 <= ticks <= 38  # about one command per 0.05 s of sim time, none while the clock stands still
    assert rig.node.counters.bad_messages == 2
    assert rig.twists[-1].twist.linear.x > 5.0  # still tracking the good plan
    assert {_ns(t) for t in rig.twists[before:]} <= set(clock)  # stamped with the sim clock's ticks
    rig.spin(0.3)  # the sim clock stands still: no ticks
    assert len(rig.twists) - before == ticks


@pytest.mark.ros
@pytest.mark.skipif(not HAVE_CARLA_MSGS, reason="carla_msgs (carla-ros-bridge's interfaces) is not on PyPI: "
                                                "CarlaEgoVehicleControl is only published where it is installed")
def test_carla_vehicle_control_is_published_per_tick(rig_factory):
    rig = rig_factory()
    ns = rig.odometry(0)
    assert rig.wait_for(lambda: len(rig.controls) == 1)
    rig.plan(ns)
    rig.spin(0.1)
    for k in range(1, 6):
        rig.odometry(k)
    assert rig.wait_for(lambda: len(rig.controls) == 6)
    for c in rig.controls:
        assert 0.0 <= c.throttle <= 1.0 and -1.0 <= c.steer <= 1.0 and 0.0 <= c.brake <= 1.0
        assert not (c.throttle > 0 and c.brake > 0)


@pytest.mark.ros
def test_without_carla_msgs_the_plain_twist_output_still_works(rig_factory):
    rig = rig_factory(twist="plain")
    assert (rig.node._control_pub is not None) == HAVE_CARLA_MSGS
    ns = rig.odometry(0)
    assert rig.wait_for(lambda: len(rig.twists) == 1)  # the pose of tick 0 is known before its plan comes
    rig.plan(ns)
    rig.spin(0.1)
    rig.odometry(1)
    assert rig.wait_for(lambda: len(rig.twists) == 2)
    assert isinstance(rig.twists[-1], Twist) and rig.twists[-1].linear.x > 5.0


@pytest.mark.ros
def test_actuation_delay_parameter_reaches_the_follower(rig_factory):
    rig = rig_factory(actuation_delay_s=0.1)  # Bench2Drive-Robust's latency at its default: a 2-tick control FIFO
    assert rig.node.gains.actuation_delay_s == 0.1 and rig.node.follower.gains.actuation_delay_s == 0.1
    assert rig.node.follower._delay_steps() == 2
