"""The planning cycle's plain parts, free of rclpy: the latest-frame slot, the odometry history that pairs a frame
with the odometry of its own instant, input checks and latency statistics (the fallback stop: ``control.stop``). The
node wires them to topics; tests drive them directly."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np


T = TypeVar("T")


class LatestSlot(Generic[T]):
    """A one-item mailbox between the subscription callbacks and the inference thread: a newer item replaces a
    pending one (never a queue), so inference always runs on the latest frame."""

    def __init__(self) -> None:
        self._item: T | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.replaced = 0

    def put(self, item: T) -> None:
        with self._cond:
            if self._item is not None:
                self.replaced += 1
            self._item = item
            self._cond.notify()

    def take(self, timeout: float | None = None) -> T | None:
        """The pending item (removing it), or None after ``timeout`` s or once closed."""
        with self._cond:
            if self._item is None and not self._closed:
                self._cond.wait(timeout)
            item, self._item = self._item, None
            return item

    def peek(self) -> T | None:
        """The pending item, left in place (None when none)."""
        return self._item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._item = None
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self._closed = False


class StampedHistory(Generic[T]):
    """The last ``size`` values by stamp (seconds), filled by one callback and read by the inference thread.

    A frame and the odometry of its instant arrive on different topics in either order, so the cycle does not take
    the newest odometry: ``at(stamp, wait_s)`` waits up to ``wait_s`` (wall) for a value stamped at or after
    ``stamp``, then answers the value nearest ``stamp`` (the older of two equally near). Values arrive in stamp
    order; an older stamp means the clock jumped back (a looping bag, a restarted simulator): the history starts
    over."""

    def __init__(self, size: int = 64) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._items: deque[tuple[float, T]] = deque(maxlen=size)
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, stamp: float, value: T) -> None:
        with self._cond:
            if self._items and stamp < self._items[-1][0]:
                self._items.clear()
            self._items.append((float(stamp), value))
            self._cond.notify_all()

    def drop_after(self, stamp: float) -> None:
        """Forget the values stamped after ``stamp`` (what is left over from before a jump back in time)."""
        with self._cond:
            while self._items and self._items[-1][0] > stamp:
                self._items.pop()

    def newest(self) -> tuple[float, T] | None:
        with self._cond:
            return self._items[-1] if self._items else None

    def at(self, stamp: float, wait_s: float = 0.0) -> tuple[float, T] | None:
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._items or self._items[-1][0] < stamp:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return min(self._items, key=lambda item: abs(item[0] - stamp), default=None)


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


class ClockRate:
    """How fast the node's clock runs against the wall clock (1 for the system clock; a simulator's ``/clock`` may
    run slower, faster or stand still), from (wall, clock) samples over the last ``window_s``; None until they span
    0.2 s. Turns the time left to a deadline on the node's clock into wall time for the decoder."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def add(self, wall: float, clock: float) -> None:
        with self._lock:
            if self._samples and clock < self._samples[-1][1]:
                self._samples.clear()  # the clock jumped back
            self._samples.append((wall, clock))
            while self._samples and wall - self._samples[0][0] > self.window_s:
                self._samples.popleft()

    def rate(self) -> float | None:
        with self._lock:
            if len(self._samples) < 2 or self._samples[-1][0] - self._samples[0][0] < 0.2:
                return None
            (w0, c0), (w1, c1) = self._samples[0], self._samples[-1]
            return (c1 - c0) / (w1 - w0)


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
    last_error: str = ""
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        key = reason.split(":", 1)[0]
        self.reasons[key] = self.reasons.get(key, 0) + 1


@dataclass(frozen=True, slots=True)
class InputLimits:
    sync_tolerance_s: float = 0.1  # odometry must lie this close to the image stamp
    command_timeout_s: float = 10.0  # a command older than this is stale
    future_tolerance_s: float = 0.5  # an image stamped further ahead of the clock is refused


def check_inputs(
    image_stamp: float,
    now: float,
    odom_stamp: float | None,
    command_stamp: float | None,
    limits: InputLimits,
) -> str | None:
    """Why this cycle cannot run, or None. Stamps in seconds of the node's clock (sim time when used)."""
    if image_stamp > now + limits.future_tolerance_s:
        return f"future stamp: image {image_stamp - now:.2f} s ahead of the clock"
    if odom_stamp is None:
        return "missing odometry"
    if abs(odom_stamp - image_stamp) > limits.sync_tolerance_s:
        return (f"odometry out of sync: {abs(odom_stamp - image_stamp) * 1e3:.0f} ms from the image "
                f"(tolerance {limits.sync_tolerance_s * 1e3:.0f} ms)")
    if command_stamp is None:
        return "missing command"
    if now - command_stamp > limits.command_timeout_s:
        return f"stale command: {now - command_stamp:.1f} s old (limit {limits.command_timeout_s:.1f} s)"
    return None


class DeadlineWatch(Generic[T]):
    """The frames taken in and not yet answered, for a watchdog independent of the inference thread. Every answer
    (a plan, or the watchdog's fallback) claims its frame and every older one: whoever claims first publishes, the
    other side stands down. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[float, T]] = deque()
        self._answered = -float("inf")

    def add(self, stamp: float, item: T) -> None:
        with self._lock:
            if stamp < self._answered:  # time went backwards (a looping bag): start over
                self._pending.clear()
                self._answered = -float("inf")
            self._pending.append((stamp, item))

    def drop(self, stamp: float) -> None:
        """The frame will get no answer (a skipped cycle: missing or stale inputs, reported as such)."""
        with self._lock:
            self._pending = deque(p for p in self._pending if p[0] != stamp)

    def claim(self, stamp: float) -> bool:
        """True when the frame at ``stamp`` was not answered yet: the caller answers it (and every older frame)."""
        with self._lock:
            if stamp <= self._answered:
                return False
            self._answer_up_to(stamp)
            return True

    def expired(self, now: float, deadline_s: float) -> tuple[float, T] | None:
        """The newest pending frame older than ``deadline_s`` at ``now``, claimed (with every older one); None when
        none is."""
        with self._lock:
            late = [p for p in self._pending if now - p[0] > deadline_s]
            if not late:
                return None
            self._answer_up_to(late[-1][0])
            return late[-1]

    def _answer_up_to(self, stamp: float) -> None:
        """The frame at ``stamp`` and every older one are answered (the lock held)."""
        self._answered = stamp
        while self._pending and self._pending[0][0] <= stamp:
            self._pending.popleft()

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)


def default_command_due(command: tuple[float, object] | None, now: float, timeout_s: float, default: str) -> bool:
    """Whether a cycle plans with the ``default_command`` parameter: one is set and no command has arrived, or only
    one older than ``timeout_s``."""
    return bool(default) and (command is None or now - command[0] > timeout_s)
