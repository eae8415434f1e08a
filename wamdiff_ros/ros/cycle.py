"""The planning cycle's plain parts, free of rclpy: the latest-frame slot, the inputs a frame is paired with (the
odometry of its own instant, the command, the route points), input checks and the decoder's deadline (counters
and latency windows: ``wamdiff_ros.stats``; the fallback stop: ``control.stop``). The node wires them to topics;
tests drive them directly."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from wamdiff_ros.format import Command
from wamdiff_ros.route_points import route_points_ahead

if TYPE_CHECKING:
    from wamdiff_ros.planner import EgoState


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


@dataclass(frozen=True, slots=True)
class Paired:
    """A frame's inputs of its own instant: the ego pose (x, y, yaw in the odometry frame), its state and the
    command to plan with."""
    pose: tuple[float, float, float]
    ego: EgoState
    command: Command


@dataclass(frozen=True, slots=True)
class RoutePoints:
    """A cycle's route points (ego frame), or None with the ``problem`` (``report``: said for the first time)."""
    points: np.ndarray | None
    problem: Exception | None = None
    report: bool = True


class CycleInputs:
    """What the subscriptions keep for the next cycle (odometry by stamp, the latest command and route) and the pairing
    of a frame with them. The callbacks write, the inference thread pairs: thread-safe."""

    def __init__(self) -> None:
        self.odometry: StampedHistory[tuple[tuple[float, float, float], EgoState]] = StampedHistory()
        self.odom_frame_id = ""  # header.frame_id of the latest odometry
        self._lock = threading.Lock()
        self._command: tuple[float, Command] | None = None
        self.route: RouteInput | None = None
        self.route_state = "none"  # for the diagnostics: none | used | refused: ... | error: ...
        self.default_in_use = False  # the last pairing planned with default_command
        self._last_image_stamp = -np.inf

    def add_odometry(self, stamp: float, frame_id: str, pose: tuple[float, float, float], ego: EgoState) -> None:
        self.odom_frame_id = frame_id
        self.odometry.add(stamp, (pose, ego))

    def set_command(self, stamp: float, command: Command) -> None:
        with self._lock:
            self._command = (stamp, command)

    @property
    def command(self) -> tuple[float, Command] | None:
        with self._lock:
            return self._command

    def set_route(self, stamp: float, frame_id: str, points: np.ndarray) -> None:
        """The latest route; an empty one clears it. Raises when it has fewer than two finite points (the same checks
        as every cycle's); the caller then clears the route."""
        if len(points):
            route_points_ahead(points, points[0], 0.0)
        with self._lock:
            if not len(points):
                self.route, self.route_state = None, "none"
            else:
                self.route = RouteInput(stamp, frame_id, points)

    def clear_route(self, state: str = "none") -> None:
        with self._lock:
            self.route, self.route_state = None, state

    def went_back(self, stamp: float, sync_tolerance_s: float) -> bool:
        """Whether the image at ``stamp`` is older than the last one (a looping bag, a restarted simulator): the
        odometry from before the jump is dropped and the caller starts over."""
        back = stamp < self._last_image_stamp
        if back:
            self.odometry.drop_after(stamp + sync_tolerance_s)
        self._last_image_stamp = stamp
        return back

    def pair(self, stamp: float, now: float, limits: InputLimits, odometry_wait_s: float,
             default_command: str) -> Paired | str:
        """The inputs of the frame at ``stamp`` (waiting up to ``odometry_wait_s`` for its odometry), or why the
        cycle cannot run."""
        odom = self.odometry.at(stamp, odometry_wait_s)
        command = self.command
        self.default_in_use = default_command_due(command, now, limits.command_timeout_s, default_command)
        if self.default_in_use:
            command = (now, Command(default_command))
        reason = check_inputs(stamp, now, odom[0] if odom else None, command[0] if command else None, limits)
        if reason is not None:
            return reason
        pose, ego = odom[1]
        return Paired(pose, ego, command[1])

    def route_points(self, pose: tuple[float, float, float]) -> RoutePoints:
        """The route points (``ROUTE_AHEAD_M`` ahead along the route, ego frame) for the ego at ``pose``; None with the
        problem when the route is missing (no problem), in another frame than the odometry's, or unusable."""
        with self._lock:
            route = self.route
        if route is None:
            return RoutePoints(None)
        if route.frame_id and self.odom_frame_id and route.frame_id != self.odom_frame_id:
            message = (f"frame {route.frame_id!r} is not the odometry's {self.odom_frame_id!r}; planning without "
                       "route points")
            report, route.refused = not route.refused, True
            self._set_route_state(f"refused: {message}")
            return RoutePoints(None, ValueError(message), report)
        try:
            points = route_points_ahead(route.points, pose[:2], pose[2])
        except Exception as exc:
            self._set_route_state(f"error: {exc}")
            return RoutePoints(None, exc)
        self._set_route_state("used")
        return RoutePoints(points)

    def _set_route_state(self, state: str) -> None:
        with self._lock:
            self.route_state = state

    def values(self, now: float) -> dict[str, object]:
        """The inputs' ages and the route's state, for the diagnostics."""
        odom, command = self.odometry.newest(), self.command
        with self._lock:
            route, state = self.route, self.route_state
        return {"odometry_age_s": round(now - odom[0], 3) if odom else "none",
                "command_age_s": round(now - command[0], 3) if command else "none",
                "route": state, "route_age_s": round(now - route.stamp, 3) if route else "none"}


def decode_deadline(image_stamp: float, now: float, start: float, deadline_s: float, margin_s: float,
                    clock_rate: float | None) -> float | None:
    """The ``time.perf_counter()`` reading at which decoding answers its best so far: ``margin_s`` before the frame's
    deadline, the time left on the node's clock turned into wall time by ``clock_rate``; None (no cut) while the
    clock's rate is unknown or it stands still."""
    if clock_rate is None or clock_rate <= 1e-3:
        return None
    return start + (image_stamp + deadline_s - now) / clock_rate - margin_s
