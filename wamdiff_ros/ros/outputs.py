"""Plan, boxes and descriptions -> the package's own messages (the generated ``wamdiff_ros.msg`` interfaces), and the
node's publishers that carry them."""

from __future__ import annotations

import numpy as np
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Path
from sensor_msgs.msg import Image
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from wamdiff_ros import format as fmt
from wamdiff_ros.msg import (BoundingBox2DCentered, Detection2D, Detection2DArray, ObjectHypothesis, PlannerOutput,
                             SceneDescription)
from wamdiff_ros.planner import Plan
from wamdiff_ros.ros import conversions as conv

BASE_FRAME = "base_link"


def _poses(waypoints: np.ndarray, header, frame_id: str, origin) -> list[PoseStamped]:
    return list(conv.path_msg(waypoints, header.stamp, frame_id, origin=origin).poses)


def planner_output_msg(plan: Plan, header, pose: tuple[float, float, float], waypoints_odom: np.ndarray,
                       odom_frame: str, fallback: bool) -> PlannerOutput:
    """``header``: the input image's (its stamp is the output's); ``pose``: the ego in the odometry frame."""
    msg = PlannerOutput()
    msg.header.stamp = header.stamp
    msg.header.frame_id = BASE_FRAME
    msg.waypoints_base_link = _poses(plan.waypoints, header, BASE_FRAME, (0.0, 0.0, 0.0))
    msg.waypoints_odom = _poses(waypoints_odom, header, odom_frame, pose)
    msg.waypoint_confidence = [float(c) for c in plan.waypoint_confidence]
    msg.text = plan.text
    msg.valid = bool(plan.valid)
    msg.reason = plan.reason
    msg.fallback = bool(fallback)
    msg.anytime = bool(plan.anytime) and not fallback
    msg.edited = bool(plan.edited) and not fallback
    msg.edited_waypoints = [int(w) for w in plan.edited_waypoints] if msg.edited else []
    msg.draft_stepped_back = bool(plan.draft_stepped_back)
    msg.implausible = plan.implausible
    msg.held = bool(plan.held) and not fallback
    s = plan.stats
    msg.block_size = int(s.block_size)
    msg.denoise_steps = min(int(s.denoise_steps), 65535)
    msg.forward_calls = min(int(s.forward_calls), 65535)
    msg.new_tokens = min(int(s.new_tokens), 65535)
    msg.vision_ms = float(s.vision_s * 1e3)
    msg.prefill_ms = float(s.prefill_s * 1e3)
    msg.decode_ms = float(s.decode_s * 1e3)
    msg.reflect_rounds = min(int(s.reflect_rounds), 65535)
    msg.reflect_forwards = min(int(s.reflect_forwards), 65535)
    return msg


def detections_msg(boxes: list[fmt.Box], header, width: int, height: int) -> Detection2DArray:
    """The model's boxes (0-1000 grid) on the image of ``header`` (``width`` x ``height`` pixels), in pixels."""
    msg = Detection2DArray(header=header, image_width=int(width), image_height=int(height))
    for i, box in enumerate(boxes):
        x0, y0, x1, y1 = conv.box_to_pixels(box, width, height)
        msg.detections.append(Detection2D(
            header=header, results=[ObjectHypothesis(class_id=box.label, score=float(box.score))],
            bbox=BoundingBox2DCentered(center_x=(x0 + x1) / 2, center_y=(y0 + y1) / 2, size_x=float(x1 - x0),
                                       size_y=float(y1 - y0)),
            id=str(i)))
    return msg


def description_msg(text: str, questions: list[str], header) -> SceneDescription:
    return SceneDescription(header=header, text=text, questions=list(questions))


class NodeOutputs:
    """The planner node's publishers, made at configure (lifecycle publishers) and destroyed at cleanup, and what goes
    on each: a plan's four outputs, boxes, descriptions, answers and the debug image, every one stamped with its
    frame's header."""

    def __init__(self, node, marker_ns: str) -> None:
        out = node.create_lifecycle_publisher
        self._node = node
        self.marker_ns = marker_ns
        self.path_pub = out(Path, "~/output/path", 10)
        self.plan_pub = out(PlannerOutput, "~/output/plan", 10)
        self.text_pub = out(String, "~/output/text", 10)
        self.answer_pub = out(String, "~/output/answer", 10)
        self.boxes_pub = out(Detection2DArray, "~/output/boxes", 10)
        self.description_pub = out(SceneDescription, "~/output/description", 10)
        self.marker_pub = out(MarkerArray, "~/debug/markers", 10)
        self.debug_pub = out(Image, "~/debug/image", 2)

    def destroy(self) -> None:
        for pub in (self.path_pub, self.plan_pub, self.text_pub, self.answer_pub, self.boxes_pub,
                    self.description_pub, self.marker_pub, self.debug_pub):
            self._node.destroy_lifecycle_publisher(pub)

    def plan(self, header, plan: Plan, pose: tuple[float, float, float], waypoints_odom: np.ndarray, odom_frame: str,
             fallback: bool) -> None:
        self.plan_pub.publish(planner_output_msg(plan, header, pose, waypoints_odom, odom_frame, fallback))
        self.path_pub.publish(conv.path_msg(waypoints_odom, header.stamp, odom_frame, origin=pose))
        self.text_pub.publish(String(data=plan.text))
        self.marker_pub.publish(conv.markers_msg(waypoints_odom, plan.waypoint_confidence, plan.text, header.stamp,
                                                 odom_frame, self.marker_ns))

    def answer(self, text: str) -> None:
        self.answer_pub.publish(String(data=text))

    def boxes(self, boxes: list[fmt.Box], frame) -> None:
        height, width = frame.rgb.shape[:2]
        self.boxes_pub.publish(detections_msg(boxes, frame.header, width, height))

    def description(self, text: str, questions: list[str], frame) -> None:
        self.description_pub.publish(description_msg(text, questions, frame.header))

    @property
    def debug_wanted(self) -> bool:
        return self.debug_pub.get_subscription_count() > 0

    def debug_image(self, rgb: np.ndarray, header) -> None:
        self.debug_pub.publish(conv.rgb_to_image(rgb, header.stamp, header.frame_id))
