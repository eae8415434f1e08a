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
from dataclasses import dataclass

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.attention import AttentionUnavailable
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.msg import Detection2DArray, DrivingCommand, PlannerOutput, SceneDescription
from wamdiff_ros.model import torch_dtype
from wamdiff_ros.planner import EgoState, Plan, Planner, PlanStats
from wamdiff_ros.route_points import route_points_ahead
from wamdiff_ros.ros import conversions as conv
from wamdiff_ros.ros.outputs import description_msg, detections_msg, planner_output_msg
from wamdiff_ros.ros.schedule import ANSWER, DESCRIBE, DETECT, PLAN, Scheduler
from wamdiff_ros.ros.parameters import DECODE_PARAMS, Param, parameters
from wamdiff_ros.ros.cycle import (ClockRate, Counters, DeadlineWatch, InputLimits, LatencyWindow, LatestSlot,
                                   StampedHistory, check_inputs, default_command_due)
from wamdiff_ros.control.stop import fallback_stop

NODE_NAME = "wamdiff_planner"
DEFAULT_ODOM_FRAME = "odom"  # for odometry that names no frame
COMMANDS = {
    DrivingCommand.LANE_FOLLOW: fmt.Command.FOLLOW,
    DrivingCommand.LEFT: fmt.Command.LEFT,
    DrivingCommand.RIGHT: fmt.Command.RIGHT,
    DrivingCommand.STRAIGHT: fmt.Command.STRAIGHT,
}


def _descriptor(param: Param) -> ParameterDescriptor:
    d = ParameterDescriptor(description=param.description, read_only=param.read_only)
    if param.low is not None and isinstance(param.default, int):
        d.integer_range = [IntegerRange(from_value=int(param.low), to_value=int(param.high), step=1)]
    elif param.low is not None:
        d.floating_point_range = [FloatingPointRange(from_value=float(param.low), to_value=float(param.high),
                                                     step=0.0)]
    return d


@dataclass(slots=True)
class Frame:
    stamp: float  # seconds, the node's clock
    header: object
    rgb: np.ndarray
    convert_s: float = 0.0  # time spent turning the message into the array
    arrival: float = 0.0  # time.monotonic() when it arrived


@dataclass(slots=True)
class RouteInput:
    """The latest ``~/input/route``: its points (N, 2) in ``frame_id``; ``refused`` once a cycle has reported that
    its frame is not the odometry's (reported once per message, skipped every cycle)."""
    stamp: float
    frame_id: str
    points: np.ndarray
    refused: bool = False


def _check_default_command(value: str) -> None:
    if value and value not in {c.value for c in fmt.Command}:
        raise ValueError(f"default_command {value!r} is not '' or one of {', '.join(c.value for c in fmt.Command)}")


def _qos_text(qos) -> str:
    if qos is None:
        return "unknown"
    return f"{qos.reliability.name.lower()}, {qos.durability.name.lower()}, depth {qos.depth}"


def _seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class PlannerNode(LifecycleNode):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        for param in parameters():
            default = list(param.default) if isinstance(param.default, tuple) else param.default
            self.declare_parameter(param.name, default, _descriptor(param))
        self.planner: Planner | None = None
        self.counters = Counters()
        self.latency = LatencyWindow()  # inference (plan()) time
        self.frame_to_plan = LatencyWindow()  # image stamp -> outputs published, on the node's clock
        self.ros_overhead = LatencyWindow()  # message -> array conversion plus publishing the outputs
        self.slot: LatestSlot[Frame] = LatestSlot()
        self.estimator = conv.EgoEstimator()
        self._lock = threading.Lock()  # guards the latest command / path
        self._odometry: StampedHistory[tuple[tuple[float, float, float], EgoState]] = StampedHistory()
        self._command: tuple[float, fmt.Command] | None = None
        self._route: RouteInput | None = None  # the latest ~/input/route
        self._odom_frame_id = ""  # header.frame_id of the latest odometry
        self._route_state = "none"  # for the diagnostics: none | used | refused: ... | error: ...
        self._plan_route = ""  # the last plan's stats.route
        self._qos_problems: dict[str, str] = {}  # topic -> the QoS policy its publisher offers incompatibly
        self._watch: DeadlineWatch[object] = DeadlineWatch()  # the headers of frames taken in, not yet answered
        self._watchdog_timer = None
        self._publishing = threading.Lock()  # the worker and the watchdog publish; one answer at a time
        self._default_in_use = False  # the last cycle planned with default_command
        self._last_path_odom: np.ndarray | None = None
        self._last_image_stamp = -np.inf
        self._worker: threading.Thread | None = None
        self._latest_frame: Frame | None = None
        self._question: str | None = None
        self.scheduler = Scheduler(self._param("detect_hz"), self._param("describe_hz"))
        self._planned: tuple[Frame, Plan] | None = None  # the last frame planned (side tasks and the debug image)
        self._boxes: list = []  # the latest detection's boxes
        self._description = ""
        self._side_seen: dict[str, float] = {}  # side task -> the stamp of the frame it last looked at
        self._last_debug = -np.inf
        self._clock_rate = ClockRate()  # node clock vs wall clock, sampled by the watchdog timer
        self._active = False
        self._status = (DiagnosticStatus.WARN, "unconfigured")
        self._fov_warned = False
        self.add_on_set_parameters_callback(self._on_parameters)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diag_timer = self.create_timer(
            self.get_parameter("diagnostics_period_s").value, self._publish_diagnostics
        )

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._image_qos()
            _check_default_command(self._param("default_command"))
        except ValueError as exc:
            self._fail(str(exc))
            return TransitionCallbackReturn.FAILURE
        threads = self._param("torch_threads")
        if threads != 0:
            import torch

            torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1) if threads < 0 else threads)
        try:
            self.planner = Planner.from_pretrained(
                self._param("model"), device=self._param("device"), dtype=torch_dtype(self._param("dtype")),
                mask_token_id=None if self._param("mask_token_id") < 0 else self._param("mask_token_id"),
                **{k: self._param(k) for k in DECODE_PARAMS},
            )
        except (WamDiffError, OSError, ValueError, AttentionUnavailable) as exc:
            self._fail(f"model not loaded: {exc}")
            return TransitionCallbackReturn.FAILURE
        if self.planner.bundle.meta.route_points:
            self.get_logger().info("the model was trained with route points in its prompt: they come from "
                                   "~/input/route (nav_msgs/Path in the odometry's frame)")
        out = self.create_lifecycle_publisher
        self._path_pub = out(Path, "~/output/path", 10)
        self._plan_pub = out(PlannerOutput, "~/output/plan", 10)
        self._text_pub = out(String, "~/output/text", 10)
        self._answer_pub = out(String, "~/output/answer", 10)
        self._boxes_pub = out(Detection2DArray, "~/output/boxes", 10)
        self._description_pub = out(SceneDescription, "~/output/description", 10)
        self._marker_pub = out(MarkerArray, "~/debug/markers", 10)
        self._debug_pub = out(Image, "~/debug/image", 2)
        command_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
        image_qos = self._image_qos()
        # The executor runs ready callbacks in the order their subscriptions were made: the command and odometry of
        # an instant, arriving with its image, are taken in before the image wakes the inference thread.
        sub = self._subscribe
        sub(DrivingCommand, "~/input/command", self._on_command, command_qos)
        sub(Odometry, "~/input/odometry", self._on_odometry, 20)
        sub(CameraInfo, "~/input/camera_info", self._on_camera_info, qos_profile_sensor_data)
        if self._param("compressed"):
            sub(CompressedImage, "~/input/image/compressed", self._on_compressed, image_qos)
        else:
            sub(Image, "~/input/image", self._on_image, image_qos)
        sub(String, "~/input/question", self._on_question, 10)
        sub(Path, "~/input/route", self._on_route, command_qos)
        self._setup_blackbox(command_qos)
        self._status = (DiagnosticStatus.OK, f"configured: {self.planner.bundle.source}")
        self.get_logger().info(f"model {self.planner.bundle.source} loaded; settings {self.planner.settings}")
        return TransitionCallbackReturn.SUCCESS

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
            self.get_logger().warning(f"a publisher on {topic} has an incompatible {policy} QoS policy: its messages "
                                      f"never arrive (this subscription: {_qos_text(self._subscription_qos(topic))})")

    def _subscription_qos(self, topic: str):
        for s in self.subscriptions:
            if s.topic_name == topic:
                return s.qos_profile
        return None

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.slot.reopen()
        self._active = True
        self._worker = threading.Thread(target=self._run, name="wamdiff-inference", daemon=True)
        self._worker.start()
        if self._watchdog_timer is None:
            self._watchdog_timer = self.create_timer(self._param("watchdog_period_ms") / 1e3, self._watchdog)
        self._status = (DiagnosticStatus.OK, "active")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        self._status = (DiagnosticStatus.WARN, "inactive")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        for sub in list(self.subscriptions):
            self.destroy_subscription(sub)
        for pub in (self._path_pub, self._plan_pub, self._text_pub, self._answer_pub, self._boxes_pub,
                    self._description_pub, self._marker_pub, self._debug_pub):
            self.destroy_lifecycle_publisher(pub)
        self.planner = None
        with self._lock:
            self._route, self._route_state = None, "none"
        self._status = (DiagnosticStatus.WARN, "unconfigured")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_worker()
        return TransitionCallbackReturn.SUCCESS

    def _stop_worker(self) -> None:
        self._active = False
        self.slot.close()
        if self._worker is not None:
            self._worker.join(timeout=30.0)
            self._worker = None

    # -- black box ----------------------------------------------------------------------------------------------
    def _setup_blackbox(self, command_qos: QoSProfile) -> None:
        """Raw copies of the inputs feed a rolling buffer that a fallback dumps to MCAP (size-capped)."""
        folder = self._param("blackbox_dir")
        self.blackbox = None
        if folder == "none":
            return
        from wamdiff_ros.ros.blackbox import BlackBox

        home = os.environ.get("ROS_HOME", os.path.join(os.path.expanduser("~"), ".ros"))
        self._blackbox_dir = folder or os.path.join(home, "wamdiff_blackbox")
        self.blackbox = BlackBox(self._param("blackbox_seconds"), int(self._param("blackbox_max_mb") * 2**20))
        self._last_dump = -np.inf
        image = ("~/input/image/compressed", "sensor_msgs/msg/CompressedImage", CompressedImage) \
            if self._param("compressed") else ("~/input/image", "sensor_msgs/msg/Image", Image)
        for topic, msgtype, cls, qos in (
            (*image, self._image_qos()),
            ("~/input/odometry", "nav_msgs/msg/Odometry", Odometry, 20),
            ("~/input/command", "wamdiff_ros/msg/DrivingCommand", DrivingCommand, command_qos),
            ("~/input/route", "nav_msgs/msg/Path", Path, command_qos),
        ):
            name = self.resolve_topic_name(topic)
            self.create_subscription(cls, topic, lambda raw, n=name, t=msgtype: self.blackbox.add(
                n, t, self.get_clock().now().nanoseconds, raw), qos, raw=True)

    def _dump_blackbox(self, reason: str) -> None:
        if self.blackbox is None or time.monotonic() - self._last_dump < self._param("blackbox_min_interval_s"):
            return
        self._last_dump = time.monotonic()

        def write() -> None:
            try:
                os.makedirs(self._blackbox_dir, exist_ok=True)
                path = self.blackbox.dump(self._blackbox_dir)
                self.counters.blackbox_files += 1
                self.get_logger().warning(f"black box written to {path} ({reason})")
            except Exception as exc:  # a full disk must not stop planning
                self.counters.last_error = f"black box: {exc!r}"
                self.get_logger().error(f"black box not written: {exc!r}", throttle_duration_sec=10.0)

        threading.Thread(target=write, name="wamdiff-blackbox", daemon=True).start()

    # -- parameters -------------------------------------------------------------------------------------------
    def _param(self, name: str):
        return self.get_parameter(name).value

    def _image_qos(self) -> QoSProfile:
        reliability = self._param("image_reliability")
        if reliability not in ("best_effort", "reliable"):
            raise ValueError(f"image_reliability {reliability!r} is not best_effort or reliable")
        return QoSProfile(
            depth=self._param("image_depth"),
            reliability=ReliabilityPolicy.BEST_EFFORT if reliability == "best_effort" else ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.VOLATILE,
        )

    def _resize(self, rgb: np.ndarray) -> np.ndarray:
        width, height = self._param("image_width"), self._param("image_height")
        if not width or not height or rgb.shape[:2] == (height, width):
            return rgb
        from PIL import Image as PILImage

        return np.asarray(PILImage.fromarray(rgb).resize((width, height), PILImage.BILINEAR))

    def _on_parameters(self, params) -> SetParametersResult:
        for p in params:
            if p.name == "default_command":
                try:
                    _check_default_command(p.value)
                except ValueError as exc:
                    return SetParametersResult(successful=False, reason=str(exc))
        rates = {p.name: p.value for p in params if p.name in ("detect_hz", "describe_hz")}
        if rates:
            self.scheduler.set_rates(rates.get("detect_hz", self._param("detect_hz")),
                                     rates.get("describe_hz", self._param("describe_hz")))
        changed = {p.name: p.value for p in params if p.name in DECODE_PARAMS}
        if not changed or self.planner is None:
            return SetParametersResult(successful=True)
        current = dataclasses.asdict(self.planner.settings)
        try:
            settings = DecodeSettings(**{**current, **changed})
            planner = Planner(self.planner.bundle, settings)
        except (WamDiffError, ValueError, TypeError, AttentionUnavailable) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.planner = planner  # the worker picks it up on its next cycle
        self.get_logger().info(f"decode settings now {settings}")
        return SetParametersResult(successful=True)

    # -- inputs (executor threads; never raise) ----------------------------------------------------------------
    def _bad_input(self, what: str, exc: Exception) -> None:
        self.counters.bad_input += 1
        self.counters.last_error = f"{what}: {exc}"
        self.get_logger().warning(f"dropped {what}: {exc}", throttle_duration_sec=2.0)

    def _accept_image(self, header, convert) -> None:
        if not self._active:
            return
        t0 = time.perf_counter()
        try:
            rgb = self._resize(convert())
        except WamDiffError as exc:
            self._bad_input("image", exc)
            return
        self.counters.frames += 1
        frame = Frame(_seconds(header.stamp), header, rgb, time.perf_counter() - t0, time.monotonic())
        self.scheduler.frame_arrived(frame.arrival)
        self._latest_frame = frame
        self._watch.add(frame.stamp, header)
        self.slot.put(frame)

    def _on_image(self, msg: Image) -> None:
        self._accept_image(msg.header, lambda: conv.image_to_rgb(msg))

    def _on_compressed(self, msg: CompressedImage) -> None:
        self._accept_image(msg.header, lambda: conv.compressed_to_rgb(msg))

    def _on_camera_info(self, msg: CameraInfo) -> None:
        if self._fov_warned or msg.width == 0 or msg.k[0] <= 0:
            return
        fov = float(np.degrees(2 * np.arctan(msg.width / (2 * msg.k[0]))))
        if abs(fov - self._param("model_fov_deg")) > 5.0:
            self._fov_warned = True
            self.get_logger().warning(
                f"camera FOV {fov:.1f} deg differs from the model card's {self._param('model_fov_deg'):.1f} deg")

    def _on_odometry(self, msg: Odometry) -> None:
        try:
            stamp = _seconds(msg.header.stamp)
            pose = conv.pose2d(msg)
            ego = self.estimator.update(stamp, conv.odometry_to_velocity(msg), pose[2])
        except WamDiffError as exc:
            self._bad_input("odometry", exc)
            return
        self._odom_frame_id = msg.header.frame_id
        self._odometry.add(stamp, (pose, ego))

    def _on_route(self, msg: Path) -> None:
        """Keeps the latest route; a malformed one is dropped (reported) and clears the route, an empty one clears it
        quietly: a model that wants route points then plans without them."""
        try:
            points = np.array([(p.pose.position.x, p.pose.position.y) for p in msg.poses], np.float64).reshape(-1, 2)
            if len(points):
                route_points_ahead(points, points[0], 0.0)  # the same checks as every cycle's: >= 2 finite points
        except Exception as exc:  # whatever the message holds, the node goes on
            with self._lock:
                self._route, self._route_state = None, f"error: {exc}"
            self._bad_input("route", exc)
            return
        with self._lock:
            if not len(points):
                self._route, self._route_state = None, "none"
            else:
                self._route = RouteInput(_seconds(msg.header.stamp) or self._now(), msg.header.frame_id, points)

    def _on_command(self, msg: DrivingCommand) -> None:
        command = COMMANDS.get(msg.command)
        if command is None:
            self._bad_input("command", ValueError(f"unknown command value {msg.command}"))
            return
        with self._lock:
            self._command = (_seconds(msg.header.stamp) or self._now(), command)

    def _on_question(self, msg: String) -> None:
        if self._active:
            self._question = msg.data  # answered by the inference thread between frames (the model is not shared)

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # -- inference (the worker thread) ---------------------------------------------------------------------------
    def _run(self) -> None:
        """The scheduler's loop: the waiting frame's plan first, then the side task ``Scheduler.choose`` allows."""
        side_end = None  # when the last side task ended, if one ran since the last plan
        while self._active:
            frame = self.slot.take(timeout=0.02 if side_end is None and self._side_tasks_on() else 0.2)
            if frame is not None:
                self._guarded("cycle", self._cycle, frame, side_end)
                side_end = None
            waiting = self.slot.peek()
            task = self.scheduler.choose(self._param("deadline_ms") / 1e3, self._question is not None,
                                         waiting.arrival if waiting is not None else None)
            if task is not None:
                start = time.monotonic()
                if self._guarded(task, self._side_task, task):  # False: no frame yet, None: it failed
                    side_end = time.monotonic()
                    self.scheduler.record(task, start, side_end)

    def _side_tasks_on(self) -> bool:
        return self._question is not None or self._param("detect_hz") > 0 or self._param("describe_hz") > 0

    def _guarded(self, what: str, fn, *args):
        """``fn(*args)``'s result; an exception is counted and logged (None), it never ends the worker."""
        try:
            return fn(*args)
        except Exception as exc:  # keep the node alive whatever happens in one task
            self.counters.errors += 1
            self.counters.last_error = f"{what}: {exc!r}"
            self.get_logger().error(f"{what} failed: {exc!r}", throttle_duration_sec=2.0)
            return None

    def _cycle(self, frame: Frame, side_end: float | None = None) -> None:
        limits = InputLimits(self._param("sync_tolerance_ms") / 1e3, self._param("command_timeout_s"))
        if frame.stamp < self._last_image_stamp:  # a looping bag or a restarted simulator: start over
            self.counters.resets += 1
            self.estimator.reset()
            self._odometry.drop_after(frame.stamp + limits.sync_tolerance_s)  # from before the jump, if any are left
            with self._lock:
                self._last_path_odom = None
            self.get_logger().warning("image time went backwards: inputs reset", throttle_duration_sec=2.0)
        self._last_image_stamp = frame.stamp
        odom = self._odometry.at(frame.stamp, self._param("odometry_wait_ms") / 1e3)  # the frame's own instant
        with self._lock:
            command = self._command
        now = self._now()
        self._default_in_use = default_command_due(command, now, limits.command_timeout_s,
                                                   self._param("default_command"))
        if self._default_in_use:
            command = (now, fmt.Command(self._param("default_command")))
        reason = check_inputs(frame.stamp, now, odom[0] if odom else None, command[0] if command else None, limits)
        if reason is not None:
            self.counters.skip(reason)
            self._watch.drop(frame.stamp)
            self.get_logger().warning(f"cycle skipped: {reason}", throttle_duration_sec=2.0)
            return
        _, (pose, ego) = odom
        planner = self.planner
        route = self._route_points(pose)
        t0, start = time.perf_counter(), time.monotonic()
        deadline_ms = self._param("deadline_ms")
        decode_deadline = None  # perf_counter time at which decoding answers its best so far
        rate = 1.0 if not self.get_parameter("use_sim_time").value else self._clock_rate.rate()
        if self._param("anytime") and rate is not None and rate > 1e-3:  # sim time standing still: no cut
            left_s = (frame.stamp + deadline_ms / 1e3 - self._now()) / rate
            decode_deadline = t0 + left_s - self._param("anytime_margin_ms") / 1e3
        try:
            plan = planner.plan(frame.rgb, ego, command[1], route=route, deadline=decode_deadline)
            self._plan_route = plan.stats.route
            failure = None if plan.valid else f"invalid {'anytime ' if plan.anytime else ''}plan: {plan.reason}"
        except Exception as exc:
            plan, failure = None, f"model error: {exc!r}"
            self.counters.errors += 1
            self.counters.last_error = failure
        elapsed = time.perf_counter() - t0
        age_ms = (self._now() - frame.stamp) * 1e3
        if plan is not None and age_ms > deadline_ms:
            self.counters.late += 1
            failure = f"late: {age_ms:.0f} ms after the image (deadline {deadline_ms:.0f} ms)"
        self.latency.add(elapsed)
        self.scheduler.record(PLAN, start, time.monotonic())
        self.scheduler.plan_done(frame.arrival, side_end, late=age_ms > deadline_ms)
        self.counters.planned += 1
        t_publish = time.perf_counter()
        with self._publishing:
            if not self._watch.claim(frame.stamp):  # the watchdog answered this frame already
                self.counters.discarded += 1
                return
            if failure is not None:
                plan = self._fallback(plan, ego, pose, failure)
            elif plan.anytime:
                self.counters.anytime += 1
            self._publish(frame.header, plan, pose, fallback=failure is not None)
        self._planned = (frame, plan)
        self._publish_debug_image(frame, plan)
        self.ros_overhead.add(frame.convert_s + time.perf_counter() - t_publish)
        self.frame_to_plan.add(self._now() - frame.stamp)

    def _route_points(self, pose) -> np.ndarray | None:
        """The route points (``fmt.ROUTE_AHEAD_M`` ahead along ``~/input/route``, ego frame) for the ego at ``pose``
        (x, y, yaw in the odometry frame); None, reported, when there is no usable route."""
        with self._lock:
            route = self._route
        if route is None:
            return None
        odom_frame = self._odom_frame_id
        if route.frame_id and odom_frame and route.frame_id != odom_frame:
            message = f"frame {route.frame_id!r} is not the odometry's {odom_frame!r}; planning without route points"
            with self._lock:
                self._route_state = f"refused: {message}"
            if not route.refused:
                route.refused = True
                self._bad_input("route", ValueError(message))
            else:
                self.get_logger().warning(f"route refused: {message}", throttle_duration_sec=10.0)
            return None
        try:
            points = route_points_ahead(route.points, pose[:2], pose[2])
        except Exception as exc:
            with self._lock:
                self._route_state = f"error: {exc}"
            self._bad_input("route", exc)
            return None
        with self._lock:
            self._route_state = "used"
        return points

    def _watchdog(self) -> None:
        """On the executor, independent of the inference thread: a frame ``deadline_ms`` old without its plan gets the
        flagged fallback now, whether inference is slow, hung or failing; its plan, if it still comes, is discarded."""
        if not self._active:
            return
        self._clock_rate.add(time.monotonic(), self._now())
        deadline_ms = self._param("deadline_ms")
        expired = self._watch.expired(self._now(), deadline_ms / 1e3)
        if expired is None:
            return
        stamp, header = expired
        odom = self._odometry.newest()
        self.counters.watchdog += 1
        if odom is None:  # nothing to stop along: the frame is answered by the count alone
            return
        _, (pose, ego) = odom
        age_ms = (self._now() - stamp) * 1e3
        plan = self._fallback(None, ego, pose, f"watchdog: no plan {age_ms:.0f} ms after the image "
                                               f"(deadline {deadline_ms:.0f} ms)")
        with self._publishing:
            self._publish(header, plan, pose, fallback=True)

    def _fallback(self, plan: Plan | None, ego: EgoState, pose, reason: str) -> Plan:
        self.counters.fallback += 1
        self.get_logger().warning(f"fallback stop: {reason}", throttle_duration_sec=2.0)
        self._dump_blackbox(reason)
        with self._lock:
            last = self._last_path_odom
        waypoints = fallback_stop(float(np.hypot(*ego.velocity)), last, pose, self._param("fallback_decel"))
        stats = plan.stats if plan is not None else PlanStats()
        return Plan(waypoints, np.zeros(fmt.NUM_WAYPOINTS, np.float32), [], plan.text if plan else "", False,
                    reason, stats)

    def _publish(self, header, plan: Plan, pose, fallback: bool) -> None:
        """The plan's outputs, stamped with its image's ``header``."""
        stamp = header.stamp
        odom_frame = self._odom_frame_id or DEFAULT_ODOM_FRAME  # the odometry's own frame (map, odom, ...)
        waypoints_odom = conv.waypoints_to_odom(plan.waypoints, pose)
        if plan.valid:
            with self._lock:
                self._last_path_odom = waypoints_odom
        self._plan_pub.publish(planner_output_msg(plan, header, pose, waypoints_odom, odom_frame, fallback))
        self._path_pub.publish(conv.path_msg(waypoints_odom, stamp, odom_frame, origin=pose))
        self._text_pub.publish(String(data=plan.text))
        self._marker_pub.publish(conv.markers_msg(waypoints_odom, plan.waypoint_confidence, plan.text, stamp,
                                                  odom_frame, NODE_NAME))

    def _side_task(self, task: str) -> bool:
        """Detection, the description or the pending question, on the last planned frame (the newest image before
        the first plan), stamped with that frame's header; False when there is no frame to look at yet, or (detection,
        description) none it has not looked at: a stream that stops is not described again and again."""
        planner, planned = self.planner, self._planned
        frame = planned[0] if planned is not None else self._latest_frame
        if task == ANSWER:
            question, self._question = self._question, None
            if frame is None:
                self.get_logger().warning("question ignored: no image yet", throttle_duration_sec=2.0)
                return False
            try:
                self._answer_pub.publish(String(data=planner.ask(frame.rgb, question).text))
            except WamDiffError as exc:
                self._bad_input("question", exc)
            return True
        if frame is None or self._side_seen.get(task) == frame.stamp:
            return False
        self._side_seen[task] = frame.stamp
        height, width = frame.rgb.shape[:2]
        if task == DETECT:
            boxes = planner.detect(frame.rgb).boxes
            self._boxes = boxes
            self._boxes_pub.publish(detections_msg(boxes, frame.header, width, height))
        elif task == DESCRIBE:
            questions = list(self._param("describe_questions"))
            text = " ".join(t for t in (planner.ask(frame.rgb, q).text.strip() for q in questions) if t)
            self._description = text
            self._description_pub.publish(description_msg(text, questions, frame.header))
        return True

    def _publish_debug_image(self, frame: Frame, plan: Plan) -> None:
        """The frame with its plan (waypoints coloured by confidence), the latest boxes and description drawn, at
        most ``debug_image_hz`` a second and only while someone subscribes."""
        hz = self._param("debug_image_hz")
        now = time.monotonic()
        if hz <= 0 or now - self._last_debug < 1.0 / hz or self._debug_pub.get_subscription_count() == 0:
            return
        self._last_debug = now
        from wamdiff_ros.draw import CameraModel, draw_plan

        label = "fallback stop" if not plan.valid else "anytime plan" if plan.anytime else ""
        text = " | ".join(t for t in (label, self._description) if t)
        image = draw_plan(frame.rgb, plan.waypoints, self._boxes, plan.waypoint_confidence, text,
                          CameraModel(fov_deg=self._param("model_fov_deg")))
        self._debug_pub.publish(conv.rgb_to_image(np.asarray(image), frame.header.stamp, frame.header.frame_id))

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
        values["dropped"] = self.slot.replaced  # frames replaced before inference took them
        values.update(self.scheduler.values())
        for name, window in (("inference", self.latency), ("frame_to_plan", self.frame_to_plan),
                             ("ros_overhead", self.ros_overhead)):
            values[f"{name}_p50_ms"] = round(1e3 * window.percentile(50), 3)
            values[f"{name}_p99_ms"] = round(1e3 * window.percentile(99), 3)
        values["model"] = self.planner.bundle.source if self.planner else ""
        values["decode_path"] = self.planner.backend if self.planner else ""
        odom = self._odometry.newest()
        with self._lock:
            command = self._command
        now = self._now()
        values["odometry_age_s"] = round(now - odom[0], 3) if odom else "none"
        values["command_age_s"] = round(now - command[0], 3) if command else "none"
        with self._lock:
            route, values["route"] = self._route, self._route_state
        values["route_age_s"] = round(now - route.stamp, 3) if route else "none"
        values["route_in_prompt"] = self._plan_route or "none"  # the last plan's: used | missing | unused
        values["command_source"] = (f"default_command ({self._param('default_command')})" if self._default_in_use
                                    else "~/input/command")
        with self._lock:
            problems = dict(self._qos_problems)
        values["qos_incompatible"] = "; ".join(f"{t}: {p}" for t, p in sorted(problems.items())) or "none"
        status = DiagnosticStatus(level=level, name=f"{NODE_NAME}: planner", message=message,
                                  hardware_id=NODE_NAME,
                                  values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    autostart = "--autostart" in argv
    argv = [a for a in argv if a != "--autostart"]
    rclpy.init(args=argv)
    node = PlannerNode()
    if autostart:
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            node.get_logger().error("configure failed; staying unconfigured")
        else:
            node.trigger_activate()
    executor = SingleThreadedExecutor()  # callbacks are short; inference has its own thread
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node._stop_worker()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
