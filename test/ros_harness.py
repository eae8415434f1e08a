"""A second ROS 2 participant for the node tests: runs the planner node in its own process, feeds it, listens."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry, Path as PathMsg
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import String

import wamdiff_ros.msg as msgs
from wamdiff_ros.cli import load_rgb, sample_image_path
from wamdiff_ros.ros.conversions import quaternion_from_yaw, rgb_to_image, to_time

NODE = "/wamdiff_planner"
ROOT = Path(__file__).resolve().parents[1]
FAST = ["-p", "block_size:=32", "-p", "steps:=4", "-p", "schedule:=static", "-p", "deadline_ms:=30000.0",
        "-p", "diagnostics_period_s:=0.5", "-p", "implausible_action:=publish"]  # mechanics, not plausibility


def ros_environment() -> dict:
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["ROS_DOMAIN_ID"] = str(100 + os.getpid() % 100)
    os.environ.update({k: env[k] for k in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_DOMAIN_ID")})
    return env


class NodeProcess:
    def __init__(self, log: Path, *ros_args: str, autostart: bool = True) -> None:
        cmd = [sys.executable, "-m", "wamdiff_ros.ros.node"] + (["--autostart"] if autostart else [])
        cmd += ["--ros-args", "--params-file", str(ROOT / "config" / "planner.yaml"), *ros_args]
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, env={**ros_environment(), "OMP_NUM_THREADS": "1"}, stdout=out,
                                         stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Harness:
    def __init__(self) -> None:
        rclpy.init()
        self.node = rclpy.create_node("wamdiff_test_driver")
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        n = self.node
        self.image_pub = n.create_publisher(Image, f"{NODE}/input/image", 1)
        from sensor_msgs.msg import CompressedImage

        self.compressed_pub = n.create_publisher(CompressedImage, f"{NODE}/input/image/compressed", 1)
        self.odom_pub = n.create_publisher(Odometry, f"{NODE}/input/odometry", 10)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.command_pub = n.create_publisher(msgs.DrivingCommand, f"{NODE}/input/command", latched)
        self.plans: list = []
        self.paths: list = []
        self.diagnostics: list = []
        self.answers: list = []
        self.question_pub = n.create_publisher(String, f"{NODE}/input/question", 10)
        n.create_subscription(String, f"{NODE}/output/answer", self.answers.append, 10)
        n.create_subscription(msgs.PlannerOutput, f"{NODE}/output/plan", self.plans.append, 10)
        n.create_subscription(PathMsg, f"{NODE}/output/path", self.paths.append, 10)
        n.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        self.image = load_rgb(sample_image_path())
        self.command: int | None = None
        self.t = 1000.0

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)

    def wait_for(self, predicate, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if predicate():
                return True
            self.executor.spin_once(timeout_sec=0.05)
        return predicate()

    def call(self, srv_type, name: str, request, seconds: float = 20.0):
        client = self.node.create_client(srv_type, name)
        assert client.wait_for_service(timeout_sec=seconds), name
        future = client.call_async(request)
        assert self.wait_for(future.done, seconds), name
        self.node.destroy_client(client)
        return future.result()

    def send_command(self, value: int) -> None:
        self.command = value
        msg = msgs.DrivingCommand(command=value)
        msg.header.stamp = self.node.get_clock().now().to_msg()
        self.command_pub.publish(msg)

    def send_frame(self, image_msg=None, odom_ok: bool = True, stamp: float | None = None, topic: str = "image") -> float:
        """Odometry then an image with the same stamp (the node's clock is wall time here)."""
        stamp = self.node.get_clock().now().nanoseconds * 1e-9 if stamp is None else stamp
        if self.command is not None:  # a route planner re-publishes its command; a stale one is refused
            self.send_command(self.command)
        odom = Odometry()
        odom.header.stamp = to_time(stamp)
        odom.header.frame_id, odom.child_frame_id = "odom", "base_link"
        odom.pose.pose.position.x = 0.1 * len(self.plans)
        odom.pose.pose.orientation = quaternion_from_yaw(0.0)
        odom.twist.twist.linear.x = 6.0 if odom_ok else float("nan")
        self.odom_pub.publish(odom)
        self.spin(0.1)  # the odometry must be there before the image, or the node rightly skips the cycle
        img = image_msg or rgb_to_image(self.image, stamp, "camera")
        img.header.stamp = to_time(stamp)
        (self.compressed_pub if topic == "compressed" else self.image_pub).publish(img)
        return stamp

    def close(self) -> None:
        self.node.destroy_node()
        rclpy.shutdown()


def start(h: Harness, node: NodeProcess, status: str = "active", seconds: float = 120.0) -> None:
    ok = h.wait_for(lambda: any(s.message.startswith(status) for d in h.diagnostics for s in d.status)
                    or node.proc.poll() is not None, seconds)
    assert ok and node.proc.poll() is None, node.log.read_text()


def stamp_of(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def plan_for(h: Harness, stamp: float, seconds: float = 60.0):
    h.wait_for(lambda: any(abs(stamp_of(p) - stamp) < 1e-6 for p in h.plans), seconds)
    found = [p for p in h.plans if abs(stamp_of(p) - stamp) < 1e-6]
    return found[0] if found else None


def round_trip(h: Harness, tries: int = 5, seconds: float = 20.0, **frame_kwargs):
    """Publish a frame and wait for its plan; best-effort images may be lost, so try a few times."""
    for _ in range(tries):
        stamp = h.send_frame(**frame_kwargs)
        plan = plan_for(h, stamp, seconds)
        if plan is not None:
            return stamp, plan
    return None, None


def set_param(h: Harness, name: str, value) -> bool:
    if isinstance(value, bool):
        pv = ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value)
    elif isinstance(value, int):
        pv = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
    elif isinstance(value, float):
        pv = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
    else:
        pv = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)
    res = h.call(SetParameters, f"{NODE}/set_parameters",
                 SetParameters.Request(parameters=[Parameter(name=name, value=pv)]))
    return res.results[0].successful


def diagnostics_values(h: Harness, seconds: float = 5.0) -> dict:
    h.diagnostics.clear()
    assert h.wait_for(lambda: bool(h.diagnostics), seconds)
    status = h.diagnostics[-1].status[0]
    return {"level": status.level, "message": status.message, **{kv.key: kv.value for kv in status.values}}
