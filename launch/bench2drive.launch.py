"""Bench2Drive's ROS 2 agent path: the planner node (``planner.launch.py``, its inputs on the topics carla-ros-bridge
publishes for the ROS2Agent's sensors and on the adapter's) and the Bench2Drive adapter with the control node
(``wamdiff_ros/carla_bridge/ros2_agent.py`` names this file in ``get_ros_entrypoint``; Bench2Drive runs
``ros2 launch wamdiff_ros bench2drive.launch.py model:=...``).

    /carla/hero/rgb_front/image ─► wamdiff_planner ─► ~/output/plan ─► wamdiff_carla_control
        ─► /carla/hero/vehicle_control_cmd (one per odometry message, i.e. per tick)
    /carla/hero/{gnss,imu,speed} ─► wamdiff_bench2drive_adapter ─► /carla/hero/odometry (one per tick: when its
        three messages, by stamp, are in -- in whatever order they and /clock come)
    /carla/hero/global_plan{,_gnss} ─► adapter ─► command, route ─► wamdiff_planner;  adapter ─► /carla/hero/status

Everything runs on sim time (``/clock``, published by the bridge once per tick). The setup tick Bench2Drive runs no
``run_step`` for is answered like any other; ``WamDiffROS2Agent`` keeps its control from blocking the next.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

ADAPTER = "/wamdiff_bench2drive_adapter"
ARGUMENTS = {
    "model": ("wamdiff-tiny", "checkpoint folder, wamdiff-tiny (the packaged trained student) or tiny-random"),
    "device": ("cpu", "torch device"),
    "params_file": ("", "parameter file replacing the package's config/planner.yaml"),
    "role_name": ("hero", "the ego's role name (Bench2Drive: hero)"),
    "camera_id": ("rgb_front", "the ROS2Agent's camera sensor id"),
    "plan_timeout_s": ("0.5", "full brake once no plan has come for this long (wall s); Bench2Drive coasts after 1 s "
                              "without a control"),
}


def _nodes(context):
    share = get_package_share_directory("wamdiff_ros")
    arg = LaunchConfiguration
    hero = "/carla/" + arg("role_name").perform(context)
    camera = hero + "/" + arg("camera_id").perform(context)
    planner = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(os.path.join(share, "launch", "planner.launch.py")),
        launch_arguments={
            "model": arg("model"), "device": arg("device"), "params_file": arg("params_file"), "use_sim_time": "true",
            "image": camera + "/image", "camera_info": camera + "/camera_info", "odometry": hero + "/odometry",
            "command": ADAPTER + "/output/command", "route": ADAPTER + "/output/route",
        }.items(),
    )
    adapter = Node(  # the adapter and wamdiff_carla_control in one process
        package="wamdiff_ros", executable="wamdiff_bench2drive_adapter", output="screen",
        parameters=[{"use_sim_time": True, "role_name": arg("role_name"), "tick_source": "odometry",
                     "plan_timeout_s": arg("plan_timeout_s"), "twist": "off"}],
        additional_env={"FASTDDS_DEFAULT_PROFILES_FILE": os.environ.get(
            "FASTDDS_DEFAULT_PROFILES_FILE", os.path.join(share, "config", "fastdds.xml"))},
    )
    return [planner, adapter]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text)
         for name, (default, text) in ARGUMENTS.items()]
        + [OpaqueFunction(function=_nodes)]
    )
