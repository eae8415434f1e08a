"""``wamdiff-replay`` and ``wamdiff-record``: a bag's raw CDR messages published at bag time, and topics recorded
raw into one MCAP file (the file side: ``bags.py``). rclpy is imported when a command runs.

    python -m wamdiff_ros.ros.bag_tools replay BAG [--rate R] [--loop] [--topics T ...] [--clock [HZ]] [--remap A:=B]
    python -m wamdiff_ros.ros.bag_tools record OUT.mcap --topics T [T ...] [--duration S]
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from rosbags.interfaces import Qos, QosDurability
from rosbags.rosbag2 import Reader

from wamdiff_ros.ros.bags import PACKAGE, McapFile, bag_qos

# Replay QoS by message type (the rest: reliable, volatile, depth 10, or the bag's offered durability).
SENSOR_TYPES = frozenset({"sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage", "sensor_msgs/msg/CameraInfo"})
LATCHED_TYPES = frozenset({f"{PACKAGE}/msg/DrivingCommand"})


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
    """``python -m wamdiff_ros.ros.bag_tools {replay,record} ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"replay": replay_main, "record": record_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m wamdiff_ros.ros.bag_tools {replay,record} ...  (-h after either for help)",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
