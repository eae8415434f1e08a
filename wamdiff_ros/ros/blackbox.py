"""A flight recorder for the node: the last few seconds of raw (CDR) messages per topic, dumped to MCAP on demand.

Pure Python plus rosbags: feed it from ``create_subscription(..., raw=True)`` callbacks with the receive time, and
call :meth:`BlackBox.dump` when something worth investigating happens (a fallback stop); :class:`Recorder` does
that for the node. The dump replays with ``wamdiff-replay`` or ``ros2 bag play``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from wamdiff_ros.ros.bags import McapFile, typestore

if TYPE_CHECKING:
    from rosbags.typesys.store import Typestore


class Entry(NamedTuple):
    stamp_ns: int
    msgtype: str
    data: bytes


@dataclass(frozen=True, slots=True)
class BlackBoxStats:
    messages: int
    bytes: int
    topics: dict[str, int]  # messages per topic
    dropped_old: int  # dropped for leaving the time window
    dropped_cap: int  # dropped for the byte cap


class BlackBox:
    """Keeps the last ``seconds`` of messages per topic (by receive time), at most ``max_bytes`` of payload in all.

    The window ends at the newest stamp seen on any topic. With ``keep_latest`` (default) the newest message of each
    topic stays even when older than the window, so rare and latched topics (a navigation command) still appear in a
    dump. Over ``max_bytes`` the oldest messages go first, the kept-latest ones last. A stamp more than
    ``jump_back_s`` older than the newest one (a looping bag under sim time, a restarted clock) empties the buffer
    first; smaller disorder (threads racing to add) is tolerated. :meth:`dump` writes the newest
    messages up to ``max_dump_bytes`` of payload (default ``max_bytes``). All methods are thread-safe; a dump copies
    the buffer under the lock and writes outside it, so :meth:`add` never waits for the disk. The typestore is built
    at the first dump (~0.1 s) unless one is passed as ``store``.
    """

    def __init__(self, seconds: float = 10.0, max_bytes: int = 256 * 2**20, *, max_dump_bytes: int | None = None,
                 keep_latest: bool = True, jump_back_s: float = 1.0, store: Typestore | None = None,
                 compress: bool = True) -> None:
        if not seconds > 0 or max_bytes <= 0 or (max_dump_bytes is not None and max_dump_bytes <= 0):
            raise ValueError(f"need seconds > 0 and positive byte caps, got {seconds}, {max_bytes}, {max_dump_bytes}")
        self.window_ns = int(round(seconds * 1e9))
        self.max_bytes = int(max_bytes)
        self.max_dump_bytes = int(max_dump_bytes if max_dump_bytes is not None else max_bytes)
        self.keep_latest = keep_latest
        self.jump_back_ns = int(round(jump_back_s * 1e9))
        self.compress = compress
        self._store = store
        self._lock = threading.Lock()
        self._dump_lock = threading.Lock()
        self._topics: dict[str, deque[Entry]] = {}
        self._bytes = 0
        self._newest = -(2**63)
        self.dropped_old = 0
        self.dropped_cap = 0

    # -- feeding ---------------------------------------------------------------------------------------------------
    def add(self, topic: str, msgtype: str, stamp_ns: int, raw: bytes | bytearray | memoryview) -> None:
        """Store one serialized message received at ``stamp_ns`` (ns, any monotonic-enough clock)."""
        data = bytes(raw)
        stamp_ns = int(stamp_ns)
        with self._lock:
            q = self._topics.get(topic)
            if q is None:
                q = self._topics[topic] = deque()
            if stamp_ns < self._newest - self.jump_back_ns:  # time jumped back (a looping bag, a restart): start over
                self._clear_locked()
                q = self._topics[topic] = deque()
            q.append(Entry(stamp_ns, msgtype, data))
            self._bytes += len(data)
            self._newest = max(self._newest, stamp_ns)
            self._prune_locked()

    def _clear_locked(self) -> None:
        self._topics.clear()
        self._bytes = 0
        self._newest = -(2**63)

    def _prune_locked(self) -> None:
        cutoff = self._newest - self.window_ns
        floor = 1 if self.keep_latest else 0
        for topic, q in list(self._topics.items()):
            while len(q) > floor and q[0].stamp_ns < cutoff:
                self._bytes -= len(q.popleft().data)
                self.dropped_old += 1
            if not q:
                del self._topics[topic]
        while self._bytes > self.max_bytes:
            victim = self._oldest_locked(protect_latest=True) or self._oldest_locked(protect_latest=False)
            if victim is None:
                break
            self._bytes -= len(self._topics[victim].popleft().data)
            self.dropped_cap += 1
            if not self._topics[victim]:
                del self._topics[victim]

    def _oldest_locked(self, protect_latest: bool) -> str | None:
        """The topic holding the oldest droppable message."""
        best, best_stamp = None, None
        for topic, q in self._topics.items():
            if not q or (protect_latest and self.keep_latest and len(q) == 1):
                continue
            if best_stamp is None or q[0].stamp_ns < best_stamp:
                best, best_stamp = topic, q[0].stamp_ns
        return best

    # -- inspection ------------------------------------------------------------------------------------------------
    def snapshot(self) -> list[tuple[str, Entry]]:
        """(topic, entry) of everything held, oldest first."""
        with self._lock:
            items = [(topic, e) for topic, q in self._topics.items() for e in q]
        items.sort(key=lambda it: it[1].stamp_ns)
        return items

    def stats(self) -> BlackBoxStats:
        with self._lock:
            topics = {t: len(q) for t, q in self._topics.items()}
            return BlackBoxStats(sum(topics.values()), self._bytes, topics, self.dropped_old, self.dropped_cap)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._topics.values())

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._clear_locked()

    # -- dumping ---------------------------------------------------------------------------------------------------
    def dump(self, path: str | Path) -> Path:
        """Write the buffer to an MCAP file and return its path. ``path`` is the .mcap file to create, or an existing
        folder to create ``blackbox_<UTC time>.mcap`` in. Only the newest messages up to ``max_dump_bytes`` of
        payload go in (the kept-latest message of each topic before older ones). Topics whose message type is
        unknown to the typestore are left out. Raises FileExistsError for an existing file."""
        path = Path(path)
        if path.is_dir():
            stem = time.strftime("blackbox_%Y%m%dT%H%M%SZ", time.gmtime())
            path = path / f"{stem}.mcap"
            n = 1
            while path.exists():
                path = path.with_name(f"{stem}_{n}.mcap")
                n += 1
        items = self._select(self.snapshot())
        with self._dump_lock:  # one dump at a time (they share the typestore); add() is not held up
            if self._store is None:
                self._store = typestore()
            with McapFile(path, self._store, compress=self.compress) as out:
                for topic, e in items:
                    try:
                        out.write(topic, e.msgtype, e.stamp_ns, e.data)
                    except KeyError:
                        continue
        return path

    def _select(self, items: list[tuple[str, Entry]]) -> list[tuple[str, Entry]]:
        """The newest messages within the dump cap, the latest of each topic first; oldest first again."""
        latest: dict[str, int] = {}
        for i, (topic, _) in enumerate(items):
            latest[topic] = i
        firsts = set(latest.values()) if self.keep_latest else set()
        chosen, total = [], 0
        for i in sorted(firsts, reverse=True):  # the newest message of each topic, while it fits
            size = len(items[i][1].data)
            if total + size <= self.max_dump_bytes:
                chosen.append(i)
                total += size
        for i in range(len(items) - 1, -1, -1):  # then everything else, newest first, until the cap
            if i in firsts:
                continue
            size = len(items[i][1].data)
            if total + size > self.max_dump_bytes:
                break
            chosen.append(i)
            total += size
        return [items[i] for i in sorted(chosen)]


def default_folder(setting: str) -> str:
    """The node's ``blackbox_dir``: '' = $ROS_HOME/wamdiff_blackbox."""
    home = os.environ.get("ROS_HOME", os.path.join(os.path.expanduser("~"), ".ros"))
    return setting or os.path.join(home, "wamdiff_blackbox")


class Recorder:
    """A node's black box: its inputs' raw copies go into a ``BlackBox`` (``add``, from raw subscriptions), a
    fallback dumps it (``dump``) on a thread of its own, at most once per ``min_interval_s``; a disk error is reported
    through ``on_error`` and never stops planning."""

    def __init__(self, box: BlackBox, folder: str, on_written: Callable[[Path, str], None],
                 on_error: Callable[[Exception], None]) -> None:
        self.box = box
        self.folder = folder
        self.on_written = on_written
        self.on_error = on_error
        self._last_dump = -float("inf")

    def add(self, topic: str, msgtype: str, stamp_ns: int, raw: bytes | bytearray | memoryview) -> None:
        self.box.add(topic, msgtype, stamp_ns, raw)

    def dump(self, reason: str, min_interval_s: float) -> None:
        if time.monotonic() - self._last_dump < min_interval_s:
            return
        self._last_dump = time.monotonic()
        threading.Thread(target=self._write, args=(reason,), name="wamdiff-blackbox", daemon=True).start()

    def _write(self, reason: str) -> None:
        try:
            os.makedirs(self.folder, exist_ok=True)
            self.on_written(self.box.dump(self.folder), reason)
        except Exception as exc:  # a full disk must not stop planning
            self.on_error(exc)
