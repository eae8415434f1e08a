"""Messages of the simulator bridges <-> plain data (the planner node's own conversions are in ``conversions.py``).

Frames: the odometry frame is the world frame of ``wamdiff_ros.world.types`` (right-handed, REP-103), the twist is in
base_link (REP-105: x forward, y left); plan waypoints are in base_link at the plan's stamp. Stamps are integer
nanoseconds of the simulation clock, so a stamp that goes out and comes back in a PlannerOutput matches exactly.
"""

from __future__ import annotations

import math

import numpy as np
from geometry_msgs.msg import Twist, TwistStamped
from nav_msgs.msg import Odometry
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import InputError
from wamdiff_ros.msg import DrivingCommand, PlannerOutput
from wamdiff_ros.ros import conversions as conv
from wamdiff_ros.ros.conversions import time_ns
from wamdiff_ros.ros.bridge.sync import ReceivedPlan
from wamdiff_ros.world.camera import CameraConfig
from wamdiff_ros.geometry import Pose2D

COMMAND_VALUES = {
    fmt.Command.FOLLOW: DrivingCommand.LANE_FOLLOW,
    fmt.Command.LEFT: DrivingCommand.LEFT,
    fmt.Command.RIGHT: DrivingCommand.RIGHT,
    fmt.Command.STRAIGHT: DrivingCommand.STRAIGHT,
}


def clock_msg(ns: int) -> Clock:
    return Clock(clock=time_ns(ns))


def odometry_msg(ns: int, pose: Pose2D, velocity_ego: tuple[float, float], yaw_rate: float, frame_id: str,
                 child_frame_id: str) -> Odometry:
    """The ego's odometry: pose in ``frame_id`` (the world frame), twist in ``child_frame_id`` (the ego frame)."""
    msg = Odometry()
    msg.header.stamp, msg.header.frame_id, msg.child_frame_id = time_ns(ns), frame_id, child_frame_id
    msg.pose.pose.position.x, msg.pose.pose.position.y = float(pose.x), float(pose.y)
    msg.pose.pose.orientation = conv.quaternion_from_yaw(pose.heading)
    msg.twist.twist.linear.x, msg.twist.twist.linear.y = float(velocity_ego[0]), float(velocity_ego[1])
    msg.twist.twist.angular.z = float(yaw_rate)
    return msg


def odometry_state(msg: Odometry) -> tuple[float, Pose2D, float]:
    """(stamp s, pose in the odometry frame, signed speed along the heading m/s); raises EgoStateError when not
    finite."""
    x, y, yaw = conv.pose2d(msg)
    vx, _ = conv.odometry_to_velocity(msg)
    return conv.stamp_to_sec(msg.header.stamp), Pose2D(x, y, yaw), vx


def camera_info_msg(config: CameraConfig, ns: int, frame_id: str) -> CameraInfo:
    """The renderer's pinhole (square pixels, principal point at the image centre, no distortion) in ROS's pixel
    convention (pixel centres at integer coordinates, hence cx = (width - 1) / 2). The 5 deg pitch belongs to the
    camera's mounting, not to its intrinsics."""
    w, h = config.width, config.height
    f = config.camera_model().focal_px(w)
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    msg = CameraInfo(width=w, height=h, distortion_model="plumb_bob")
    msg.header.stamp, msg.header.frame_id = time_ns(ns), frame_id
    msg.d = [0.0] * 5
    msg.k = [f, 0.0, cx, 0.0, f, cy, 0.0, 0.0, 1.0]
    msg.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    msg.p = [f, 0.0, cx, 0.0, 0.0, f, cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return msg


def command_msg(command: fmt.Command, ns: int) -> DrivingCommand:
    msg = DrivingCommand(command=COMMAND_VALUES[fmt.Command(command)])
    msg.header.stamp = time_ns(ns)
    return msg


def plan_from_msg(msg: PlannerOutput) -> ReceivedPlan:
    """PlannerOutput -> ReceivedPlan (base_link waypoints); raises InputError on an empty or non-finite plan."""
    poses = msg.waypoints_base_link
    if len(poses) == 0:
        raise InputError("plan.waypoints_base_link", "is empty")
    wp = np.array([[p.pose.position.x, p.pose.position.y] for p in poses], dtype=np.float64)
    if not np.isfinite(wp).all():
        raise InputError("plan.waypoints_base_link", "holds a non-finite coordinate")
    return ReceivedPlan(conv.stamp_to_sec(msg.header.stamp), wp, bool(msg.valid), bool(msg.fallback),
                        int(msg.forward_calls), int(msg.new_tokens))


def twist_msg(speed: float, yaw_rate: float) -> Twist:
    msg = Twist()
    msg.linear.x, msg.angular.z = float(speed), float(yaw_rate)
    return msg


def twist_stamped_msg(ns: int, speed: float, yaw_rate: float, frame_id: str) -> TwistStamped:
    msg = TwistStamped(twist=twist_msg(speed, yaw_rate))
    msg.header.stamp, msg.header.frame_id = time_ns(ns), frame_id
    return msg


def vehicle_control_msg(cls: type, ns: int, throttle: float, steer: float, brake: float):
    """A ``carla_msgs/CarlaEgoVehicleControl`` (``cls``, imported by the caller where it exists): throttle [0, 1],
    steer [-1, 1] positive RIGHT (CARLA's sign), brake [0, 1], forward gear, automatic gearbox."""
    for name, value, lo in (("throttle", throttle, 0.0), ("steer", steer, -1.0), ("brake", brake, 0.0)):
        if not (math.isfinite(value) and lo <= value <= 1.0):
            raise InputError(f"control.{name}", f"must lie in [{lo}, 1], got {value}")
    msg = cls()
    msg.header.stamp = time_ns(ns)
    msg.throttle, msg.steer, msg.brake = float(throttle), float(steer), float(brake)
    msg.hand_brake, msg.reverse, msg.manual_gear_shift = False, False, False
    return msg
