"""``wamdiff_planner``: the managed (lifecycle) ROS 2 node, a thin shell around ``Planner``.

configure loads the model (a bad path fails the transition with an ERROR diagnostic); activate starts inference
on one worker thread, always on the latest frame: a plan for every frame it takes, and detection, the scene
description and questions in the time plans leave (``schedule.py`` states the rule). Inputs: ``~/input/image`` (or
``~/input/image/compressed``), ``~/input/camera_info``, ``~/input/odometry``, ``~/input/command``,
``~/input/question`` and ``~/input/route`` (nav_msgs/Path in the odometry's frame; the Planner puts it in the prompt
of a model trained with it). Outputs: ``~/output/path``, ``~/output/plan``, ``~/output/text``, ``~/output/boxes``,
``~/output/description``, ``~/output/answer``, ``~/debug/markers``, ``~/debug/image``, ``/diagnostics``. Every output
is stamped with its input image's stamp. A watchdog answers every frame by ``deadline_ms``: the decoder's
best-so-far plan (``anytime``) when it has one, else the flagged fallback stop. Bad input never stops the node: it
is counted, logged (throttled) and reported in the diagnostics.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import SetParametersResult
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import String

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.attention import AttentionUnavailable
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.model import torch_dtype
from wamdiff_ros.msg import DrivingCommand
from wamdiff_ros.input_guard import EgoStateFilter
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_ros.ros import conversions as conv
from wamdiff_ros.ros.common import declare_parameters, diagnostics_msg, spin_nodes
from wamdiff_ros.ros.cycle import CycleInputs, Frame
from wamdiff_ros.ros.outputs import NodeOutputs
from wamdiff_ros.ros.parameters import DECODE_PARAMS, NodeConfig, check_default_command, parameters
from wamdiff_ros.ros.side_tasks import SideOutputs, SideTasks
from wamdiff_ros.ros.worker import Worker
from wamdiff_ros.stats import Counters

NODE_NAME = "wamdiff_planner"
DEFAULT_ODOM_FRAME = "odom"  # for odometry that names no frame
COMMANDS = {
    DrivingCommand.LANE_FOLLOW: fmt.Command.FOLLOW,
    DrivingCommand.LEFT: fmt.Command.LEFT,
    DrivingCommand.RIGHT: fmt.Command.RIGHT,
    DrivingCommand.STRAIGHT: fmt.Command.STRAIGHT,
}


def _qos_text(qos) -> str:
    if qos is None:
        return "unknown"
    return f"{qos.reliability.name.lower()}, {qos.durability.name.lower()}, depth {qos.depth}"


class PlannerNode(LifecycleNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_parameters(self, parameters())
        self.config = NodeConfig.read(lambda name: self.get_parameter(name).value)
        self.planner: Planner | None = None
        self.counters = Counters()
        self.estimator = conv.EgoEstimator()
        self.ego_filter = EgoStateFilter()  # used while ego_filter is on
        self.inputs = CycleInputs()
        self.outputs: NodeOutputs | None = None
        self.side = SideTasks(self.config.detect_hz, self.config.describe_hz, SideOutputs(
            answer=lambda text: self.outputs.answer(text), boxes=lambda boxes, f: self.outputs.boxes(boxes, f),
            description=lambda text, qs, f: self.outputs.description(text, qs, f),
            bad_question=lambda exc: self.bad_input("question", exc),
            warn=lambda text: self.get_logger().warning(text, throttle_duration_sec=2.0)))
        self.worker = Worker(self)
        self.blackbox = None
        self._lock = threading.Lock()  # guards the QoS problems
        self._qos_problems: dict[str, str] = {}  # topic -> the QoS policy its publisher offers incompatibly
        self._watchdog_timer = None
        self._status = (DiagnosticStatus.WARN, "unconfigured")
        self._fov_warned = False
        self.add_on_set_parameters_callback(self._on_parameters)
        self.add_post_set_parameters_callback(self._on_parameters_set)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(self.config.diagnostics_period_s, self._publish_diagnostics)

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        cfg = self.config
        try:
            cfg.check()
        except ValueError as exc:
            self._fail(str(exc))
            return TransitionCallbackReturn.FAILURE
        if cfg.torch_threads != 0:
            import torch

            torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1) if cfg.torch_threads < 0 else cfg.torch_threads)
        try:
            self.planner = Planner.from_pretrained(
                cfg.model, device=cfg.device, dtype=torch_dtype(cfg.dtype),
                mask_token_id=None if cfg.mask_token_id < 0 else cfg.mask_token_id, **cfg.decode)
        except (WamDiffError, OSError, ValueError, AttentionUnavailable) as exc:
            self._fail(f"model not loaded: {exc}")
            return TransitionCallbackReturn.FAILURE
        if self.planner.bundle.meta.route_points:
            self.get_logger().info("the model was trained with route points in its prompt: they come from "
                                   "~/input/route (nav_msgs/Path in the odometry's frame)")
        self.outputs = NodeOutputs(self, NODE_NAME)
        # The executor runs ready callbacks in the order their subscriptions were made: the command and odometry of
        # an instant, arriving with its image, are taken in before the image wakes the inference thread.
        image = ((CompressedImage, "~/input/image/compressed", self._on_compressed) if cfg.compressed
                 else (Image, "~/input/image", self._on_image))
        inputs = [(DrivingCommand, "~/input/command", self._on_command, self._latched()),
                  (Odometry, "~/input/odometry", self._on_odometry, 20),
                  (CameraInfo, "~/input/camera_info", self._on_camera_info, qos_profile_sensor_data),
                  (*image, self._image_qos()),
                  (String, "~/input/question", self._on_question, 10),
                  (Path, "~/input/route", self._on_route, self._latched())]
        for msg_type, topic, callback, qos in inputs:
            self._subscribe(msg_type, topic, callback, qos)
        self._setup_blackbox([i for i in inputs if i[1] not in ("~/input/camera_info", "~/input/question")])
        self._status = (DiagnosticStatus.OK, f"configured: {self.planner.bundle.source}")
        self.get_logger().info(f"model {self.planner.bundle.source} loaded; settings {self.planner.settings}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.worker.start()
        if self._watchdog_timer is None:
            self._watchdog_timer = self.create_timer(self.config.watchdog_period_ms / 1e3, self.worker.watchdog)
        self._status = (DiagnosticStatus.OK, "active")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.worker.stop()
        self._status = (DiagnosticStatus.WARN, "inactive")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.worker.stop()
        for sub in list(self.subscriptions):
            self.destroy_subscription(sub)
        self.outputs.destroy()
        self.planner = None
        self.inputs.clear_route()
        self._status = (DiagnosticStatus.WARN, "unconfigured")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.worker.stop()
        return TransitionCallbackReturn.SUCCESS

    # -- subscriptions --------------------------------------------------------------------------------------------
    def _latched(self) -> QoSProfile:
        return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)

    def _image_qos(self) -> QoSProfile:
        best_effort = self.config.image_reliability == "best_effort"
        return QoSProfile(depth=self.config.image_depth, durability=DurabilityPolicy.VOLATILE,
                          reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE)

    def _subscribe(self, msg_type, topic: str, callback, qos) -> None:
        """A subscription whose publishers with incompatible QoS are reported (``_on_incompatible_qos``)."""
        name = self.resolve_topic_name(topic)
        events = SubscriptionEventCallbacks(incompatible_qos=lambda info: self._on_incompatible_qos(name, info))
        self.create_subscription(msg_type, topic, callback, qos, event_callbacks=events)

    def _on_incompatible_qos(self, topic: str, info) -> None:
        """A publisher on ``topic`` offers QoS this subscription cannot match: reported once per topic and policy in
        the log and, until the node is reconfigured, in the diagnostics; nothing from it arrives."""
        kind = info.last_policy_kind
        policy = str(getattr(kind, "name", kind)).removeprefix("RMW_QOS_POLICY_")
        with self._lock:
            known = self._qos_problems.get(topic) == policy
            self._qos_problems[topic] = policy
        if not known:
            qos = next((s.qos_profile for s in self.subscriptions if s.topic_name == topic), None)
            self.get_logger().warning(f"a publisher on {topic} has an incompatible {policy} QoS policy: its messages "
                                      f"never arrive (this subscription: {_qos_text(qos)})")

    def _setup_blackbox(self, inputs: list[tuple]) -> None:
        """Raw copies of the ``inputs`` feed a rolling buffer that a fallback dumps to MCAP (size-capped)."""
        cfg = self.config
        self.blackbox = None
        if cfg.blackbox_dir == "none":
            return
        from wamdiff_ros.ros.blackbox import BlackBox, Recorder, default_folder

        def written(path, reason: str) -> None:
            self.counters.blackbox_files += 1
            self.get_logger().warning(f"black box written to {path} ({reason})")

        def failed(exc: Exception) -> None:
            self.counters.last_error = f"black box: {exc!r}"
            self.get_logger().error(f"black box not written: {exc!r}", throttle_duration_sec=10.0)

        self.blackbox = Recorder(BlackBox(cfg.blackbox_seconds, int(cfg.blackbox_max_mb * 2**20)),
                                 default_folder(cfg.blackbox_dir), written, failed)
        for cls, topic, _, qos in inputs:
            name, msgtype = self.resolve_topic_name(topic), cls.__module__.split(".")[0] + "/msg/" + cls.__name__
            self.create_subscription(cls, topic, lambda raw, n=name, t=msgtype: self.blackbox.add(
                n, t, self.get_clock().now().nanoseconds, raw), qos, raw=True)

    # -- parameters -------------------------------------------------------------------------------------------
    def _on_parameters(self, params) -> SetParametersResult:
        """Checks a change before it is made; new decode settings build the planner the worker takes next."""
        values = {p.name: p.value for p in params}
        try:
            check_default_command(values.get("default_command", ""))
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        changed = {k: v for k, v in values.items() if k in DECODE_PARAMS}
        if not changed or self.planner is None:
            return SetParametersResult(successful=True)
        try:
            settings = DecodeSettings(**{**dataclasses.asdict(self.planner.settings), **changed})
            planner = Planner(self.planner.bundle, settings)
        except (WamDiffError, ValueError, TypeError, AttentionUnavailable) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.planner = planner  # the worker picks it up on its next cycle
        self.get_logger().info(f"decode settings now {settings}")
        return SetParametersResult(successful=True)

    def _on_parameters_set(self, params) -> None:
        """The one place a live change lands: the config is read again."""
        self.config = cfg = NodeConfig.read(lambda name: self.get_parameter(name).value)
        if any(p.name in ("detect_hz", "describe_hz") for p in params):
            self.side.scheduler.set_rates(cfg.detect_hz, cfg.describe_hz)

    # -- inputs (executor threads; never raise) ----------------------------------------------------------------
    def bad_input(self, what: str, exc: Exception) -> None:
        self.counters.bad_input += 1
        self.counters.last_error = f"{what}: {exc}"
        self.get_logger().warning(f"dropped {what}: {exc}", throttle_duration_sec=2.0)

    def _accept_image(self, header, convert) -> None:
        if not self.worker.active:
            return
        t0 = time.perf_counter()
        try:
            rgb = self._resize(convert())
        except WamDiffError as exc:
            self.bad_input("image", exc)
            return
        self.counters.frames += 1
        frame = Frame(conv.stamp_to_sec(header.stamp), header, rgb, time.perf_counter() - t0, time.monotonic())
        self.side.scheduler.frame_arrived(frame.arrival)
        self.side.latest = frame
        self.worker.take(frame)

    def _resize(self, rgb: np.ndarray) -> np.ndarray:
        width, height = self.config.image_width, self.config.image_height
        if not width or not height or rgb.shape[:2] == (height, width):
            return rgb
        from PIL import Image as PILImage

        return np.asarray(PILImage.fromarray(rgb).resize((width, height), PILImage.BILINEAR))

    def _on_image(self, msg: Image) -> None:
        self._accept_image(msg.header, lambda: conv.image_to_rgb(msg))

    def _on_compressed(self, msg: CompressedImage) -> None:
        self._accept_image(msg.header, lambda: conv.compressed_to_rgb(msg))

    def _on_camera_info(self, msg: CameraInfo) -> None:
        if self._fov_warned or msg.width == 0 or msg.k[0] <= 0:
            return
        fov, model_fov = float(np.degrees(2 * np.arctan(msg.width / (2 * msg.k[0])))), self.config.model_fov_deg
        if abs(fov - model_fov) > 5.0:
            self._fov_warned = True
            self.get_logger().warning(f"camera FOV {fov:.1f} deg differs from the model card's {model_fov:.1f} deg")

    def _on_odometry(self, msg: Odometry) -> None:
        try:
            stamp = conv.stamp_to_sec(msg.header.stamp)
            pose = conv.pose2d(msg)
            ego = self.estimator.update(stamp, conv.odometry_to_velocity(msg), pose[2])
        except WamDiffError as exc:
            self.bad_input("odometry", exc)
            return
        if self.config.ego_filter:
            pose, ego = self._filtered(stamp, pose, ego)
        self.inputs.add_odometry(stamp, msg.header.frame_id, pose, ego)

    def _filtered(self, stamp: float, pose: tuple[float, float, float], ego: EgoState):
        """``ego_filter``: the pose and speed the filter estimates (``input_guard.EgoStateFilter``), the velocity's
        direction as measured."""
        speed = float(np.hypot(*ego.velocity))
        estimate = self.ego_filter.update(stamp, pose[0], pose[1], pose[2], speed)
        scale = estimate.speed / speed if speed > 1e-3 else 1.0
        self.counters.pose_jumps, self.counters.speed_scaled = self.ego_filter.jumps, self.ego_filter.scaled
        return (estimate.x, estimate.y, pose[2]), EgoState((ego.velocity[0] * scale, ego.velocity[1] * scale),
                                                          ego.acceleration)

    def _on_route(self, msg: Path) -> None:
        """Keeps the latest route; a malformed one is dropped (reported) and clears the route, an empty one clears it
        quietly: a model that wants route points then plans without them."""
        try:
            points = np.array([(p.pose.position.x, p.pose.position.y) for p in msg.poses], np.float64).reshape(-1, 2)
            self.inputs.set_route(conv.stamp_to_sec(msg.header.stamp) or self.now(), msg.header.frame_id, points)
        except Exception as exc:  # whatever the message holds, the node goes on
            self.inputs.clear_route(f"error: {exc}")
            self.bad_input("route", exc)

    def _on_command(self, msg: DrivingCommand) -> None:
        command = COMMANDS.get(msg.command)
        if command is None:
            self.bad_input("command", ValueError(f"unknown command value {msg.command}"))
            return
        self.inputs.set_command(conv.stamp_to_sec(msg.header.stamp) or self.now(), command)

    def _on_question(self, msg: String) -> None:
        if self.worker.active:
            self.side.question = msg.data  # answered by the inference thread between frames (the model is not shared)

    def now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    @property
    def sim_time(self) -> bool:
        return bool(self.get_parameter("use_sim_time").value)

    @property
    def odom_frame(self) -> str:
        """The odometry's own frame (map, odom, ...), ``odom`` when it names none."""
        return self.inputs.odom_frame_id or DEFAULT_ODOM_FRAME

    # -- diagnostics -------------------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        self._status = (DiagnosticStatus.ERROR, message)
        self.counters.last_error = message
        self.get_logger().error(message)
        self._publish_diagnostics()

    def _publish_diagnostics(self) -> None:
        c = self.counters
        level, message = self._status
        if level == DiagnosticStatus.OK and (c.fallback or c.skipped or c.bad_input or c.errors):
            message = f"{message}; {c.fallback} fallbacks, {c.skipped} skipped, {c.bad_input} bad inputs"
        values = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "reasons"}
        values.update({f"skipped.{k}": v for k, v in c.reasons.items()})
        values.update(self.worker.values())
        values.update(self.side.scheduler.values())
        values["model"] = self.planner.bundle.source if self.planner else ""
        values["decode_path"] = self.planner.backend if self.planner else ""
        values.update(self.inputs.values(self.now()))
        values["command_source"] = (f"default_command ({self.config.default_command})" if self.inputs.default_in_use
                                    else "~/input/command")
        with self._lock:
            problems = dict(self._qos_problems)
        values["qos_incompatible"] = "; ".join(f"{t}: {p}" for t, p in sorted(problems.items())) or "none"
        self._diag_pub.publish(diagnostics_msg(NODE_NAME, "planner", level, message, values,
                                               self.get_clock().now().to_msg()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    autostart = "--autostart" in argv

    def build() -> list[PlannerNode]:
        node = PlannerNode()
        if autostart:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().error("configure failed; staying unconfigured")
            else:
                node.trigger_activate()
        return [node]

    return spin_nodes(NODE_NAME, build, [a for a in argv if a != "--autostart"],
                      finish=lambda nodes: nodes[0].worker.stop())


if __name__ == "__main__":
    raise SystemExit(main())
