"""Bags: rosbag2 / MCAP reading and writing with rosbags (pure Python), plus ``wamdiff-replay`` and
``wamdiff-record``.

The typestore is ROS 2 Kilted's plus this package's own messages (``wamdiff_ros/msg/*``) parsed from their .msg text;
their RIHS01 type hashes equal the ones rosidl generates, so bags written here play back in ``ros2 bag`` too.
Messages travel as raw CDR bytes throughout: replay publishes the bag's bytes unchanged, record stores the bytes
that arrive (``create_subscription(..., raw=True)``).

Nothing here imports rclpy at module level: the typestore, :class:`McapFile` and :func:`read_messages` work without
ROS 2 installed (rclpy is needed only by :func:`replay_main` and :func:`record_main`).

    python -m wamdiff_ros.ros.bags replay BAG [--rate R] [--loop] [--topics T ...] [--clock [HZ]] [--remap A:=B ...]
    python -m wamdiff_ros.ros.bags record OUT.mcap --topics T [T ...] [--duration S]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from rosbags.interfaces import Connection, Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import CompressionFormat, CompressionMode, Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.base import Nodetype

if TYPE_CHECKING:
    from rosbags.typesys.store import Typestore

PACKAGE = "wamdiff_ros"
REPO_MSG_DIR = Path(__file__).resolve().parents[2] / "msg"

# Replay QoS by message type (the rest: reliable, volatile, depth 10, or the bag's offered durability).
SENSOR_TYPES = frozenset({"sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage", "sensor_msgs/msg/CameraInfo"})
LATCHED_TYPES = frozenset({f"{PACKAGE}/msg/DrivingCommand"})


# ---------------------------------------------------------------------------------------------------------------
# Typestore


def _share_dirs(package: str) -> list[Path]:
    """Candidate ``share/<package>`` folders: the ament index (AMENT_PREFIX_PATH), then this Python's prefix."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes += [sys.prefix, os.environ.get("VIRTUAL_ENV", "")]
    seen, out = set(), []
    for prefix in prefixes:
        if not prefix:
            continue
        d = Path(prefix) / "share" / package
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    try:  # the ament index proper, when it is configured
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            d = Path(get_package_share_directory(package))
            if d not in seen and d.is_dir():
                out.insert(0, d)
        except (PackageNotFoundError, OSError, ValueError):
            pass
    except ImportError:
        pass
    return out


def msg_dir(package: str = PACKAGE) -> Path:
    """The folder holding ``package``'s .msg files: the repository's ``msg/`` for this package when present, else
    the installed ``share/<package>/msg``. Raises FileNotFoundError when neither exists."""
    if package == PACKAGE and any(REPO_MSG_DIR.glob("*.msg")):
        return REPO_MSG_DIR
    for share in _share_dirs(package):
        if any((share / "msg").glob("*.msg")):
            return share / "msg"
    raise FileNotFoundError(f"no .msg files of {package!r} found (repository msg/ or share/{package}/msg)")


def _nested_names(fielddefs: Any) -> Iterator[str]:
    """Type names referenced by a typestore field definition list."""
    for _, (nodetype, detail) in fielddefs[1]:
        while nodetype in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            nodetype, detail = detail[0]
        if nodetype == Nodetype.NAME:
            yield detail


def ensure_type(store: Typestore, msgtype: str) -> bool:
    """Make ``msgtype`` (``pkg/msg/Name``) and everything it references known to ``store``, loading missing .msg
    files from installed ``share/<pkg>/msg`` folders. Returns False when some type cannot be found."""
    pending, done = [msgtype], set()
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        if name not in store.fielddefs:
            pkg, _, short = name.partition("/msg/")
            if not short:
                return False
            try:
                path = msg_dir(pkg) / f"{short}.msg"
            except FileNotFoundError:
                return False
            if not path.is_file():
                return False
            store.register(get_types_from_msg(path.read_text(), name))
        pending.extend(_nested_names(store.fielddefs[name]))
    return True


@functools.lru_cache(maxsize=1)
def _package_types() -> dict[str, Any]:
    types: dict[str, Any] = {}
    for path in sorted(msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
    return types


def typestore() -> Typestore:
    """A fresh typestore: ROS 2 Kilted plus ``wamdiff_ros/msg/*`` (from the repository's or the installed .msg)."""
    store = get_typestore(Stores.ROS2_KILTED)
    store.register(_package_types())
    return store


# ---------------------------------------------------------------------------------------------------------------
# QoS in bags (rosbag2's offered_qos_profiles)

_ZERO = QosTime(0, 0)


def bag_qos(reliable: bool = True, transient_local: bool = False, depth: int = 10) -> Qos:
    """A rosbags QoS record for ``offered_qos_profiles``."""
    return Qos(QosHistory.KEEP_LAST, depth,
               QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
               QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE,
               _ZERO, _ZERO, QosLiveliness.AUTOMATIC, _ZERO, False)


# ---------------------------------------------------------------------------------------------------------------
# One-file MCAP writer and reader


class McapFile:
    """Writes one self-contained ``.mcap`` file (rosbag2 metadata embedded) with rosbags' rosbag2 writer.

    rosbags writes a bag folder; this writes it next to ``path`` in a hidden temporary folder and moves the .mcap
    into place on :meth:`close` (an exception inside ``with`` removes it instead). Chunks are zstd-compressed unless
    ``compress=False`` (``ros2 bag`` and every MCAP reader handle both). Not thread-safe: one writer thread.
    """

    def __init__(self, path: str | Path, store: Typestore | None = None, *, compress: bool = True,
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.suffix != ".mcap":
            raise ValueError(f"{self.path}: the output must end in .mcap")
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists already")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else typestore()
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        self._writer = Writer(self._tmp / "bag", version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP)
        if compress:
            self._writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
        self._writer.open()
        self._connections: dict[tuple[str, str], Connection] = {}
        self.counts: Counter[str] = Counter()
        self.closed = False

    def connection(self, topic: str, msgtype: str, qos: Sequence[Qos] = ()) -> Connection:
        """The connection of (topic, msgtype), added on first use. Raises KeyError for a type the typestore (and
        the installed share/<pkg>/msg folders) do not know."""
        key = (topic, msgtype)
        conn = self._connections.get(key)
        if conn is None:
            if not ensure_type(self.store, msgtype):
                raise KeyError(f"message type {msgtype!r} is unknown (no .msg found for it)")
            conn = self._writer.add_connection(topic, msgtype, typestore=self.store, offered_qos_profiles=list(qos))
            self._connections[key] = conn
        return conn

    def write(self, topic: str, msgtype: str, stamp_ns: int, data: bytes | memoryview,
              qos: Sequence[Qos] = ()) -> None:
        """Append one serialized (CDR) message, logged at ``stamp_ns``."""
        self._writer.write(self.connection(topic, msgtype, qos), int(stamp_ns), data)
        self.counts[topic] += 1

    def close(self) -> Path:
        """Finish the file and move it into place; returns its path."""
        if not self.closed:
            self.closed = True
            self._writer.close()
            os.replace(self._tmp / "bag" / "bag.mcap", self.path)
            shutil.rmtree(self._tmp, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._writer.abort()
            finally:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> McapFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_messages(path: str | Path, topics: Sequence[str] = ()) -> Iterator[tuple[Connection, int, bytes]]:
    """(connection, log time ns, raw CDR) of a bag (an .mcap/.db3 file or a rosbag2 folder), in time order."""
    with Reader(path) as reader:
        conns = [c for c in reader.connections if not topics or c.topic in topics]
        if conns:
            yield from reader.messages(connections=conns)


def mcap_metadata(path: str | Path) -> dict[str, Any]:
    """The rosbag2 metadata (``rosbag2_bagfile_information``) embedded in an .mcap file written by rosbag2 or
    rosbags, as a dict; {} when there is none. It holds what rosbags' reader leaves out, e.g. the topics'
    ``type_description_hash``."""
    import struct

    from ruamel.yaml import YAML

    with open(path, "rb") as f:
        if f.read(8) != b"\x89MCAP0\r\n":
            raise ValueError(f"{path} is not an MCAP file")
        while head := f.read(9):
            if len(head) < 9:
                break
            op, length = head[0], struct.unpack("<Q", head[1:])[0]
            if op != 0x0C:  # not a metadata record: skip it
                f.seek(length, os.SEEK_CUR)
                continue
            body = f.read(length)
            n = struct.unpack_from("<I", body)[0]
            name, pos = body[4:4 + n].decode(), 4 + n
            if name != "rosbag2":
                continue
            end, pos = pos + 4 + struct.unpack_from("<I", body, pos)[0], pos + 4
            while pos < end:
                k = struct.unpack_from("<I", body, pos)[0]
                key, pos = body[pos + 4:pos + 4 + k].decode(), pos + 4 + k
                v = struct.unpack_from("<I", body, pos)[0]
                value, pos = body[pos + 4:pos + 4 + v].decode(), pos + 4 + v
                if key == "serialized_metadata":
                    return dict(YAML(typ="safe").load(value) or {})
    return {}


def type_hashes(path: str | Path) -> dict[str, str]:
    """{topic: RIHS01 type hash} from an .mcap file's embedded rosbag2 metadata."""
    topics = mcap_metadata(path).get("topics_with_message_count") or []
    return {t["topic_metadata"]["name"]: t["topic_metadata"].get("type_description_hash", "") for t in topics}


def topic_counts(path: str | Path) -> dict[str, tuple[str, int]]:
    """{topic: (msgtype, message count)} of a bag."""
    with Reader(path) as reader:
        return {t: (info.msgtype or "", info.msgcount) for t, info in reader.topics.items()}


# ---------------------------------------------------------------------------------------------------------------
# rclpy helpers (imported lazily)


def message_class(msgtype: str) -> type:
    """The rclpy message class of ``pkg/msg/Name``."""
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def replay_qos(msgtype: str, offered: Sequence[Qos] = ()):
    """The publisher QoS replay uses: images best-effort (sensor data), DrivingCommand reliable + transient local
    depth 1, anything else reliable depth 10, transient local when the bag says all its publishers were."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

    if msgtype in SENSOR_TYPES:
        return qos_profile_sensor_data
    if msgtype in LATCHED_TYPES:
        return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
    latched = bool(offered) and all(q.durability == QosDurability.TRANSIENT_LOCAL for q in offered)
    return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)


def _split_ros_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(our arguments, rclpy's arguments starting at --ros-args)."""
    argv = list(argv)
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        return argv[:i], argv[i:]
    return argv, []


class _Stop:
    """SIGINT/SIGTERM set a flag (rclpy's own handlers are not installed), so loops end and files get closed."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass

    def _handle(self, signum, frame) -> None:
        self.event.set()

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def wait(self, seconds: float) -> bool:
        return self.event.wait(max(0.0, seconds))

    def __bool__(self) -> bool:
        return self.event.is_set()


def _init_rclpy(ros_args: list[str]):
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    context = rclpy.Context()
    rclpy.init(args=["wamdiff", *ros_args], context=context, signal_handler_options=SignalHandlerOptions.NO)
    return context


# ---------------------------------------------------------------------------------------------------------------
# wamdiff-replay


def _remaps(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        src, sep, dst = pair.partition(":=")
        if not sep or not src or not dst:
            raise argparse.ArgumentTypeError(f"--remap expects FROM:=TO, got {pair!r}")
        out[src] = dst
    return out


def replay_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-replay", description="Publish a bag's messages (raw CDR) at bag time.")
    p.add_argument("bag", type=Path, help="an .mcap (or .db3) file or a rosbag2 folder")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    p.add_argument("--loop", action="store_true", help="start over at the end (time jumps back)")
    p.add_argument("--topics", nargs="+", default=[], metavar="T", help="replay only these bag topics")
    p.add_argument("--clock", nargs="?", type=float, const=40.0, default=None, metavar="HZ",
                   help="publish /clock with the bag time, at HZ between messages (default 40) and before each one")
    p.add_argument("--remap", nargs="+", default=[], metavar="FROM:=TO", help="publish bag topic FROM on TO")
    p.add_argument("--delay", type=float, default=1.0,
                   help="seconds between creating the publishers and the first message, for discovery (default 1)")
    p.add_argument("--wait-for-subscribers", type=float, default=None, nargs="?", const=float("inf"),
                   metavar="TIMEOUT", help="before the delay, wait until every topic has a subscriber (at most "
                                           "TIMEOUT s; default: until Ctrl-C)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def replay_main(argv: Sequence[str] | None = None) -> int:
    """``wamdiff-replay BAG [--rate R] [--loop] [--topics ...] [--clock [HZ]] [--remap FROM:=TO ...] [--delay S]
    [--wait-for-subscribers [TIMEOUT]] [--ros-args ...]``: publish each message's raw bytes at its bag time / rate.
    Ctrl-C exits cleanly (0)."""
    ours, ros_args = _split_ros_args(sys.argv[1:] if argv is None else argv)
    parser = replay_parser()
    args = parser.parse_args(ours)
    if not args.rate > 0:
        parser.error("--rate must be positive")
    if args.clock is not None and not args.clock > 0:
        parser.error("--clock HZ must be positive")
    try:
        remap = _remaps(args.remap)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if not args.bag.exists():
        parser.error(f"{args.bag} does not exist")

    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from tqdm import tqdm

    stop = _Stop()
    context = _init_rclpy(ros_args)
    import rclpy

    node = rclpy.create_node("wamdiff_replay", context=context)
    log = node.get_logger()
    sent: Counter[str] = Counter()
    loops = 0
    try:
        with Reader(args.bag) as reader:
            conns = [c for c in reader.connections if not args.topics or c.topic in args.topics]
            missing = set(args.topics) - {c.topic for c in conns}
            if missing:
                log.warning(f"not in the bag: {', '.join(sorted(missing))}")
            pubs = {}
            for c in conns:
                topic = remap.get(c.topic, c.topic)
                offered = getattr(c.ext, "offered_qos_profiles", [])
                try:
                    cls = message_class(c.msgtype)
                except (ImportError, AttributeError, ValueError) as exc:
                    log.error(f"skipping {c.topic}: no Python message class for {c.msgtype} ({exc})")
                    continue
                pubs[c.id] = node.create_publisher(cls, topic, replay_qos(c.msgtype, offered))
            conns = [c for c in conns if c.id in pubs]
            if not conns:
                log.error("nothing to replay")
                return 1
            clock_pub = (node.create_publisher(Clock, "/clock", QoSProfile(depth=1,
                         reliability=ReliabilityPolicy.RELIABLE)) if args.clock else None)
            total = sum(c.msgcount for c in conns)
            t_first = reader.start_time  # the bag's start, also with --topics (like ros2 bag play)

            def publish_clock(bag_ns: int) -> None:
                msg = Clock()
                msg.clock.sec, msg.clock.nanosec = divmod(int(bag_ns), 1_000_000_000)
                clock_pub.publish(msg)

            if clock_pub is not None:
                publish_clock(t_first)
            log.info(f"replaying {args.bag} ({total} messages on {len(pubs)} topics) at rate {args.rate}"
                     f"{' in a loop' if args.loop else ''}")
            if args.wait_for_subscribers is not None:
                deadline = time.monotonic() + args.wait_for_subscribers
                waiting = list(pubs.values())
                while not stop and time.monotonic() < deadline:
                    waiting = [p for p in waiting if p.get_subscription_count() == 0]
                    if not waiting:
                        break
                    stop.wait(0.05)
                if waiting:
                    log.warning(f"no subscriber on {', '.join(p.topic_name for p in waiting)}; playing anyway")
            stop.wait(args.delay)
            period = 1.0 / args.clock if args.clock else None
            bar = tqdm(total=total, unit="msg", disable=args.quiet or None, desc="replay")
            while not stop:
                bar.reset(total)
                wall0 = time.monotonic()
                for conn, t, raw in reader.messages(connections=conns):
                    target = wall0 + (t - t_first) / 1e9 / args.rate
                    while not stop:
                        now = time.monotonic()
                        if now >= target:
                            break
                        if clock_pub is not None:
                            publish_clock(min(t, t_first + int((now - wall0) * args.rate * 1e9)))
                            stop.wait(min(period, target - now))
                        else:
                            stop.wait(target - now)
                    if stop:
                        break
                    if clock_pub is not None:
                        publish_clock(t)
                    pubs[conn.id].publish(raw)
                    sent[conn.topic] += 1
                    bar.update(1)
                if stop:
                    break
                loops += 1
                if not args.loop:
                    break
                log.info(f"loop {loops} done: starting over (time jumps back)")
            bar.close()
    finally:
        stop.restore()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    summary = ", ".join(f"{t}: {n}" for t, n in sorted(sent.items()))
    print(f"replayed {sum(sent.values())} messages, {loops} full pass(es){' (interrupted)' if stop else ''}: {summary}",
          flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# wamdiff-record


def record_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-record", description="Record topics (raw CDR) into one MCAP file.")
    p.add_argument("out", type=Path, help="the .mcap file to write (must not exist)")
    p.add_argument("--topics", nargs="+", required=True, metavar="T", help="topics to record")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--no-compress", action="store_true", help="write uncompressed chunks (default zstd)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _subscription_qos(infos):
    """Match the publishers: reliable / transient local only when every publisher offers it (like ros2 bag)."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    reliable = bool(infos) and all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE for i in infos)
    latched = bool(infos) and all(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in infos)
    qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)
    return qos, [bag_qos(reliable, latched, 100 if not latched else 1)]


def record_main(argv: Sequence[str] | None = None) -> int:
    """``wamdiff-record OUT.mcap --topics T [T ...] [--duration S] [--ros-args ...]``: subscribe raw to each topic
    once a publisher shows its type, write every message (receive time) to OUT.mcap, and print the count per topic
    on exit (after --duration or Ctrl-C)."""
    ours, ros_args = _split_ros_args(sys.argv[1:] if argv is None else argv)
    parser = record_parser()
    args = parser.parse_args(ours)
    if args.out.suffix != ".mcap":
        parser.error("OUT must end in .mcap")
    if args.out.exists():
        parser.error(f"{args.out} exists already")

    from rclpy.executors import SingleThreadedExecutor
    from tqdm import tqdm

    stop = _Stop()
    context = _init_rclpy(ros_args)
    import rclpy

    node = rclpy.create_node("wamdiff_record", context=context)
    log = node.get_logger()
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    out = McapFile(args.out, compress=not args.no_compress)
    wanted = [node.resolve_topic_name(t) for t in args.topics]
    subscribed: dict[str, str] = {}
    bar = tqdm(unit="msg", disable=args.quiet or None, desc="record")
    clock = node.get_clock()

    def subscribe(topic: str, msgtype: str) -> None:
        infos = node.get_publishers_info_by_topic(topic)
        if not infos:  # only subscribers so far: wait for a publisher to match its QoS
            return
        qos, offered = _subscription_qos(infos)
        try:
            out.connection(topic, msgtype, offered)
            cls = message_class(msgtype)
        except (KeyError, ImportError, AttributeError, ValueError) as exc:
            log.error(f"cannot record {topic} ({msgtype}): {exc}")
            subscribed[topic] = ""
            return

        def on_message(raw: bytes) -> None:
            out.write(topic, msgtype, clock.now().nanoseconds, raw)
            bar.update(1)

        node.create_subscription(cls, topic, on_message, qos, raw=True)
        subscribed[topic] = msgtype
        log.info(f"recording {topic} ({msgtype})")

    start = time.monotonic()
    end = start + args.duration if args.duration is not None else float("inf")
    next_poll = start
    try:
        while not stop and time.monotonic() < end:
            if time.monotonic() >= next_poll and len(subscribed) < len(wanted):
                types = dict(node.get_topic_names_and_types())
                for topic in wanted:
                    if topic not in subscribed and types.get(topic):
                        subscribe(topic, types[topic][0])
                next_poll = time.monotonic() + 0.1
            executor.spin_once(timeout_sec=min(0.05, max(0.0, end - time.monotonic())))
    finally:
        bar.close()
        stop.restore()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
        path = out.close()
    counts = out.counts
    print(f"recorded {sum(counts.values())} messages to {path}{' (interrupted)' if stop else ''}:", flush=True)
    for topic in wanted:
        state = subscribed.get(topic)
        kind = state if state else ("unrecordable type" if state == "" else "never seen")
        print(f"  {topic}: {counts.get(topic, 0)} ({kind})", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m wamdiff_ros.ros.bags {replay,record} ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"replay": replay_main, "record": record_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m wamdiff_ros.ros.bags {replay,record} ...  (-h after either for help)",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
