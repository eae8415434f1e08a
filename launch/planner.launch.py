"""Start the wamdiff_planner managed node and drive it to active.

    ros2 launch wamdiff_ros planner.launch.py model:=/path/to/checkpoint image:=/camera/front/image_raw

Every topic is the node's private ``~/input/*`` / ``~/output/*`` name, remapped here. The node process loads the
package's Fast DDS profile (large shared-memory segment) unless FASTDDS_DEFAULT_PROFILES_FILE is already set;
camera drivers publishing big images should load the same profile (see README).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

ARGUMENTS = {
    "model": ("wamdiff-tiny", "checkpoint folder, wamdiff-tiny (the packaged trained student) or tiny-random"),
    "device": ("cpu", "torch device"),
    "params_file": ("", "parameter file replacing the package's config/planner.yaml (model, device and use_sim_time "
                        "given here still win)"),
    "image": ("/camera/front/image_raw", "sensor_msgs/Image topic"),
    "camera_info": ("/camera/front/camera_info", "sensor_msgs/CameraInfo topic"),
    "odometry": ("/odom", "nav_msgs/Odometry topic"),
    "command": ("/route/command", "wamdiff_ros/DrivingCommand topic"),
    "route": ("/route/path", "nav_msgs/Path topic: the route in the odometry's frame (in the prompt of a model "
                             "trained with route points)"),
    "use_sim_time": ("false", "use /clock"),
}


def _planner(context):
    """The node, configured then activated; its parameter file is ``params_file`` when given."""
    share = get_package_share_directory("wamdiff_ros")
    arg = LaunchConfiguration
    params = arg("params_file").perform(context) or os.path.join(share, "config", "planner.yaml")
    profile = os.path.join(share, "config", "fastdds.xml")
    node = LifecycleNode(
        package="wamdiff_ros",
        executable="wamdiff_planner_node",
        name="wamdiff_planner",
        namespace="",
        output="screen",
        parameters=[params, {"model": arg("model"), "device": arg("device"), "use_sim_time": arg("use_sim_time")}],
        remappings=[
            ("~/input/image", arg("image")),
            ("~/input/camera_info", arg("camera_info")),
            ("~/input/odometry", arg("odometry")),
            ("~/input/command", arg("command")),
            ("~/input/route", arg("route")),
        ],
        additional_env={"FASTDDS_DEFAULT_PROFILES_FILE": os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE", profile)},
    )
    configure = EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                            transition_id=Transition.TRANSITION_CONFIGURE))
    activate = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=node, goal_state="inactive",
        entities=[EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                              transition_id=Transition.TRANSITION_ACTIVATE))],
    ))
    return [node, activate, configure]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text)
         for name, (default, text) in ARGUMENTS.items()]
        + [OpaqueFunction(function=_planner)]
    )
