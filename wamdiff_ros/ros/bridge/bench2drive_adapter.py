"""``wamdiff_bench2drive_adapter``: the planner node inside Bench2Drive's ROS 2 agent loop
(``carla_bridge/ros2_agent.py``).

Bench2Drive starts carla-ros-bridge (passive, synchronous: the leaderboard ticks CARLA at 20 Hz, the bridge
publishes ``/clock`` once per tick), spawns the agent's sensors, publishes the route on ``/carla/hero/global_plan``
(carla_msgs/CarlaRoute) and ``/carla/hero/global_plan_gnss`` (CarlaGnssRoute), both transient local, depth 1, waits
for ``std_msgs/Bool`` on ``/carla/hero/status``, and takes one ``carla_msgs/CarlaEgoVehicleControl`` per tick on
``/carla/hero/vehicle_control_cmd`` stamped with that tick's ``elapsed_seconds`` (within 1 ms); after 1 s of wall
time without one it applies CARLA's default control (throttle 0, brake 0: the car coasts).

This process runs two nodes:

- ``wamdiff_bench2drive_adapter`` (this module): the ego state from the validated sensors -- GNSS
  (``/carla/hero/gnss``, NavSatFix), IMU (``/carla/hero/imu``: its orientation is the compass, already as a yaw in
  the bridge's right-handed map frame) and the speedometer (``/carla/hero/speed``, CarlaSpeedometer) -- through the
  thin agent's ``PoseFilter`` into ``nav_msgs/Odometry`` on ``/carla/hero/odometry``, one per ``/clock`` tick
  stamped with it. Frame ``map``: carla-ros-bridge's right-handed map frame (x east, y = -CARLA y, yaw
  counter-clockwise), which is ``carla_bridge/frames.py``'s world frame. GNSS fixes are projected with the thin
  agent's ``GeoProjection``: around the GNSS route's first point and shifted onto the route's first pose, as the thin
  agent does; Bench2Drive 0.0.4 publishes ``global_plan_gnss`` without coordinates, so then around the first fix,
  shifted onto the route's first pose (the leaderboard spawns the ego there). The route -> the navigation command
  (``RouteCommands``, the thin agent's) on ``~/output/command`` each tick, and the route itself as ``nav_msgs/Path``
  (frame ``map``) on ``~/output/route``, both transient local (the launch file remaps the planner's inputs to them).
  ``/carla/hero/status`` (true, transient local) once the planner node reports the lifecycle state *active*.
- ``wamdiff_carla_control`` (``carla_control.py``, ``tick_source: odometry``): the shared waypoint follower, one
  control per odometry message, i.e. per tick, stamped with it; full brake once no plan has come for
  ``plan_timeout_s`` of wall time (0.5 s in ``launch/bench2drive.launch.py``), well before Bench2Drive's 1 s coast.
"""

from __future__ import annotations

import math

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState
from nav_msgs.msg import Odometry, Path
from rclpy.clock import Clock as Clock_, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, NavSatFix
from std_msgs.msg import Bool

from wamdiff_ros import format as fmt
from wamdiff_ros.carla_bridge.frames import GeoProjection
from wamdiff_ros.carla_bridge.localization import PoseFilter
from wamdiff_ros.carla_bridge.route import RouteCommands
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.msg import DrivingCommand
from wamdiff_ros.ros.bridge import messages as bm
from wamdiff_ros.ros.conversions import path_msg, stamp_to_sec, yaw_from_quaternion
from wamdiff_ros.ros.common import declare_parameters, diagnostics_msg, spin_nodes, table_params

NODE_NAME = "wamdiff_bench2drive_adapter"
FRAME = "map"
PARAMETERS = {  # name: (default, description); read at start
    "role_name": ("hero", "the ego's role name: /carla/<role_name>/..."),
    "planner": ("/wamdiff_planner", "the planner node, whose get_state service says when it is active"),
    "gnss_id": ("gnss", "sensor ids as the ROS2Agent spawns them: /carla/<role_name>/<id>"),
    "imu_id": ("imu", ""),
    "speed_id": ("speed", ""),
    "gnss_gain": (0.05, "the PoseFilter's pull toward each GNSS fix (the thin agent's)"),
    "command_lookahead_m": (60.0, "a junction's command is given from this far before it (the thin agent's)"),
    "command_hold_m": (10.0, "... until this far after it"),
}
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class Bench2DriveAdapter(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_parameters(self, table_params(PARAMETERS, read_only=False))
        from carla_msgs.msg import CarlaGnssRoute, CarlaRoute, CarlaSpeedometer  # carla-ros-bridge's interfaces

        v = self._param
        hero, planner = f"/carla/{v('role_name')}", v("planner")
        self.pose_filter = PoseFilter(v("gnss_gain"))
        self.counters = {"ticks": 0, "odometry": 0, "waiting_for_sensors": 0, "routes": 0, "bad_messages": 0}
        self._gnss: tuple[float, float] | None = None  # the latest fix (lat, lon)
        self._yaw: float | None = None
        self._speed: float | None = None
        self._route_poses: list[tuple[float, float]] = []
        self._gnss_origin: tuple[float, float] | None = None  # the GNSS route's first point, when it has one
        self._projection: GeoProjection | None = None
        self._offset = (0.0, 0.0)
        self._route: RouteCommands | None = None
        self._last_tick = -math.inf
        self._status_sent = False

        self.create_subscription(NavSatFix, f"{hero}/{v('gnss_id')}", self._on_gnss, 10)
        self.create_subscription(Imu, f"{hero}/{v('imu_id')}", self._on_imu, 10)
        self.create_subscription(CarlaSpeedometer, f"{hero}/{v('speed_id')}", self._on_speed, 10)
        self.create_subscription(CarlaRoute, f"{hero}/global_plan", self._on_route, LATCHED)
        self.create_subscription(CarlaGnssRoute, f"{hero}/global_plan_gnss", self._on_gnss_route, LATCHED)
        self.create_subscription(Clock, "/clock", self._on_clock, 10)
        self.odometry_pub = self.create_publisher(Odometry, f"{hero}/odometry", 10)
        self.command_pub = self.create_publisher(DrivingCommand, "~/output/command", LATCHED)
        self.route_pub = self.create_publisher(Path, "~/output/route", LATCHED)
        self.status_pub = self.create_publisher(Bool, f"{hero}/status", LATCHED)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._state_client = self.create_client(GetState, f"{planner}/get_state")
        self.create_timer(0.5, self._check_planner, clock=Clock_(clock_type=ClockType.STEADY_TIME))  # before ticks
        self.create_timer(1.0, self._publish_diagnostics, clock=Clock_(clock_type=ClockType.STEADY_TIME))

    def _param(self, name: str):
        return self.get_parameter(name).value

    def _bad(self, what: str, exc: Exception) -> None:
        self.counters["bad_messages"] += 1
        self.get_logger().warning(f"dropped {what}: {exc}", throttle_duration_sec=2.0)

    # -- sensors ------------------------------------------------------------------------------------------------------
    def _on_gnss(self, msg: NavSatFix) -> None:
        if math.isfinite(msg.latitude) and math.isfinite(msg.longitude):
            self._gnss = (float(msg.latitude), float(msg.longitude))

    def _on_imu(self, msg: Imu) -> None:
        try:
            self._yaw = yaw_from_quaternion(msg.orientation)
        except Exception as exc:  # a malformed message never stops the adapter
            self._bad("imu", exc)

    def _on_speed(self, msg) -> None:
        speed = float(msg.speed)
        if math.isfinite(speed):
            self._speed = speed

    # -- route --------------------------------------------------------------------------------------------------------
    def _on_route(self, msg) -> None:
        try:
            poses = [(float(p.position.x), float(p.position.y)) for p in msg.poses]
            options = [int(o) for o in msg.road_options]
            if not poses or len(poses) != len(options):
                raise ValueError(f"{len(poses)} poses, {len(options)} road options")
        except Exception as exc:
            self._bad("global_plan", exc)
            return
        self._route_poses = poses
        self.counters["routes"] += 1
        self._route = RouteCommands(poses, options, self._param("command_lookahead_m"), self._param("command_hold_m"))
        self._projection = None  # anchored again at the next tick
        self.pose_filter.reset()
        self.route_pub.publish(path_msg(np.asarray(poses), msg.header.stamp, FRAME))

    def _on_gnss_route(self, msg) -> None:
        if msg.coordinates:  # Bench2Drive 0.0.4 publishes none (its ROS 2 agent appends them to the other route)
            first = msg.coordinates[0]
            self._gnss_origin = (float(first.latitude), float(first.longitude))
            self._projection = None

    def _anchor(self) -> bool:
        """The GNSS projection, once a route and a fix are there: the thin agent's (the GNSS route's first point onto
        the route's first pose), else the first fix onto the route's first pose."""
        if self._projection is not None:
            return True
        if not self._route_poses or self._gnss is None:
            return False
        origin = self._gnss_origin or self._gnss
        self._projection = GeoProjection(*origin)
        self._offset = self._route_poses[0]
        return True

    # -- one tick -----------------------------------------------------------------------------------------------------
    def _on_clock(self, msg: Clock) -> None:
        t = stamp_to_sec(msg.clock)
        if t <= self._last_tick:
            if t < self._last_tick - 1.0:  # a new route restarted the simulation clock
                self._last_tick = -math.inf
                self.pose_filter.reset()
            return
        self._last_tick = t
        self.counters["ticks"] += 1
        if self._speed is None or self._yaw is None or not self._anchor():
            self.counters["waiting_for_sensors"] += 1
            return
        east, north = self._projection.to_local(*self._gnss)
        fix = (east + self._offset[0], north + self._offset[1])
        x, y, heading = self.pose_filter.update(fix, self._yaw, self._speed, t)
        ns = int(round(t * 1e9))
        self.odometry_pub.publish(bm.odometry_msg(ns, Pose2D(x, y, heading), (self._speed, 0.0), 0.0, FRAME,
                                                  "base_link"))
        self.counters["odometry"] += 1
        command = fmt.Command(self._route.update(x, y))
        self.command_pub.publish(bm.command_msg(command, ns))

    # -- status -------------------------------------------------------------------------------------------------------
    def _check_planner(self) -> None:
        if self._status_sent or not self._state_client.service_is_ready():
            return
        self._state_client.call_async(GetState.Request()).add_done_callback(self._on_state)

    def _on_state(self, future) -> None:
        result = future.result()
        if result is not None and result.current_state.id == State.PRIMARY_STATE_ACTIVE and not self._status_sent:
            self._status_sent = True
            self.status_pub.publish(Bool(data=True))
            self.get_logger().info(f"planner active: {self.status_pub.topic_name} = true")

    def _publish_diagnostics(self) -> None:
        values = dict(self.counters, status_sent=self._status_sent, route_points=len(self._route_poses),
                      gnss_origin="gnss route" if self._gnss_origin else "first fix" if self._projection else "none")
        level = DiagnosticStatus.OK if self._status_sent and self.counters["odometry"] else DiagnosticStatus.WARN
        message = "running" if level == DiagnosticStatus.OK else "waiting"
        self._diag_pub.publish(diagnostics_msg(NODE_NAME, "adapter", level, message, values,
                                               self.get_clock().now().to_msg()))


def main(argv: list[str] | None = None) -> int:
    """The adapter and the control node in one process (one executor)."""
    from wamdiff_ros.ros.bridge.carla_control import CarlaControl

    return spin_nodes(NODE_NAME, lambda: [Bench2DriveAdapter(), CarlaControl()], argv)


if __name__ == "__main__":
    raise SystemExit(main())
