"""Node benchmark: the planner node in its own process, fed camera-sized images over Fast DDS, in one run.

The bench starts ``wamdiff_ros.ros.node`` (tiny random model, cheap decode settings) as a subprocess and is itself a
second ROS 2 participant playing camera driver, odometry source and route planner: a latched DrivingCommand
(re-published every second, as a route planner does, so it never goes stale), and at ``--rate`` Hz an Odometry then
an rgb8 Image with the same wall-clock stamp (the image best effort, depth 1: sensor-data QoS, as a camera driver
publishes). Both processes load the package's Fast DDS profile (config/fastdds.xml: a 16 MB shared-memory segment)
through FASTDDS_DEFAULT_PROFILES_FILE unless ``--no-profile``, all traffic stays on loopback
(ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST) in a domain of its own.

``--compare-side-tasks`` runs the whole bench twice in one invocation, the node's side tasks off (detect_hz and
describe_hz 0: plans only) and on (``--detect-hz``, ``--describe-hz``), both with ``--deadline-ms``, and prints the
plans' frame-to-plan latency and late count side by side with the side tasks' rates, skips and the plans they delayed:
the scheduler's rule (``wamdiff_ros/ros/schedule.py``) measured.

Phases: wait for "active" on /diagnostics and for the topics to match; warm-up (``--warmup`` s); a 1 s pause to
drain, then the node's ``frames`` counter (F0, from a diagnostics message stamped after the pause) and the bench's
published count (P0); ``--seconds`` s of publishing; a 1 s pause; F1, P1. Delivered = (F1 - F0) / (P1 - P0): the
share of published images the node received. Frame-to-plan latency is measured here as the PlannerOutput's receive
wall time minus its image stamp (both processes use the wall clock), over the plans of images published in the
measured phase; the node's own figures (inference, frame-to-plan, ROS overhead = image conversion plus publishing the
outputs) come from its last diagnostics (rolling windows of its last 200 plans). The node's RSS (VmRSS) is sampled
after the warm-up and at the end. The node is stopped with SIGINT.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

NODE = "/wamdiff_planner"
PACKAGE = "wamdiff_ros"
REPO_CONFIG = Path(__file__).resolve().parents[2] / "config"
NODE_PARAMS = ("-p", "model:=tiny-random", "-p", "block_size:=32", "-p", "steps:=4", "-p", "schedule:=static",
               "-p", "diagnostics_period_s:=0.5", "-p", "blackbox_dir:=none", "-p", "deadline_ms:=60000.0",
               "-p", "detect_hz:=0.0", "-p", "describe_hz:=0.0")  # plans only, unless the run asks for side tasks
SCHEDULER_KEYS = ("plan.", "detect.", "describe.", "answer.", "plans_delayed")
DRAIN_S = 1.0
COMMAND_PERIOD_S = 1.0
REPORTED = ("frames", "planned", "dropped", "skipped", "late", "fallback", "errors", "bad_input",
            "inference_p50_ms", "inference_p99_ms", "frame_to_plan_p50_ms", "frame_to_plan_p99_ms",
            "ros_overhead_p50_ms", "ros_overhead_p99_ms")


class BenchError(RuntimeError):
    pass


def config_file(name: str) -> Path:
    """config/<name>: the repository's when running from a checkout, else the installed share/wamdiff_ros/config."""
    candidates = [REPO_CONFIG / name]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(PACKAGE)) / "config" / name)
    except Exception:  # no ament index configured, or the package is not in it
        pass
    for prefix in (sys.prefix, os.environ.get("VIRTUAL_ENV", "")):
        if prefix:
            candidates.append(Path(prefix) / "share" / PACKAGE / "config" / name)
    for path in candidates:
        if path.is_file():
            return path
    raise BenchError(f"config/{name} not found (looked in {', '.join(str(p.parent) for p in candidates)})")


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc/<pid>/status (VmRSS), in MiB; NaN when unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _number(text: str):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def bench_environment(profile: bool, domain_id: int) -> dict:
    """Set this process's ROS environment (before rclpy.init, so its participant loads the profile) and return the
    environment for the node's process."""
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    if profile:
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(config_file("fastdds.xml"))
    else:
        os.environ.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    return dict(os.environ)


class Driver:
    """The bench's ROS 2 participant: camera, odometry and route planner; listens to plans and diagnostics."""

    def __init__(self, width: int, height: int, image: np.ndarray) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from nav_msgs.msg import Odometry
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
        from rclpy.signals import SignalHandlerOptions
        from sensor_msgs.msg import Image

        from wamdiff_ros.msg import DrivingCommand, PlannerOutput

        self._Odometry, self._Image, self._DrivingCommand = Odometry, Image, DrivingCommand
        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("wamdiff_bench_driver", context=self.context)
        n = self.node
        self.image_pub = n.create_publisher(Image, f"{NODE}/input/image", qos_profile_sensor_data)
        self.odom_pub = n.create_publisher(Odometry, f"{NODE}/input/odometry", 20)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.command_pub = n.create_publisher(DrivingCommand, f"{NODE}/input/command", latched)
        n.create_subscription(PlannerOutput, f"{NODE}/output/plan", self._on_plan, 50)
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.width, self.height = width, height
        self.data = np.ascontiguousarray(image, dtype=np.uint8).tobytes()
        self.plans: list[tuple[float, float]] = []  # (receive wall time, image stamp), seconds
        self.published = 0
        self.publish_s: list[float] = []  # time spent in one frame's two publish calls
        self.send_times: list[float] = []  # monotonic time of each image publish
        self._last_command = -math.inf
        self._diag_lock = threading.Condition()
        self.diagnostics: tuple[float, str, dict] | None = None  # (stamp, message, values) of the latest
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(n)
        self._spinner = threading.Thread(target=self._spin, name="bench-executor", daemon=True)
        self._spinner.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # the context was shut down under it
            pass

    # -- callbacks (executor thread) ------------------------------------------------------------------------------
    def _on_plan(self, msg) -> None:
        received = time.time()
        self.plans.append((received, msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9))

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.hardware_id != NODE.lstrip("/"):
                continue
            values = {kv.key: _number(kv.value) for kv in status.values}
            stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            with self._diag_lock:
                self.diagnostics = (stamp, status.message, values)
                self._diag_lock.notify_all()

    # -- waiting ------------------------------------------------------------------------------------------------
    def wait_diagnostics(self, predicate, timeout: float, alive=lambda: True) -> tuple[float, str, dict] | None:
        end = time.monotonic() + timeout
        with self._diag_lock:
            while True:
                d = self.diagnostics
                if d is not None and predicate(*d):
                    return d
                left = end - time.monotonic()
                if left <= 0 or not alive():
                    return None
                self._diag_lock.wait(min(left, 0.1))

    def wait_matched(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if (self.image_pub.get_subscription_count() >= 1 and self.odom_pub.get_subscription_count() >= 1
                    and self.command_pub.get_subscription_count() >= 1
                    and self.node.count_publishers(f"{NODE}/output/plan") >= 1):
                return True
            time.sleep(0.05)
        return False

    # -- publishing ---------------------------------------------------------------------------------------------
    def send_command(self, stamp_ns: int) -> None:
        msg = self._DrivingCommand(command=self._DrivingCommand.LANE_FOLLOW)
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        self.command_pub.publish(msg)

    def send_frame(self) -> None:
        """Odometry then the image, both stamped with the wall clock now (the node's clock is wall time)."""
        t0 = time.perf_counter()
        stamp_ns = time.time_ns()
        sec, nanosec = divmod(stamp_ns, 1_000_000_000)
        if time.monotonic() - self._last_command >= COMMAND_PERIOD_S:  # a route planner re-publishes its command
            self._last_command = time.monotonic()
            self.send_command(stamp_ns)
        odom = self._Odometry()
        odom.header.stamp.sec, odom.header.stamp.nanosec = sec, nanosec
        odom.header.frame_id, odom.child_frame_id = "odom", "base_link"
        odom.pose.pose.position.x = 6.0 * 0.05 * self.published  # 6 m/s along x
        odom.pose.pose.orientation.w = 1.0
        odom.twist.twist.linear.x = 6.0
        self.odom_pub.publish(odom)
        img = self._Image(height=self.height, width=self.width, encoding="rgb8", is_bigendian=0, step=self.width * 3)
        img.header.stamp.sec, img.header.stamp.nanosec = sec, nanosec
        img.header.frame_id = "camera"
        img.data = self.data  # bytes, never a list (see the notes on Kilted message classes)
        self.image_pub.publish(img)
        self.send_times.append(time.monotonic())
        self.published += 1
        self.publish_s.append(time.perf_counter() - t0)

    def publish_for(self, seconds: float, rate: float, bar: tqdm | None = None) -> float:
        """Publish at ``rate`` Hz on an absolute schedule for ``seconds``; a frame more than one period late is
        skipped (a camera does not catch up). Returns the elapsed seconds."""
        period = 1.0 / rate
        start = time.monotonic()
        end = start + seconds
        due = start
        shown = start
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if now < due:
                time.sleep(min(due, end) - now)
                continue
            self.send_frame()
            due += period
            late = time.monotonic() - due
            if late > period:
                due += period * math.floor(late / period)
            if bar is not None and now - shown >= 0.25:
                shown = now
                bar.n = min(now - start, seconds)
                bar.refresh()
        elapsed = time.monotonic() - start
        if bar is not None:
            bar.n = seconds
            bar.refresh()
        return elapsed

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._spinner.join(timeout=2.0)


def _test_image(width: int, height: int) -> np.ndarray:
    """The bundled road image resized to the camera's size (content does not matter for transport)."""
    from PIL import Image as PILImage

    from wamdiff_ros.cli import sample_image_path

    with PILImage.open(sample_image_path()) as img:
        return np.asarray(img.convert("RGB").resize((width, height), PILImage.BILINEAR))


def run(seconds: float = 60.0, rate: float = 20.0, width: int = 640, height: int = 480, warmup: float = 2.0,
        profile: bool = True, domain_id: int | None = None, threads: int | None = None,
        node_log: str | None = None, startup_timeout: float = 120.0, progress: bool = True,
        node_params: tuple[str, ...] = ()) -> dict:
    """``node_params``: more ``-p name:=value`` arguments for the node (they override NODE_PARAMS)."""
    domain_id = 60 + os.getpid() % 40 if domain_id is None else domain_id
    env = bench_environment(profile, domain_id)  # before any participant exists
    profile_file = env.get("FASTDDS_DEFAULT_PROFILES_FILE")
    image = _test_image(width, height)
    log_path = Path(node_log) if node_log else Path(tempfile.mkstemp(prefix="wamdiff-bench-node-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "wamdiff_ros.ros.node", "--autostart", "--ros-args",
           "--params-file", str(config_file("planner.yaml")), *NODE_PARAMS,
           *(["-p", f"torch_threads:={threads}"] if threads is not None else []), *node_params]
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    driver = None

    def alive() -> bool:
        return proc.poll() is None

    def fail(what: str) -> BenchError:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        return BenchError(f"{what} (node exit code {proc.poll()}); node log {log_path}:\n{tail}")

    try:
        driver = Driver(width, height, image)
        if driver.wait_diagnostics(lambda s, m, v: m.startswith("active"), startup_timeout, alive) is None:
            raise fail("the node did not report 'active'")
        driver.send_command(time.time_ns())
        if not driver.wait_matched(30.0):
            raise fail("the bench's topics did not match the node's")

        def drain_and_read() -> tuple[int, dict, float]:
            """Pause, then the first diagnostics stamped after the pause, the published count and the node's RSS."""
            until = time.time() + DRAIN_S
            time.sleep(DRAIN_S)
            d = driver.wait_diagnostics(lambda s, m, v: s >= until, 10.0, alive)
            if d is None:
                raise fail("no diagnostics after the pause")
            return driver.published, d[2], rss_mb(proc.pid)

        driver.publish_for(warmup, rate)
        p0, diag0, rss0 = drain_and_read()
        plans0 = len(driver.plans)
        sends0 = len(driver.send_times)
        t_start = time.time()
        bar = tqdm(total=seconds, desc="node bench", unit="s", file=sys.stderr, disable=not progress,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} s [{elapsed}<{remaining}]")
        elapsed = driver.publish_for(seconds, rate, bar)
        t_end = time.time()
        bar.close()
        p1, diag1, rss1 = drain_and_read()
        if not alive():
            raise fail("the node died during the run")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if driver is not None:
            driver.close()
    if not node_log:  # kept only when the run failed (the error names it) or when asked for
        log_path.unlink(missing_ok=True)

    published = p1 - p0
    delivered = diag1["frames"] - diag0["frames"]
    sends = np.asarray(driver.send_times[sends0:sends0 + published])
    intervals_ms = np.diff(sends) * 1e3
    measured = [(r, s) for r, s in driver.plans[plans0:] if t_start <= s <= t_end]
    latency_ms = [1e3 * (r - s) for r, s in measured]
    publish_ms = 1e3 * np.asarray(driver.publish_s[-published:]) if published else np.array([])
    node = {k: diag1.get(k) for k in REPORTED}
    node.update({k: v for k, v in diag1.items() if k.startswith("skipped.")})  # the reasons, as the node counts them
    node.update({k: v for k, v in diag1.items() if k.startswith(SCHEDULER_KEYS)})
    node.update({f"{k}_measured": diag1[k] - diag0[k] for k in ("frames", "planned", "dropped", "skipped")
                 if isinstance(diag1.get(k), int) and isinstance(diag0.get(k), int)})
    return {
        "seconds": seconds,
        "rate_hz": rate,
        "width": width,
        "height": height,
        "image_bytes": width * height * 3,
        "frames_published": published,
        "frames_delivered": delivered,
        "frames_delivered_pct": 100.0 * delivered / published if published else float("nan"),
        "publish_rate_hz": published / elapsed if elapsed > 0 else float("nan"),
        "publish_interval_ms": {"p50": _pct(intervals_ms, 50), "p99": _pct(intervals_ms, 99)},
        "publish_call_ms": {"p50": _pct(publish_ms, 50), "p99": _pct(publish_ms, 99)},
        "plans": len(measured),
        "plans_per_s": len(measured) / elapsed if elapsed > 0 else float("nan"),
        "frame_to_plan_ms": {"p50": _pct(latency_ms, 50), "p99": _pct(latency_ms, 99)},
        "node": node,
        "ros_overhead_ms": {"p50": diag1.get("ros_overhead_p50_ms"), "p99": diag1.get("ros_overhead_p99_ms")},
        "rss_mb": {"start": rss0, "end": rss1, "growth_pct": 100.0 * (rss1 - rss0) / rss0 if rss0 else float("nan")},
        "profile": bool(profile),
        "profile_file": profile_file,
        "domain_id": domain_id,
        "node_threads": threads,
        "cpus": os.cpu_count(),
    }


def table(r: dict) -> str:
    n = r["node"]
    f2p, ovh = r["frame_to_plan_ms"], r["ros_overhead_ms"]
    prof = f"Fast DDS profile {r['profile_file']}" if r["profile"] else "no Fast DDS profile (built-in transports)"
    rows = [
        ("frames published", f"{r['frames_published']} in {r['seconds']:g} s "
                             f"(target {r['rate_hz']:g} Hz, achieved {r['publish_rate_hz']:.2f} Hz)"),
        ("publish interval p50 / p99", f"{r['publish_interval_ms']['p50']:.2f} / "
                                       f"{r['publish_interval_ms']['p99']:.2f} ms"),
        ("publish call p50 / p99", f"{r['publish_call_ms']['p50']:.2f} / {r['publish_call_ms']['p99']:.2f} ms "
                                   "(odometry + image)"),
        ("frames delivered", f"{r['frames_delivered_pct']:.1f} % ({r['frames_delivered']} of {r['frames_published']})"),
        ("plans", f"{r['plans']} ({r['plans_per_s']:.2f} plans/s; node dropped "
                  f"{n.get('dropped_measured', '?')} frames for newer ones)"),
        ("frame->plan p50 / p99 (bench)", f"{f2p['p50']:.1f} / {f2p['p99']:.1f} ms"),
        ("frame->plan p50 / p99 (node)", f"{n['frame_to_plan_p50_ms']} / {n['frame_to_plan_p99_ms']} ms"),
        ("inference p50 / p99 (node)", f"{n['inference_p50_ms']} / {n['inference_p99_ms']} ms"),
        ("ROS overhead p50 / p99 (node)", f"{ovh['p50']} / {ovh['p99']} ms (image conversion + output publishing)"),
        ("node RSS start / end", f"{r['rss_mb']['start']:.1f} / {r['rss_mb']['end']:.1f} MiB "
                                 f"({r['rss_mb']['growth_pct']:+.2f} %)"),
        ("node counters", f"skipped {n['skipped']}, late {n['late']}, fallback {n['fallback']}, "
                          f"errors {n['errors']}, bad input {n['bad_input']}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"node benchmark: {r['width']}x{r['height']} rgb8 ({r['image_bytes'] / 1e3:.0f} KB) best effort at "
             f"{r['rate_hz']:g} Hz, {prof}, {r['cpus']} CPUs",
             f"| {'metric':<{width}} | value",
             f"|{'-' * (width + 2)}|{'-' * 60}"]
    lines += [f"| {k:<{width}} | {v}" for k, v in rows]
    return "\n".join(lines)


def side_task_table(off: dict, on: dict, deadline_ms: float) -> str:
    """The two runs of ``--compare-side-tasks`` side by side."""
    rows = [("plans per s", lambda r: f"{r['plans_per_s']:.2f}"),
            ("frame->plan p50 / p99 (bench)",
             lambda r: f"{r['frame_to_plan_ms']['p50']:.1f} / {r['frame_to_plan_ms']['p99']:.1f} ms"),
            ("late plans / fallbacks (node)", lambda r: f"{r['node']['late']} / {r['node']['fallback']}"),
            ("frames dropped for newer ones", lambda r: f"{r['node'].get('dropped_measured', '?')}"),
            ("detect: rate, p50 / p99, skips", lambda r: _task(r, "detect")),
            ("describe: rate, p50 / p99, skips", lambda r: _task(r, "describe")),
            ("plans delayed by a side task", lambda r: f"{r['node'].get('plans_delayed_by_side_tasks', 0)} "
                                                       f"(late: {r['node'].get('plans_delayed_and_late', 0)})")]
    width = max(len(k) for k, _ in rows)
    lines = [f"side tasks off vs on, deadline {deadline_ms:g} ms, {on['width']}x{on['height']} at {on['rate_hz']:g} Hz",
             f"| {'metric':<{width}} | side tasks off | side tasks on", f"|{'-' * (width + 2)}|{'-' * 16}|{'-' * 40}"]
    lines += [f"| {k:<{width}} | {f(off)} | {f(on)}" for k, f in rows]
    p99_off, p99_on = off["frame_to_plan_ms"]["p99"], on["frame_to_plan_ms"]["p99"]
    lines.append(f"frame->plan p99, on / off: {p99_on / p99_off:.2f}x")
    return "\n".join(lines)


def _task(r: dict, name: str) -> str:
    n = r["node"]
    if not n.get(f"{name}.runs"):
        return "off"
    return (f"{n.get(f'{name}.rate_hz')} Hz, {n.get(f'{name}.p50_ms')} / {n.get(f'{name}.p99_ms')} ms, "
            f"{n.get(f'{name}.skips')} skips")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench node", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="measured publishing time (default 60)")
    p.add_argument("--rate", type=float, default=20.0, help="camera rate in Hz (default 20)")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of publishing before the measurement")
    p.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON")
    p.add_argument("--no-profile", action="store_true",
                   help="do not load config/fastdds.xml (Fast DDS built-in transports) in either process")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: 60 + pid %% 40)")
    p.add_argument("--threads", type=int, default=None,
                   help="the node's torch_threads parameter (default: the node's, all cores but one)")
    p.add_argument("--node-log", default=None, help="where the node's output goes (default: a temporary file)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--compare-side-tasks", action="store_true",
                   help="run twice: the node's side tasks off, then on (--detect-hz, --describe-hz), side by side")
    p.add_argument("--detect-hz", type=float, default=2.0, help="with --compare-side-tasks (default 2)")
    p.add_argument("--describe-hz", type=float, default=1.0, help="with --compare-side-tasks (default 1)")
    p.add_argument("--deadline-ms", type=float, default=None, help="the node's deadline_ms (default: 60000, none)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rate <= 0 or args.width <= 0 or args.height <= 0 or args.warmup < 0:
        p.error("--seconds, --rate, --width and --height must be positive, --warmup >= 0")
    deadline = ("-p", f"deadline_ms:={args.deadline_ms}") if args.deadline_ms is not None else ()
    variants = {"": deadline}
    if args.compare_side_tasks:
        variants = {"off": deadline, "on": (*deadline, "-p", f"detect_hz:={args.detect_hz}",
                                            "-p", f"describe_hz:={args.describe_hz}")}
    results = {}
    try:
        for name, params in variants.items():
            results[name] = run(args.seconds, args.rate, args.width, args.height, args.warmup,
                                profile=not args.no_profile, domain_id=args.domain_id, threads=args.threads,
                                node_log=args.node_log, progress=not args.no_progress, node_params=params)
            print((f"side tasks {name}: " if name else "") + table(results[name]))
    except BenchError as exc:
        print(f"wamdiff-bench node: {exc}", file=sys.stderr)
        return 1
    if args.compare_side_tasks:
        print(side_task_table(results["off"], results["on"], args.deadline_ms or 60000.0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results.get("", results), f, indent=2)
    return 0
