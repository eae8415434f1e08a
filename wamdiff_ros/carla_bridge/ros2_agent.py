"""Bench2Drive's ROS 2 agent path: a ``ROS2Agent`` whose ROS graph is this package's (stdlib only, Python 3.7
syntax: Bench2Drive imports it in CARLA 0.9.15's Python).

Bench2Drive (``leaderboard/autoagents/ros2_agent.py``) starts carla-ros-bridge (passive, synchronous), then runs
``ros2 launch <package> <launch_file> key:=value ...`` from ``get_ros_entrypoint()`` -- here
``launch/bench2drive.launch.py``: the planner node and the adapter
(``wamdiff_ros/ros/bridge/bench2drive_adapter.py``) --
spawns ``sensors()`` through the bridge, waits for ``/carla/hero/status``, publishes the route and takes one
``CarlaEgoVehicleControl`` per tick. ``get_ros_entrypoint`` runs in the base class's ``__init__``, before
``setup``: its launch arguments come from the environment (``WAMDIFF_MODEL``, ``WAMDIFF_DEVICE``,
``WAMDIFF_PLAN_TIMEOUT_S``).

Sensors: the thin agent's (``agent.py``: the front camera of the model card, IMU, GNSS, speedometer), with the ids
the adapter listens to. Bench2Drive 0.0.4's ROS path turns a sensor's roll / pitch / yaw (degrees) into a quaternion
as if they were radians, and the bridge reads the quaternion back in degrees; a non-zero angle is therefore given
here in radians so that the sensor is mounted at the intended angle in degrees.

Leaderboard use: ``--agent=<repo>/wamdiff_ros/carla_bridge/ros2_agent.py`` with the package built in a sourced ROS 2
workspace (``colcon build``) and carla-ros-bridge's leaderboard-2.0 branch next to it.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, List

try:
    import wamdiff_ros  # noqa: F401
except ImportError:  # loaded by file path without the repository on PYTHONPATH
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from wamdiff_ros.carla_bridge.agent import AgentConfig  # noqa: E402
from wamdiff_ros.carla_bridge.frames import camera_pitch_carla  # noqa: E402

# Bench2Drive's classes (the tests stand them in: test/bench2drive_stand_in.py)
from leaderboard.autoagents.autonomous_agent import Track  # noqa: E402
from leaderboard.autoagents.ros2_agent import ROS2Agent  # noqa: E402

PACKAGE, LAUNCH_FILE = "wamdiff_ros", "bench2drive.launch.py"
CAMERA_ID, IMU_ID, GNSS_ID, SPEED_ID = "rgb_front", "imu", "gnss", "speed"  # the adapter's defaults


def get_entry_point() -> str:
    return "WamDiffROS2Agent"


class WamDiffROS2Agent(ROS2Agent):
    def setup(self, path_to_conf_file: str) -> None:
        self.track = Track.SENSORS

    def get_ros_entrypoint(self) -> Dict[str, Any]:
        """``ros2 launch wamdiff_ros bench2drive.launch.py`` with the model and limits from the environment."""
        env = os.environ
        return {
            "package": PACKAGE,
            "launch_file": LAUNCH_FILE,
            "parameters": {
                "model": env.get("WAMDIFF_MODEL", "wamdiff-tiny"),
                "device": env.get("WAMDIFF_DEVICE", "cpu"),
                "plan_timeout_s": env.get("WAMDIFF_PLAN_TIMEOUT_S", "0.5"),
                "role_name": "hero",
                "camera_id": CAMERA_ID,
            },
        }

    def sensors(self) -> List[Dict[str, Any]]:
        cfg = AgentConfig()  # the model card's camera (the thin agent's defaults)
        zero = {"x": 0.0, "y": 0.0, "z": 0.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}
        pitch = math.radians(camera_pitch_carla(cfg.camera_pitch_deg))  # radians: Bench2Drive 0.0.4's slip (above)
        return [
            {"type": "sensor.camera.rgb", "id": CAMERA_ID, "x": cfg.camera_x_m, "y": cfg.camera_y_m,
             "z": cfg.camera_z_m, "roll": 0.0, "pitch": pitch, "yaw": 0.0,
             "width": cfg.camera_width, "height": cfg.camera_height, "fov": cfg.camera_fov_deg},
            dict(zero, type="sensor.other.imu", id=IMU_ID),
            {"type": "sensor.other.gnss", "id": GNSS_ID, "x": 0.0, "y": 0.0, "z": 0.0},
            {"type": "sensor.speedometer", "id": SPEED_ID},
        ]
