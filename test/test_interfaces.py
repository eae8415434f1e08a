"""The package's own ROS 2 interfaces (msg/), built by CMakeLists.txt with rosidl: generated, importable, serializable.

`make setup` builds them into .venv; a colcon workspace builds them into its install prefix. The checks that need
the generated code skip only when rclpy itself is not importable (a machine without ROS 2).
"""

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLANNER_OUTPUT_FIELDS = {
    "header": "std_msgs/Header",
    "waypoints_base_link": "sequence<geometry_msgs/PoseStamped>",
    "waypoints_odom": "sequence<geometry_msgs/PoseStamped>",
    "waypoint_confidence": "sequence<float>",
    "text": "string",
    "valid": "boolean",
    "reason": "string",
    "fallback": "boolean",
    "anytime": "boolean",
    "edited": "boolean",
    "edited_waypoints": "sequence<uint8>",
    "draft_stepped_back": "boolean",
    "implausible": "string",
    "held": "boolean",
    "block_size": "uint16",
    "denoise_steps": "uint16",
    "forward_calls": "uint16",
    "new_tokens": "uint16",
    "vision_ms": "float",
    "prefill_ms": "float",
    "decode_ms": "float",
    "reflect_rounds": "uint16",
    "reflect_forwards": "uint16",
}


def test_cmake_generates_every_msg_file():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    block = re.search(r"rosidl_generate_interfaces\((.*?)\)", cmake, re.S)
    assert block, "CMakeLists.txt has no rosidl_generate_interfaces(...)"
    listed = set(re.findall(r'"(msg/[^"]+\.msg)"', block.group(1)))
    on_disk = {f"msg/{p.name}" for p in (ROOT / "msg").glob("*.msg")}
    assert listed == on_disk


def _ros():
    """rclpy and the generated messages; skip only if rclpy is missing, fail if the messages are."""
    pytest.importorskip("rclpy", reason="rclpy is not importable (no ROS 2 here): generated interfaces not checked")
    from wamdiff_ros import msg

    return msg


def test_generated_messages_import():
    msg = _ros()
    from wamdiff_ros.planner import Planner  # the pure-Python package and the generated part live side by side

    assert Planner is not None
    for name in ("PlannerOutput", "DrivingCommand", "Detection2DArray", "SceneDescription"):
        cls = getattr(msg, name)
        assert cls.__module__.startswith("wamdiff_ros.msg."), cls.__module__


def test_driving_command_constants():
    msg = _ros()
    cmd = msg.DrivingCommand
    assert (cmd.LANE_FOLLOW, cmd.LEFT, cmd.RIGHT, cmd.STRAIGHT) == (0, 1, 2, 3)
    assert cmd.get_fields_and_field_types() == {"header": "std_msgs/Header", "command": "uint8"}
    assert cmd().command == cmd.LANE_FOLLOW


def test_planner_output_fields():
    msg = _ros()
    assert msg.PlannerOutput.get_fields_and_field_types() == PLANNER_OUTPUT_FIELDS


def test_detections_are_shaped_like_vision_msgs():
    """Field for field what vision_msgs/Detection2DArray holds (a relay copies them), plus the image size."""
    msg = _ros()
    assert msg.Detection2DArray.get_fields_and_field_types() == {
        "header": "std_msgs/Header", "image_width": "uint32", "image_height": "uint32",
        "detections": "sequence<wamdiff_ros/Detection2D>"}
    assert msg.Detection2D.get_fields_and_field_types() == {
        "header": "std_msgs/Header", "results": "sequence<wamdiff_ros/ObjectHypothesis>",
        "bbox": "wamdiff_ros/BoundingBox2DCentered", "id": "string"}
    assert msg.ObjectHypothesis.get_fields_and_field_types() == {"class_id": "string", "score": "double"}
    assert msg.BoundingBox2DCentered.get_fields_and_field_types() == {
        "center_x": "double", "center_y": "double", "size_x": "double", "size_y": "double"}
    assert msg.SceneDescription.get_fields_and_field_types() == {
        "header": "std_msgs/Header", "text": "string", "questions": "sequence<string>"}


def test_planner_output_round_trips_through_rclpy_serialization():
    msg = _ros()
    from geometry_msgs.msg import PoseStamped
    from rclpy.serialization import deserialize_message, serialize_message

    out = msg.PlannerOutput()
    out.header.stamp.sec, out.header.stamp.nanosec = 1_700_000_000, 250_000_000
    out.header.frame_id = "base_link"
    for frame, waypoints in (("base_link", out.waypoints_base_link), ("odom", out.waypoints_odom)):
        for i in range(8):
            pose = PoseStamped()
            pose.header.frame_id = frame
            pose.pose.position.x, pose.pose.position.y = 1.5 * (i + 1), -0.25 * i
            pose.pose.orientation.w = 1.0
            waypoints.append(pose)
    out.waypoint_confidence = [0.5 + 0.0625 * i for i in range(8)]
    out.text = "Turn left at the intersection; a car ahead."
    out.valid, out.reason, out.fallback, out.anytime = True, "", False, True
    out.block_size, out.denoise_steps, out.forward_calls, out.new_tokens = 32, 32, 9, 87
    out.vision_ms, out.prefill_ms, out.decode_ms = 12.5, 3.25, 41.0

    data = serialize_message(out)
    assert isinstance(data, bytes) and len(data) > 0
    back = deserialize_message(data, msg.PlannerOutput)
    assert back == out
    assert [p.pose.position.x for p in back.waypoints_odom] == [1.5 * (i + 1) for i in range(8)]
    assert back.anytime and back.header.stamp.nanosec == 250_000_000


def test_ament_index_knows_the_package(monkeypatch):
    _ros()
    from ament_index_python.packages import get_package_share_directory

    # The venv is an ament prefix (the ROS wheels and `make setup` install there); a sourced workspace sets its own.
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join(prefixes + [sys.prefix]))
    share = Path(get_package_share_directory("wamdiff_ros"))
    assert (share / "package.xml").is_file()
    shipped = {p.name for p in (ROOT / "config").iterdir() if p.is_file()}
    assert shipped and (share / "config").is_dir()
    assert {p.name for p in (share / "config").iterdir()} >= shipped
    assert {p.name for p in (share / "msg").glob("*.msg")} >= {p.name for p in (ROOT / "msg").glob("*.msg")}
