"""The inference thread's scheduler, free of rclpy: a plan for every frame first; detection, the scene description
and questions in the time plans leave free.

The rule. The next frame to plan is the one waiting, if any (``t_next`` = its arrival); else frames arrive about
every ``P`` s (the median of recent arrival intervals) and the next is expected at ``t_next = max(now, last arrival
+ P)``. Its plan must be out ``deadline`` s after it and takes about ``L`` (the plan latency's p99). A side task
expected to take ``d`` (its own latency's p99; before its first run, ``L``) may start at ``now`` only if that plan
still ends in time: ``now + d + L <= t_next + deadline``. So a side task may delay a plan (a newer frame may then
replace the waiting one: frames are never queued) but never, by these estimates, past its deadline; a task refused
is counted as skipped (once per due instance) and tried again after the next plan.

Due: detection every ``1 / detect_hz`` s, the description every ``1 / describe_hz`` s (0 Hz: never), a question as
soon as one is pending; among those due, questions first, then the task waiting longest past its due time. A task
that starts late keeps its schedule (the next is due one period after the one it was due at), so its rate is the
asked one as long as there is time for it; one more than a period behind starts a new schedule.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from wamdiff_ros.stats import LatencyWindow

PLAN, DETECT, DESCRIBE, ANSWER = "plan", "detect", "describe", "answer"
SIDE_TASKS = (ANSWER, DETECT, DESCRIBE)
RATE_WINDOW_S = 10.0  # rates are counted over this many seconds


@dataclass(slots=True)
class TaskStats:
    latency: LatencyWindow = field(default_factory=LatencyWindow)
    ends: deque = field(default_factory=lambda: deque(maxlen=1000))  # completion times, for the rate
    runs: int = 0
    skips: int = 0  # due, but refused by the rule
    next_due: float = -np.inf
    skip_counted: bool = False  # the current due instance was counted as skipped already

    def rate(self, now: float) -> float:
        recent = [t for t in self.ends if now - t <= RATE_WINDOW_S]
        if len(recent) < 2:
            return 0.0
        return (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9)


class Scheduler:
    """Thread-safe enough for one inference thread writing and a diagnostics timer reading (numbers only).
    ``clock``: monotonic seconds (injectable for tests)."""

    def __init__(self, detect_hz: float = 0.0, describe_hz: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.periods = {DETECT: 0.0, DESCRIBE: 0.0}
        self.set_rates(detect_hz, describe_hz)
        self.tasks = {name: TaskStats() for name in (PLAN, *SIDE_TASKS)}
        self._arrivals: deque[float] = deque(maxlen=20)
        self.delayed_plans = 0  # plans whose frame waited for a side task to end
        self.delayed_late = 0  # ... and were late all the same

    def set_rates(self, detect_hz: float, describe_hz: float) -> None:
        for name, hz in ((DETECT, detect_hz), (DESCRIBE, describe_hz)):
            if hz < 0:
                raise ValueError(f"{name} rate {hz} Hz must be >= 0")
            self.periods[name] = 1.0 / hz if hz > 0 else 0.0

    # -- inputs ---------------------------------------------------------------------------------------------------
    def frame_arrived(self, t: float | None = None) -> None:
        self._arrivals.append(self.clock() if t is None else t)

    def frame_period(self) -> float | None:
        if len(self._arrivals) < 2:
            return None
        return float(np.median(np.diff(self._arrivals)))

    def record(self, name: str, start: float, end: float) -> None:
        task = self.tasks[name]
        task.latency.add(end - start)
        task.ends.append(end)
        task.runs += 1
        task.skip_counted = False
        period = self.periods.get(name, 0.0)
        if period > 0:
            behind = start - task.next_due
            task.next_due = task.next_due + period if behind < period else start + period

    # -- the rule -------------------------------------------------------------------------------------------------
    def expected(self, name: str) -> float:
        """The task's expected duration: its latency p99, else the plan's, else 0 (nothing known yet)."""
        for window in (self.tasks[name].latency, self.tasks[PLAN].latency):
            if len(window):
                return window.percentile(99)
        return 0.0

    def next_frame(self, now: float, waiting_since: float | None = None) -> float:
        """When the next frame to plan arrived (``waiting_since``: a frame is waiting) or is expected to."""
        if waiting_since is not None:
            return waiting_since
        period = self.frame_period()
        if period is None or not self._arrivals:
            return now
        return max(now, self._arrivals[-1] + period)

    def slack(self, now: float, deadline_s: float, waiting_since: float | None = None) -> float:
        """Seconds a side task may take from ``now`` without pushing the next plan past ``deadline_s``."""
        return self.next_frame(now, waiting_since) + deadline_s - self.expected(PLAN) - now

    def due(self, name: str, now: float, question_pending: bool = False) -> bool:
        if name == ANSWER:
            return question_pending
        return self.periods[name] > 0 and now >= self.tasks[name].next_due

    def choose(self, deadline_s: float, question_pending: bool = False,
               waiting_since: float | None = None) -> str | None:
        """The side task to run now, or None (nothing due, or no slack: the due ones are counted as skipped).
        ``waiting_since``: the arrival time of a frame waiting to be planned, if one is."""
        now = self.clock()
        due = [n for n in SIDE_TASKS if self.due(n, now, question_pending)]
        if not due:
            return None
        due.sort(key=lambda n: (n != ANSWER, self.tasks[n].next_due))
        slack = self.slack(now, deadline_s, waiting_since)
        for name in due:
            if self.expected(name) <= slack:
                return name
        for name in due:
            task = self.tasks[name]
            if not task.skip_counted:
                task.skips += 1
                task.skip_counted = True
        return None

    def plan_done(self, frame_arrival: float, side_task_end: float | None, late: bool) -> None:
        """A plan finished; ``side_task_end``: when the side task that ran before it ended (None: none did). Counts
        the plans a side task delayed (their frame arrived before that task ended) and which of those were late."""
        if side_task_end is not None and frame_arrival < side_task_end:
            self.delayed_plans += 1
            self.delayed_late += int(late)

    # -- diagnostics ----------------------------------------------------------------------------------------------
    def values(self) -> dict[str, object]:
        now = self.clock()
        out: dict[str, object] = {}
        for name, task in self.tasks.items():
            out[f"{name}.rate_hz"] = round(task.rate(now), 3)
            out[f"{name}.p50_ms"] = round(1e3 * task.latency.percentile(50), 3)
            out[f"{name}.p99_ms"] = round(1e3 * task.latency.percentile(99), 3)
            out[f"{name}.runs"] = task.runs
            if name != PLAN:
                out[f"{name}.skips"] = task.skips
        out["plans_delayed_by_side_tasks"] = self.delayed_plans
        out["plans_delayed_and_late"] = self.delayed_late
        return out
