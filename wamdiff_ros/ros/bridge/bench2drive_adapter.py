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
  thin agent's ``PoseFilter`` into ``nav_msgs/Odometry`` on ``/carla/hero/odometry``, one per tick stamped with it.
  **The tick is its sensor messages, not /clock**: carla-ros-bridge stamps every sensor message of a tick with that
  tick's time, and the adapter (``TickAssembler``) publishes the tick's odometry when the last of its GNSS, IMU and
  speedometer messages has come, from those three alone -- whatever order they and ``/clock`` arrive in (the bridge
  gives none: when ``/clock`` came first, odometry triggered by it was built from the previous tick's sensors). A
  tick whose messages never all come is dropped once a newer tick is complete (counted: ``incomplete_ticks``); a
  message of a tick already answered is ignored (``late_messages``); a new route, or stamps more than 1 s back,
  start over (a new route restarts the simulation clock). An unusable reading (a NaN fix) counts as the tick's and
  the last good one is used. Frame ``map``: carla-ros-bridge's right-handed map frame (x east, y = -CARLA y, yaw
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

The ROS side answers every tick it sees, the ``setup_sensors`` tick too: on no topic does that tick differ from the
first one a ``run_step`` reads. That its control never blocks the next one is the agent's part
(``carla_bridge/ros2_agent.py``: ``TickControlSlot``).
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
from sensor_msgs.msg import Imu, NavSatFix
from std_msgs.msg import Bool

from wamdiff_ros import format as fmt
from wamdiff_ros.carla_bridge.frames import GeoProjection
from wamdiff_ros.carla_bridge.localization import PoseFilter
from wamdiff_ros.carla_bridge.route import RouteCommands
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.msg import DrivingCommand
from wamdiff_ros.ros.bridge import messages as bm
from wamdiff_ros.ros.conversions import path_msg, stamp_ns, yaw_from_quaternion
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
TICK_PARTS = ("gnss", "imu", "speed")
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class TickAssembler:
    """One simulator tick's messages, gathered by stamp (rclpy-free). ``add(part, stamp_ns, value)`` returns
    ``(stamp_ns, {part: value})`` once every part of that tick has come -- in any order, each tick at most once --
    else None. Stamps within ``tolerance_ns`` are one tick (the bridge gives all of a tick's messages one stamp);
    a message older than the last complete tick is late (ignored), unless it is more than ``restart_ns`` older: the
    simulation clock started over (a new route), and so does the assembler (``restarts``)."""

    def __init__(self, parts: tuple[str, ...] = TICK_PARTS, tolerance_ns: int = 500_000,
                 restart_ns: int = 1_000_000_000, keep: int = 8) -> None:
        self.parts, self.tolerance_ns, self.restart_ns, self.keep = tuple(parts), tolerance_ns, restart_ns, keep
        self.counters = {"complete": 0, "incomplete_ticks": 0, "late_messages": 0, "restarts": 0}
        self.reset()

    def reset(self) -> None:
        self._pending: dict[int, dict] = {}
        self._last: int | None = None  # the newest complete tick's stamp

    def add(self, part: str, ns: int, value) -> tuple[int, dict] | None:
        if self._last is not None and ns <= self._last + self.tolerance_ns:
            if ns >= self._last - self.restart_ns:
                self.counters["late_messages"] += 1
                return None
            self.counters["restarts"] += 1
            self.reset()
        key = next((k for k in self._pending if abs(k - ns) <= self.tolerance_ns), ns)
        tick = self._pending.setdefault(key, {})
        tick[part] = value
        if len(self._pending) > self.keep:  # ticks that never complete do not pile up
            oldest = min(self._pending)
            del self._pending[oldest]
            self.counters["incomplete_ticks"] += 1
        if key not in self._pending or any(p not in tick for p in self.parts):
            return None
        older = [k for k in self._pending if k <= key]
        self.counters["incomplete_ticks"] += len(older) - 1
        for k in older:
            del self._pending[k]
        self._last = key
        self.counters["complete"] += 1
        return key, tick


class Bench2DriveAdapter(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_parameters(self, table_params(PARAMETERS, read_only=False))
        from carla_msgs.msg import CarlaGnssRoute, CarlaRoute, CarlaSpeedometer  # carla-ros-bridge's interfaces

        v = self._param
        hero, planner = f"/carla/{v('role_name')}", v("planner")
        self.pose_filter = PoseFilter(v("gnss_gain"))
        self.counters = {"ticks": 0, "odometry": 0, "waiting_for_sensors": 0, "routes": 0, "bad_messages": 0}
        self.ticks = TickAssembler()
        self._gnss: tuple[float, float] | None = None  # the latest good fix (lat, lon)
        self._yaw: float | None = None
        self._speed: float | None = None
        self._route_poses: list[tuple[float, float]] = []
        self._gnss_origin: tuple[float, float] | None = None  # the GNSS route's first point, when it has one
        self._projection: GeoProjection | None = None
        self._offset = (0.0, 0.0)
        self._route: RouteCommands | None = None
        self._status_sent = False

        self.create_subscription(NavSatFix, f"{hero}/{v('gnss_id')}", self._on_gnss, 10)
        self.create_subscription(Imu, f"{hero}/{v('imu_id')}", self._on_imu, 10)
        self.create_subscription(CarlaSpeedometer, f"{hero}/{v('speed_id')}", self._on_speed, 10)
        self.create_subscription(CarlaRoute, f"{hero}/global_plan", self._on_route, LATCHED)
        self.create_subscription(CarlaGnssRoute, f"{hero}/global_plan_gnss", self._on_gnss_route, LATCHED)
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

    # -- sensors: each message is part of its tick (its stamp) ---------------------------------------------------------
    def _on_gnss(self, msg: NavSatFix) -> None:
        fix = (float(msg.latitude), float(msg.longitude))
        self._part("gnss", msg, fix if all(math.isfinite(v) for v in fix) else None)

    def _on_imu(self, msg: Imu) -> None:
        try:
            yaw = yaw_from_quaternion(msg.orientation)
        except Exception as exc:  # a malformed message never stops the adapter
            self._bad("imu", exc)
            yaw = None
        self._part("imu", msg, yaw if yaw is not None and math.isfinite(yaw) else None)

    def _on_speed(self, msg) -> None:
        speed = float(msg.speed)
        self._part("speed", msg, speed if math.isfinite(speed) else None)

    def _part(self, part: str, msg, value) -> None:
        restarts = self.ticks.counters["restarts"]
        done = self.ticks.add(part, stamp_ns(msg.header.stamp), value)
        if self.ticks.counters["restarts"] != restarts:  # a new route restarted the simulation clock
            self.pose_filter.reset()
        if done is not None:
            self._on_tick(*done)

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
        self.ticks.reset()  # a new route: a new episode, whose clock may start anywhere
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

    # -- one tick: its own GNSS, IMU and speedometer messages ---------------------------------------------------------
    def _on_tick(self, ns: int, parts: dict) -> None:
        self.counters["ticks"] += 1
        for part, kept in (("gnss", "_gnss"), ("imu", "_yaw"), ("speed", "_speed")):
            if parts[part] is None:  # unusable reading: the last good one stands in
                self.counters["bad_messages"] += 1
            else:
                setattr(self, kept, parts[part])
        if self._speed is None or self._yaw is None or not self._anchor():
            self.counters["waiting_for_sensors"] += 1
            return
        t = ns * 1e-9
        east, north = self._projection.to_local(*self._gnss)
        fix = (east + self._offset[0], north + self._offset[1])
        x, y, heading = self.pose_filter.update(fix, self._yaw, self._speed, t)
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
        values = dict(self.counters, **{k: v for k, v in self.ticks.counters.items() if k != "complete"},
                      status_sent=self._status_sent, route_points=len(self._route_poses),
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
