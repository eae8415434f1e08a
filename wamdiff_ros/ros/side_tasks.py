"""The planner node's work besides plans: detection, the scene description and questions in the time plans leave
(the rule: ``schedule.py``), and the debug image that draws the last plan with their latest results. rclpy-free:
the node hands in its publishers as ``SideOutputs``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.planner import Plan, Planner
from wamdiff_ros.ros.cycle import Frame
from wamdiff_ros.ros.schedule import ANSWER, DESCRIBE, DETECT, Scheduler


@dataclass(frozen=True, slots=True)
class SideOutputs:
    answer: Callable[[str], None]
    boxes: Callable[[list[fmt.Box], Frame], None]
    description: Callable[[str, list[str], Frame], None]
    bad_question: Callable[[WamDiffError], None]
    warn: Callable[[str], None]


class SideTasks:
    """The side tasks' state: the frames they look at, the pending question and their latest results. The node sets
    ``latest`` on every image and ``planned`` after every plan; the inference thread runs the tasks."""

    def __init__(self, detect_hz: float, describe_hz: float, outputs: SideOutputs) -> None:
        self.scheduler = Scheduler(detect_hz, describe_hz)
        self.outputs = outputs
        self.latest: Frame | None = None  # the newest image taken in
        self.planned: tuple[Frame, Plan] | None = None  # the last frame planned, with its plan
        self.question: str | None = None
        self.boxes: list[fmt.Box] = []  # the latest detection's
        self.description = ""
        self._seen: dict[str, float] = {}  # task -> the stamp of the frame it last looked at
        self._last_debug = -np.inf

    @property
    def on(self) -> bool:
        return self.question is not None or any(p > 0 for p in self.scheduler.periods.values())

    def run(self, task: str, planner: Planner, questions: Sequence[str]) -> bool:
        """Detection, the description (the answers to ``questions``) or the pending question, on the last planned
        frame (the newest image before the first plan), published with that frame's header; False when there is no
        frame to look at yet, or (detection, description) none it has not looked at: a stream that stops is not
        described again and again."""
        frame = self.planned[0] if self.planned is not None else self.latest
        if task == ANSWER:
            question, self.question = self.question, None
            if frame is None:
                self.outputs.warn("question ignored: no image yet")
                return False
            try:
                self.outputs.answer(planner.ask(frame.rgb, question).text)
            except WamDiffError as exc:
                self.outputs.bad_question(exc)
            return True
        if frame is None or self._seen.get(task) == frame.stamp:
            return False
        self._seen[task] = frame.stamp
        if task == DETECT:
            self.boxes = planner.detect(frame.rgb).boxes
            self.outputs.boxes(self.boxes, frame)
        elif task == DESCRIBE:
            self.description = " ".join(t for t in (planner.ask(frame.rgb, q).text.strip() for q in questions) if t)
            self.outputs.description(self.description, list(questions), frame)
        return True

    def debug_due(self, hz: float, now: float) -> bool:
        """Whether a debug image is due at ``now`` (time.monotonic()): at most ``hz`` a second, none at 0."""
        return hz > 0 and now - self._last_debug >= 1.0 / hz

    def debug_image(self, frame: Frame, plan: Plan, now: float, fov_deg: float) -> np.ndarray:
        """The frame with its plan (waypoints coloured by confidence), the latest boxes and description drawn."""
        self._last_debug = now
        from wamdiff_ros.draw import CameraModel, draw_plan

        label = "fallback stop" if not plan.valid else "anytime plan" if plan.anytime else ""
        if plan.valid and plan.edited:
            label = " ".join(t for t in (label, f"repaired {len(plan.edited_waypoints)} (ringed)") if t)
        if plan.valid and plan.implausible:
            label = " ".join(t for t in (label, "implausible") if t)
        text = " | ".join(t for t in (label, self.description) if t)
        return np.asarray(draw_plan(frame.rgb, plan.waypoints, self.boxes, plan.waypoint_confidence, text,
                                    CameraModel(fov_deg=fov_deg), marked=plan.edited_waypoints if plan.valid else ()))
