"""The closed loop over ROS 2: the highway-env bridge (simulator and clock master) and the wamdiff_planner node.

    ros2 launch wamdiff_ros closed_loop.launch.py scenario:=roundabout seed:=1000000 episodes:=5 \
        results_json:=/tmp/closed_loop.json

Both run on /clock (use_sim_time). The planner's private inputs are remapped to the bridge's sensor topics and the
bridge reads the planner's ~/output/plan. With sync:=true the world waits for the plan of every camera frame (the
planner then reads images reliably so that none is lost). Without launch (PyPI ROS): ``wamdiff-closed-loop-ros``.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from launch_ros.parameter_descriptions import ParameterValue
from lifecycle_msgs.msg import Transition

ARGUMENTS = {
    "model": ("wamdiff-tiny", "checkpoint folder, wamdiff-tiny (the packaged trained student) or tiny-random"),
    "device": ("cpu", "torch device"),
    "scenario": ("highway", "highway | merge | roundabout | intersection"),
    "seed": ("1000000", "first episode's seed"),
    "episodes": ("1", "episodes to run (0 = reset forever)"),
    "max_sim_s": ("0.0", "stop after this much sim time (0 = no limit)"),
    "sync": ("true", "the world waits for each camera frame's plan"),
    "camera_hz": ("10.0", "camera rate"),
    "real_time_factor": ("0.0", "pace the world (0 = as fast as allowed)"),
    "results_json": ("", "write the episode scores here ('' = nowhere)"),
}
# The bridge's launch arguments and their parameter types (typed, so that "10" stays a double and "" a string).
BRIDGE_TYPES = {"scenario": str, "seed": int, "episodes": int, "max_sim_s": float, "sync": bool, "camera_hz": float,
                "real_time_factor": float, "results_json": str}
# The planner's private inputs <- the bridge's topics (wamdiff_ros.ros.bridge.highway.TOPICS).
REMAPPINGS = [
    ("~/input/image", "/camera/front/image_raw"),
    ("~/input/camera_info", "/camera/front/camera_info"),
    ("~/input/odometry", "/odom"),
    ("~/input/command", "/route/command"),
]


def generate_launch_description():
    share = get_package_share_directory("wamdiff_ros")
    profile = os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE", os.path.join(share, "config", "fastdds.xml"))
    arg = LaunchConfiguration
    bridge = Node(
        package="wamdiff_ros",
        executable="wamdiff_highway_bridge",
        name="wamdiff_highway_bridge",
        namespace="",
        output="screen",
        parameters=[os.path.join(share, "config", "highway_bridge.yaml"), {
            "use_sim_time": True,
            **{name: ParameterValue(arg(name), value_type=kind) for name, kind in BRIDGE_TYPES.items()},
        }],
        additional_env={"FASTDDS_DEFAULT_PROFILES_FILE": profile},
    )
    planner = LifecycleNode(
        package="wamdiff_ros",
        executable="wamdiff_planner_node",
        name="wamdiff_planner",
        namespace="",
        output="screen",
        parameters=[os.path.join(share, "config", "planner.yaml"), {
            "use_sim_time": True, "model": ParameterValue(arg("model"), value_type=str),
            "device": ParameterValue(arg("device"), value_type=str),
            "image_reliability": "reliable", "blackbox_dir": "none",
        }],
        remappings=REMAPPINGS,
        additional_env={"FASTDDS_DEFAULT_PROFILES_FILE": profile},
    )
    configure = EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(planner),
                                            transition_id=Transition.TRANSITION_CONFIGURE))
    activate = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=planner, goal_state="inactive",
        entities=[EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(planner),
                                              transition_id=Transition.TRANSITION_ACTIVATE))],
    ))
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text)
         for name, (default, text) in ARGUMENTS.items()]
        + [bridge, planner, activate, configure]
    )
