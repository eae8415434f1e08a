"""The agent core's waypoint follower and actuator adapters. No ROS, torch, highway-env or carla imports here."""

from wamdiff_ros.control.actuators import CarlaActuator, HighwayEnvActuator
from wamdiff_ros.control.follower import Control, TrackedPlan, WaypointFollower, aim_point, forward_path
from wamdiff_ros.control.gains import GAINS_PATH, FollowerGains, GainsError

__all__ = [
    "GAINS_PATH",
    "CarlaActuator",
    "Control",
    "FollowerGains",
    "GainsError",
    "HighwayEnvActuator",
    "TrackedPlan",
    "WaypointFollower",
    "aim_point",
    "forward_path",
]
