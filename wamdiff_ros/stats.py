"""The counters and latency windows a planner front end reports: the ROS node's diagnostics and ``wamdiff-serve``'s
STATUS use the same names. Thread-safe enough for one writer thread and a reader."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np


class LatencyWindow:
    """Rolling percentiles over the last ``size`` samples (seconds)."""

    def __init__(self, size: int = 200) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._samples.append(seconds)

    def percentile(self, q: float) -> float:
        with self._lock:
            return float(np.percentile(self._samples, q)) if self._samples else float("nan")

    def __len__(self) -> int:
        return len(self._samples)


@dataclass(slots=True)
class Counters:
    frames: int = 0
    planned: int = 0
    skipped: int = 0  # a cycle skipped because an input was missing, stale or out of sync
    late: int = 0  # plans past the deadline
    fallback: int = 0
    bad_input: int = 0
    errors: int = 0
    resets: int = 0  # time went backwards (a looping bag, a restarted simulator)
    blackbox_files: int = 0
    watchdog: int = 0  # fallbacks the watchdog published: no plan by the deadline (model slow or hung)
    discarded: int = 0  # plans that finished after the watchdog had answered their frame: not published
    anytime: int = 0  # plans cut at the deadline whose best-so-far plan was published (flagged anytime)
    repaired: int = 0  # plans published with waypoints reflection repaired (flagged edited)
    implausible: int = 0  # plans that still failed the plan checker (published flagged, or the fallback)
    repeated_frames: int = 0  # frames repeating the last planned one while moving (repeated_frame_check): not planned
    held: int = 0  # ... answered by the last valid plan re-timed (within max_plan_age_s; else the fallback)
    pose_jumps: int = 0  # odometry positions further from the prediction than the gate (ego_filter): pulled less
    speed_scaled: int = 0  # odometry speeds corrected for a speedometer scale found against the positions (ego_filter)
    last_error: str = ""
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        key = reason.split(":", 1)[0]
        self.reasons[key] = self.reasons.get(key, 0) + 1
