"""The planner node's inference thread and its watchdog: every frame taken in is answered once, by its plan or, past
``deadline_ms``, by the flagged fallback stop (the watchdog runs on the executor, so it answers even while the model
hangs); detection, the description and questions run in the time plans leave (``side_tasks.py``).

The worker talks to its node through the node's public parts: ``config``, ``planner``, ``inputs``, ``side``,
``outputs``, ``estimator``, ``blackbox``, ``counters``, ``now()``, ``bad_input()``, ``sim_time`` and its logger.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.control.hold import ValidPlan, held_waypoints
from wamdiff_ros.control.stop import fallback_stop
from wamdiff_ros.input_guard import RepeatedFrameGate
from wamdiff_ros.planner import EgoState, Plan, PlanStats
from wamdiff_ros.ros import conversions as conv
from wamdiff_ros.ros.cycle import ClockRate, DeadlineWatch, Frame, InputLimits, LatestSlot, decode_deadline
from wamdiff_ros.ros.schedule import PLAN
from wamdiff_ros.stats import LatencyWindow


class Worker:
    def __init__(self, node) -> None:
        self.node = node
        self.slot: LatestSlot[Frame] = LatestSlot()
        self.watch: DeadlineWatch[object] = DeadlineWatch()  # the headers of frames taken in, not yet answered
        self.latency = LatencyWindow()  # inference (plan()) time
        self.frame_to_plan = LatencyWindow()  # image stamp -> outputs published, on the node's clock
        self.ros_overhead = LatencyWindow()  # message -> array conversion plus publishing the outputs
        self.clock_rate = ClockRate()  # node clock vs wall clock, sampled by the watchdog timer
        self.plan_route = ""  # the last plan's stats.route
        self.active = False
        self._publishing = threading.Lock()  # the worker and the watchdog publish; one answer at a time
        self._lock = threading.Lock()  # guards the last valid plan
        self._last_valid: ValidPlan | None = None
        self.gate = RepeatedFrameGate(node.config.repeated_frame_min_speed)
        self._thread: threading.Thread | None = None

    def take(self, frame: Frame) -> None:
        """A new frame: the latest one waits for inference (a newer one replaces it), the watchdog watches it."""
        self.watch.add(frame.stamp, frame.header)
        self.slot.put(frame)

    def start(self) -> None:
        self.slot.reopen()
        self.active = True
        self._thread = threading.Thread(target=self._run, name="wamdiff-inference", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.active = False
        self.slot.close()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
            self._thread = None

    def _run(self) -> None:
        """The scheduler's loop: the waiting frame's plan first, then the side task ``Scheduler.choose`` allows."""
        side, side_end = self.node.side, None  # when the last side task ended, if one ran since the last plan
        while self.active:
            frame = self.slot.take(timeout=0.02 if side_end is None and side.on else 0.2)
            if frame is not None:
                self._guarded("cycle", self.cycle, frame, side_end)
                side_end = None
            waiting = self.slot.peek()
            task = side.scheduler.choose(self.node.config.deadline_ms / 1e3, side.question is not None,
                                         waiting.arrival if waiting is not None else None)
            if task is not None:
                start = time.monotonic()
                if self._guarded(task, side.run, task, self.node.planner, self.node.config.describe_questions):
                    side_end = time.monotonic()  # False: no frame yet, None: it failed
                    side.scheduler.record(task, start, side_end)

    def _guarded(self, what: str, fn, *args):
        """``fn(*args)``'s result; an exception is counted and logged (None), it never ends the worker."""
        try:
            return fn(*args)
        except Exception as exc:  # keep the node alive whatever happens in one task
            self.node.counters.errors += 1
            self.node.counters.last_error = f"{what}: {exc!r}"
            self.node.get_logger().error(f"{what} failed: {exc!r}", throttle_duration_sec=2.0)
            return None

    def cycle(self, frame: Frame, side_end: float | None = None) -> None:
        """One frame: its inputs paired, its plan, and its outputs (or the fallback) unless the watchdog answered."""
        node, cfg, counters, log = self.node, self.node.config, self.node.counters, self.node.get_logger()
        limits = InputLimits(cfg.sync_tolerance_ms / 1e3, cfg.command_timeout_s)
        if node.inputs.went_back(frame.stamp, limits.sync_tolerance_s):  # a looping bag, a restarted simulator
            counters.resets += 1
            node.estimator.reset()
            node.ego_filter.reset()
            self.gate.reset()
            with self._lock:
                self._last_valid = None
            log.warning("image time went backwards: inputs reset", throttle_duration_sec=2.0)
        paired = node.inputs.pair(frame.stamp, node.now(), limits, cfg.odometry_wait_ms / 1e3, cfg.default_command)
        if isinstance(paired, str):
            counters.skip(paired)
            self.watch.drop(frame.stamp)
            log.warning(f"cycle skipped: {paired}", throttle_duration_sec=2.0)
            return
        self.gate.min_speed_mps = cfg.repeated_frame_min_speed
        if cfg.repeated_frame_check and self.gate.repeated(frame.rgb, float(np.hypot(*paired.ego.velocity))):
            counters.repeated_frames += 1
            self._hold(frame, paired)
            return
        route = node.inputs.route_points(paired.pose)
        if route.problem is not None and route.report:
            node.bad_input("route", route.problem)
        elif route.problem is not None:
            log.warning(f"route refused: {route.problem}", throttle_duration_sec=10.0)
        t0, start = time.perf_counter(), time.monotonic()
        rate = self.clock_rate.rate() if node.sim_time else 1.0
        cut = decode_deadline(frame.stamp, node.now(), t0, cfg.deadline_ms / 1e3, cfg.anytime_margin_ms / 1e3,
                              rate) if cfg.anytime else None
        try:
            plan = node.planner.plan(frame.rgb, paired.ego, paired.command, route=route.points, deadline=cut)
            self.plan_route = plan.stats.route
            failure = None if plan.valid else f"invalid {'anytime ' if plan.anytime else ''}plan: {plan.reason}"
        except Exception as exc:
            plan, failure = None, f"model error: {exc!r}"
            counters.errors += 1
            counters.last_error = failure
        elapsed = time.perf_counter() - t0
        age_ms = (node.now() - frame.stamp) * 1e3
        if plan is not None and age_ms > cfg.deadline_ms:
            counters.late += 1
            failure = f"late: {age_ms:.0f} ms after the image (deadline {cfg.deadline_ms:.0f} ms)"
        self.latency.add(elapsed)
        node.side.scheduler.record(PLAN, start, time.monotonic())
        node.side.scheduler.plan_done(frame.arrival, side_end, late=age_ms > cfg.deadline_ms)
        counters.planned += 1
        t_publish = time.perf_counter()
        with self._publishing:
            if not self.watch.claim(frame.stamp):  # the watchdog answered this frame already
                counters.discarded += 1
                return
            if plan is not None and plan.implausible:
                counters.implausible += 1
            if failure is not None:
                plan = self._fallback(plan, paired.ego, paired.pose, failure)
            else:
                counters.anytime += plan.anytime
                counters.repaired += plan.edited
            self._publish(frame.header, plan, paired.pose, fallback=failure is not None)
        node.side.planned = (frame, plan)
        now = time.monotonic()
        if node.side.debug_due(cfg.debug_image_hz, now) and node.outputs.debug_wanted:  # only while subscribed
            node.outputs.debug_image(node.side.debug_image(frame, plan, now, cfg.model_fov_deg), frame.header)
        self.ros_overhead.add(frame.convert_s + time.perf_counter() - t_publish)
        self.frame_to_plan.add(node.now() - frame.stamp)

    def watchdog(self) -> None:
        """On the executor, independent of the inference thread: a frame ``deadline_ms`` old without its plan gets the
        flagged fallback now, whether inference is slow, hung or failing; its plan, if it still comes, is discarded."""
        if not self.active:
            return
        node = self.node
        self.clock_rate.add(time.monotonic(), node.now())
        deadline_ms = node.config.deadline_ms
        expired = self.watch.expired(node.now(), deadline_ms / 1e3)
        if expired is None:
            return
        stamp, header = expired
        odom = node.inputs.odometry.newest()
        node.counters.watchdog += 1
        if odom is None:  # nothing to stop along: the frame is answered by the count alone
            return
        _, (pose, ego) = odom
        age_ms = (node.now() - stamp) * 1e3
        plan = self._fallback(None, ego, pose, f"watchdog: no plan {age_ms:.0f} ms after the image "
                                               f"(deadline {deadline_ms:.0f} ms)")
        with self._publishing:
            self._publish(header, plan, pose, fallback=True)

    def _hold(self, frame: Frame, paired) -> None:
        """A repeated frame's answer: the last valid plan re-timed to its stamp while that plan is at most
        ``max_plan_age_s`` old, else the flagged fallback stop."""
        node, cfg = self.node, self.node.config
        with self._lock:
            last = self._last_valid
        age = frame.stamp - last.stamp if last is not None else None
        with self._publishing:
            if not self.watch.claim(frame.stamp):
                node.counters.discarded += 1
                return
            if last is not None and 0.0 <= age <= cfg.max_plan_age_s:
                node.counters.held += 1
                plan = Plan(held_waypoints(last, frame.stamp, paired.pose), np.zeros(fmt.NUM_WAYPOINTS, np.float32),
                            [], "", True, f"held: repeated camera frame; the plan of {age:.2f} s before",
                            PlanStats(), held=True)
                self._publish(frame.header, plan, paired.pose, fallback=False, remember=False)
                return
            why = "no valid plan yet" if last is None else f"the last valid plan is {age:.2f} s old " \
                f"(max_plan_age_s {cfg.max_plan_age_s:g})"
            plan = self._fallback(None, paired.ego, paired.pose, f"repeated camera frame: {why}")
            self._publish(frame.header, plan, paired.pose, fallback=True)

    def _fallback(self, plan: Plan | None, ego: EgoState, pose, reason: str) -> Plan:
        node = self.node
        node.counters.fallback += 1
        node.get_logger().warning(f"fallback stop: {reason}", throttle_duration_sec=2.0)
        if node.blackbox is not None:
            node.blackbox.dump(reason, node.config.blackbox_min_interval_s)
        with self._lock:
            last = self._last_valid.waypoints_odom if self._last_valid is not None else None
        waypoints = fallback_stop(float(np.hypot(*ego.velocity)), last, pose, node.config.fallback_decel)
        stats = plan.stats if plan is not None else PlanStats()
        return Plan(waypoints, np.zeros(fmt.NUM_WAYPOINTS, np.float32), [], plan.text if plan else "", False,
                    reason, stats)

    def _publish(self, header, plan: Plan, pose, fallback: bool, remember: bool = True) -> None:
        """The plan's outputs, stamped with its image's ``header``, in the odometry's own frame (map, odom, ...); a
        valid plan is remembered (to hold, and for the fallback to stop along) unless ``remember`` is off."""
        waypoints_odom = conv.waypoints_to_odom(plan.waypoints, pose)
        if plan.valid and remember:
            with self._lock:
                self._last_valid = ValidPlan(conv.stamp_to_sec(header.stamp), tuple(pose), waypoints_odom)
        self.node.outputs.plan(header, plan, pose, waypoints_odom, self.node.odom_frame, fallback)

    def values(self) -> dict[str, object]:
        """Latencies, dropped frames and the last plan's route use, for the diagnostics."""
        values: dict[str, object] = {"dropped": self.slot.replaced}  # frames replaced before inference took them
        for name, window in (("inference", self.latency), ("frame_to_plan", self.frame_to_plan),
                             ("ros_overhead", self.ros_overhead)):
            values[f"{name}_p50_ms"] = round(1e3 * window.percentile(50), 3)
            values[f"{name}_p99_ms"] = round(1e3 * window.percentile(99), 3)
        values["route_in_prompt"] = self.plan_route or "none"  # the last plan's: used | missing | unused
        return values
