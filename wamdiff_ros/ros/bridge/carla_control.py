"""``wamdiff_carla_control``: the planner's PlannerOutput -> CARLA vehicle control over ROS 2, for teams on
carla-ros-bridge (Bench2Drive's ROS 2 contract: passive synchronous mode, one control command per simulator tick
stamped with sim time; Bench2Drive itself coasts -- CARLA's default control -- after 1 s of wall time without one).
This node brakes instead: zero throttle and full brake once no fresh plan has come for ``plan_timeout_s`` of wall time
(Bench2Drive's launch file: 0.5 s, ``bench2drive_adapter.py``).

Frames, stated once: the ego odometry is taken as REP-103 / REP-105 (right-handed: map frame x, y, yaw
counter-clockwise; twist in base_link, x forward, y left), which is what carla-ros-bridge publishes (it mirrors
CARLA's left-handed y and yaw). The follower works in that frame; only the CARLA steer changes sign on the way out
(``CarlaActuator``: CARLA's steer is positive to the RIGHT, normalised by the maximum wheel angle).

Tick: ``tick_source: odometry`` sends one command per odometry message (carla-ros-bridge publishes it once per
synchronous tick) stamped with its stamp; ``timer`` sends one per 1 / control_hz of the node's clock (sim time with
use_sim_time). Outputs: ``carla_msgs/CarlaEgoVehicleControl`` on ``/carla/<role_name>/vehicle_control_cmd`` where
carla_msgs is importable, and ``~/output/twist`` (geometry_msgs/TwistStamped, or Twist): linear.x = the follower's
target speed, angular.z = the yaw rate a kinematic bicycle of ``wheelbase_m`` makes at that speed with the
commanded front-wheel angle.
"""

from __future__ import annotations

import dataclasses
import math
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import Twist, TwistStamped
from nav_msgs.msg import Odometry
from rclpy.clock import Clock, ClockType
from rclpy.node import Node

from wamdiff_ros.control import CarlaActuator, FollowerGains, WaypointFollower
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.msg import PlannerOutput
from wamdiff_ros.ros.bridge import messages as bm
from wamdiff_ros.ros.bridge.sync import PlanTracker, PoseHistory, bicycle_yaw_rate
from wamdiff_ros.ros.conversions import stamp_ns
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.ros.common import declare_parameters, diagnostics_msg, spin_nodes, table_params

NODE_NAME = "wamdiff_carla_control"
PLAN_TOPIC = "wamdiff_planner/output/plan"
TWIST_KINDS = ("stamped", "plain", "off")
TICK_SOURCES = ("odometry", "timer")


PARAMETERS = {  # name: (default, description); all read at start
    "role_name": ("hero", "carla-ros-bridge role name: /carla/<role_name>/odometry in, "
                          "/carla/<role_name>/vehicle_control_cmd out"),
    "tick_source": ("odometry", "odometry: one command per odometry message, stamped with it | timer: one per "
                                "1 / control_hz on the node's clock"),
    "control_hz": (20.0, "timer tick rate (CARLA / Bench2Drive run at 20 Hz)"),
    "plan_timeout_s": (1.0, "wall seconds without a fresh plan before zero throttle and full brake"),
    "pose_tolerance_s": (0.1, "a plan's stamp must lie this close to an odometry sample"),
    "pose_history_s": (10.0, "seconds of ego poses kept to find a plan's origin"),
    "twist": ("stamped", "~/output/twist: stamped (TwistStamped) | plain (Twist) | off"),
    "vehicle_control": (True, "publish carla_msgs/CarlaEgoVehicleControl (where carla_msgs is installed)"),
    "wheelbase_m": (2.875, "wheelbase of the bicycle model behind the twist's yaw rate"),
    "max_steer_angle_deg": (0.0, "the vehicle's maximum front-wheel angle (0 = the carla gains' 70 deg); CARLA's "
                                 "steer is normalised by it"),
    "actuation_delay_s": (0.0, "a known delay between a command and its effect, s (e.g. 0.1 under Bench2Drive-"
                               "Robust's 2-tick control FIFO): the follower steers for the state the car will be in "
                               "then (0: none)"),
    "diagnostics_period_s": (1.0, "diagnostics period, wall seconds"),
}


@dataclasses.dataclass(slots=True)
class Counters:
    ticks: int = 0
    tracking: int = 0
    brake_no_plan: int = 0  # no plan yet, or none within plan_timeout_s of wall time
    brake_no_odometry: int = 0
    bad_messages: int = 0
    last_reason: str = ""


class CarlaControl(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_parameters(self, table_params(PARAMETERS))
        v = self._param
        if v("tick_source") not in TICK_SOURCES or v("twist") not in TWIST_KINDS:
            raise ValueError(f"tick_source must be one of {TICK_SOURCES} and twist one of {TWIST_KINDS}; got "
                             f"{v('tick_source')!r}, {v('twist')!r}")
        if not (v("control_hz") > 0 and v("plan_timeout_s") > 0 and v("wheelbase_m") > 0):
            raise ValueError("control_hz, plan_timeout_s and wheelbase_m must be > 0")
        if not 0.0 <= v("actuation_delay_s") <= 2.0:
            raise ValueError(f"actuation_delay_s must be in [0, 2] s, got {v('actuation_delay_s')}")
        gains = dataclasses.replace(FollowerGains.for_world("carla"), actuation_delay_s=float(v("actuation_delay_s")))
        if v("max_steer_angle_deg") > 0:
            gains = dataclasses.replace(gains, max_steer_rad=math.radians(v("max_steer_angle_deg")))
        self.gains = gains
        self.follower, self.actuator = WaypointFollower(gains), CarlaActuator(gains)
        self.history = PoseHistory(v("pose_history_s"))
        self.tracker = PlanTracker(self.history, v("pose_tolerance_s"))
        self.counters = Counters()
        self._odom: tuple[float, int, Pose2D, float] | None = None  # stamp s, stamp ns, pose, speed
        self._last_plan_wall: float | None = None
        self._braking = True
        self._base_frame = "base_link"

        role = v("role_name")
        self.odometry_topic = f"/carla/{role}/odometry"
        self.control_topic = f"/carla/{role}/vehicle_control_cmd"
        self._control_pub, self._control_cls = self._vehicle_control_publisher() if v("vehicle_control") else \
            (None, None)
        twist = v("twist")
        self._twist_pub = None if twist == "off" else self.create_publisher(
            TwistStamped if twist == "stamped" else Twist, "~/output/twist", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(PlannerOutput, PLAN_TOPIC, self._on_plan, 10)
        self.create_subscription(Odometry, self.odometry_topic, self._on_odometry, 10)
        if v("tick_source") == "timer":
            self.create_timer(1.0 / v("control_hz"), self._on_timer)  # the node's clock: sim time with use_sim_time
        self.create_timer(v("diagnostics_period_s"), self._publish_diagnostics,
                          clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(
            f"plans from {self.resolve_topic_name(PLAN_TOPIC)}, odometry from {self.odometry_topic}; control on "
            f"{self.control_topic if self._control_pub else '(no carla_msgs: not published)'}"
            f"{', ' + self.resolve_topic_name('~/output/twist') if self._twist_pub else ''}, one per {v('tick_source')}"
            " tick")

    def _param(self, name: str):
        return self.get_parameter(name).value

    def _vehicle_control_publisher(self):
        try:
            from carla_msgs.msg import CarlaEgoVehicleControl  # carla-ros-bridge's interfaces: not on PyPI
        except ImportError:
            self.get_logger().warning("carla_msgs is not installed: CarlaEgoVehicleControl is not published "
                                      "(source the carla-ros-bridge workspace)")
            return None, None
        return self.create_publisher(CarlaEgoVehicleControl, self.control_topic, 10), CarlaEgoVehicleControl

    # -- inputs (never raise) ---------------------------------------------------------------------------------------
    def _bad(self, what: str, exc: Exception) -> None:
        self.counters.bad_messages += 1
        self.get_logger().warning(f"dropped {what}: {exc}", throttle_duration_sec=2.0)

    def _on_plan(self, msg: PlannerOutput) -> None:
        try:
            plan = bm.plan_from_msg(msg)
        except WamDiffError as exc:
            self._bad("plan", exc)
            return
        reason = self.tracker.offer(plan)
        if reason is not None:
            self.get_logger().warning(f"plan stamped {plan.stamp:.3f} dropped: {reason}", throttle_duration_sec=5.0)
            return
        self._last_plan_wall = time.monotonic()

    def _on_odometry(self, msg: Odometry) -> None:
        try:
            stamp, pose, speed = bm.odometry_state(msg)
        except WamDiffError as exc:
            self._bad("odometry", exc)
            return
        self.history.add(stamp, pose)
        self._odom = (stamp, stamp_ns(msg.header.stamp), pose, speed)
        self._base_frame = msg.child_frame_id or self._base_frame  # the twist's frame, as the odometry's
        if self._param("tick_source") == "odometry":
            self._tick(self._odom[1])

    def _on_timer(self) -> None:
        self._tick(self.get_clock().now().nanoseconds)

    # -- one control command per tick -------------------------------------------------------------------------------
    def _tick(self, ns: int) -> None:
        c = self.counters
        c.ticks += 1
        fresh = self._last_plan_wall is not None and time.monotonic() - self._last_plan_wall <= \
            self._param("plan_timeout_s")
        if self._odom is None or not fresh:
            if self._odom is None:
                c.brake_no_odometry += 1
                c.last_reason = "brake: no odometry"
            else:
                c.brake_no_plan += 1
                c.last_reason = "brake: no plan within plan_timeout_s"
            if not self._braking:
                self.get_logger().warning(c.last_reason, throttle_duration_sec=2.0)
            self._braking = True
            self._publish(ns, 0.0, 0.0, 1.0, 0.0, 0.0)
            return
        if self._braking:  # a fresh start: the PIDs' windows hold errors from before the stop
            self.follower.reset()
            self._braking = False
        _, _, pose, speed = self._odom
        control = self.follower.step(self.tracker.active, pose, speed, ns * 1e-9)
        throttle, steer, brake = self.actuator(control)
        c.tracking += 1
        c.last_reason = control.reason
        wheel = min(max(control.steer, -self.gains.max_steer_rad), self.gains.max_steer_rad)
        self._publish(ns, throttle, steer, brake, control.target_speed,
                      bicycle_yaw_rate(control.target_speed, wheel, self._param("wheelbase_m")))

    def _publish(self, ns: int, throttle: float, steer: float, brake: float, speed: float, yaw_rate: float) -> None:
        if self._control_pub is not None:
            self._control_pub.publish(bm.vehicle_control_msg(self._control_cls, ns, throttle, steer, brake))
        if self._twist_pub is not None:
            self._twist_pub.publish(bm.twist_stamped_msg(ns, speed, yaw_rate, self._base_frame)
                                    if self._param("twist") == "stamped" else bm.twist_msg(speed, yaw_rate))

    # -- diagnostics ------------------------------------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        c = self.counters
        age = None if self._last_plan_wall is None else time.monotonic() - self._last_plan_wall
        level = DiagnosticStatus.WARN if self._braking or c.bad_messages else DiagnosticStatus.OK
        values = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        values.update(plans_received=self.tracker.counters.received, plans_applied=self.tracker.counters.applied,
                      plan_age_wall_s="none" if age is None else round(age, 3),
                      carla_msgs=self._control_pub is not None,
                      **{f"dropped.{k}": n for k, n in self.tracker.counters.dropped.items()})
        message = "braking: " + c.last_reason if self._braking else "tracking"
        self._diag_pub.publish(diagnostics_msg(NODE_NAME, "control", level, message, values,
                                               self.get_clock().now().to_msg()))


def main(argv: list[str] | None = None) -> int:
    return spin_nodes(NODE_NAME, lambda: [CarlaControl()], argv)


if __name__ == "__main__":
    raise SystemExit(main())
