"""Launch files: checked statically everywhere; launched where the ROS 2 tools are installed.

PyPI has no ``launch`` / ``launch_ros`` / ``ros2`` CLI: ``make setup`` installs them into .venv from
../shared/vendor/ros2 where that folder exists (CI has it; scripts/install_ros2_tools.sh), and a ROS install has them.
There the launch tests run README's ``ros2 launch wamdiff_ros planner.launch.py ...`` lines verbatim (with the
environment README's set-up line gives: AMENT_PREFIX_PATH naming the venv's prefix, its bin/ first on PATH) and check
them with the ros2 CLI (``--no-daemon``): the node reaches *active*, a plan comes for frames on the remapped inputs,
``params_file:=`` replaces the parameter file, ``ros2 param set`` on a live parameter changes the next plan;
``bench2drive.launch.py`` started as Bench2Drive starts it brings up the planner, the adapter and the control node,
``/carla/hero/status`` turns true and a tick is answered; ``ros2 interface show`` shows the package's messages.
Without the tools they skip, saying so. Every launch and CLI call has a timeout; launches are stopped by their process
group (SIGINT, then SIGKILL)."""

import ast
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def _console_scripts() -> set[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    scripts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "=" in node.value and ":" in node.value:
            scripts.add(node.value.split("=")[0].strip())
    return scripts


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def _kw(call: ast.Call, key: str):
    for kw in call.keywords:
        if kw.arg == key:
            return kw.value
    return None


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_is_consistent(path):
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    nodes = _calls(tree, "LifecycleNode") + _calls(tree, "Node")
    assert nodes, "no node started"
    scripts = _console_scripts()
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for call in nodes:
        package, executable = _kw(call, "package"), _kw(call, "executable")
        assert package.value == "wamdiff_ros"
        assert executable.value in scripts, f"{executable.value} is not a console script"
        assert executable.value in cmake, f"{executable.value} is not installed into lib/wamdiff_ros by CMake"
    # every file under the package share it names exists in the repository
    for const in (n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)):
        if re.fullmatch(r"[\w.-]+\.(yaml|xml)", const.value):
            assert (ROOT / "config" / const.value).is_file(), const.value
    # the launch arguments it declares are exactly the ones it uses
    declared = set(_module_dicts(tree)["ARGUMENTS"])
    used = _used_arguments(tree)
    assert used <= declared, f"used, not declared: {used - declared}"
    assert declared <= used, f"declared, never used: {declared - used}"


def _module_dicts(tree: ast.Module) -> dict[str, dict]:
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Dict):
            out[n.targets[0].id] = {ast.literal_eval(k): None for k in n.value.keys}
    return out


def _used_arguments(tree: ast.Module) -> set[str]:
    """Names read with ``LaunchConfiguration(...)`` / ``arg(...)``: constants, and the keys of a module-level dict a
    comprehension reads them from (``{name: arg(name) for name, kind in TYPES.items()}``)."""
    dicts, used = _module_dicts(tree), set()
    for c in ast.walk(tree):
        if isinstance(c, ast.Call) and getattr(c.func, "id", None) in ("LaunchConfiguration", "arg") and c.args:
            if isinstance(c.args[0], ast.Constant):
                used.add(c.args[0].value)
    for comp in (n for n in ast.walk(tree) if isinstance(n, (ast.DictComp, ast.ListComp, ast.SetComp))):
        names = {c.args[0].id for c in ast.walk(comp) if isinstance(c, ast.Call) and c.args
                 and getattr(c.func, "id", None) in ("LaunchConfiguration", "arg") and isinstance(c.args[0], ast.Name)}
        for gen in comp.generators:
            called = isinstance(gen.iter, ast.Call) and isinstance(gen.iter.func, ast.Attribute)
            source = gen.iter.func.value if called else gen.iter
            targets = {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
            if names & targets and isinstance(source, ast.Name) and source.id in dicts:
                used |= set(dicts[source.id])
    return used


def test_fastdds_profile_enlarges_the_shared_memory_segment():
    text = (ROOT / "config" / "fastdds.xml").read_text()
    size = int(re.search(r"<segment_size>(\d+)</segment_size>", text).group(1))
    assert size >= 4 * 640 * 480 * 3


@pytest.mark.skipif(importlib.util.find_spec("launch") is None or importlib.util.find_spec("launch_ros") is None,
                    reason="ROS 2 launch is not installed (not on PyPI: make setup installs it from "
                           "../shared/vendor/ros2 where it exists; a ROS install has it)")
@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_description_builds(path, monkeypatch):
    monkeypatch.setenv("AMENT_PREFIX_PATH", launch_environment()["AMENT_PREFIX_PATH"])  # as README's set-up line
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generate_launch_description().entities


def test_installed_prefix_holds_every_launched_executable(monkeypatch):
    import os
    import sys

    ament = pytest.importorskip("ament_index_python.packages", reason="ament_index_python not installed")
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join(prefixes + [sys.prefix]))  # make setup's prefix
    try:
        prefix = ament.get_package_prefix("wamdiff_ros")
    except ament.PackageNotFoundError:
        pytest.skip("wamdiff_ros is not installed into an ament prefix (make setup / colcon build)")

    for path in LAUNCH_FILES:
        for call in _calls(ast.parse(path.read_text()), "LifecycleNode") + _calls(ast.parse(path.read_text()), "Node"):
            exe = Path(prefix) / "lib" / "wamdiff_ros" / _kw(call, "executable").value
            assert exe.is_file() and os.access(exe, os.X_OK), exe


def test_rviz_config_shows_the_nodes_outputs_and_is_installed():
    config = yaml.safe_load((ROOT / "rviz" / "wamdiff.rviz").read_text())["Visualization Manager"]
    topics = {d["Topic"]["Value"] for d in config["Displays"] if "Topic" in d}
    node = "".join((ROOT / "wamdiff_ros" / "ros" / name).read_text() for name in ("node.py", "outputs.py"))
    for topic in topics:  # a topic the node publishes (outputs.py holds its publishers)
        assert topic.startswith("/wamdiff_planner/") and f'"~/{topic.split("/", 2)[2]}"' in node, topic
    assert {"/wamdiff_planner/output/path", "/wamdiff_planner/debug/markers", "/wamdiff_planner/debug/image"} <= topics
    assert config["Global Options"]["Fixed Frame"] == "odom"
    assert re.search(r"install\(DIRECTORY [^)]*\brviz\b", (ROOT / "CMakeLists.txt").read_text())


def test_an_included_launch_file_gets_only_arguments_it_declares():
    """bench2drive.launch.py includes planner.launch.py: every launch argument it passes is one that file declares."""
    tree = ast.parse((ROOT / "launch" / "bench2drive.launch.py").read_text())
    (include,) = _calls(tree, "IncludeLaunchDescription")
    passed = {k.value for k in _kw(include, "launch_arguments").func.value.keys}
    declared = set(_module_dicts(ast.parse((ROOT / "launch" / "planner.launch.py").read_text()))["ARGUMENTS"])
    assert passed and passed <= declared, passed - declared


# ---------------------------------------------------------------------------------------------------------------------
# launched: README's lines, the Bench2Drive launch file, the ros2 CLI

README = ROOT / "README.md"
ROS2 = Path(sys.prefix) / "bin" / "ros2"
NODE = "/wamdiff_planner"


def _tools_missing() -> str:
    """Why the launch tests cannot run here ('' when they can)."""
    if importlib.util.find_spec("launch") is None or importlib.util.find_spec("launch_ros") is None \
            or not ROS2.is_file():
        return ("the ROS 2 launch tools are not installed in this venv (not on PyPI: make setup installs them from "
                "../shared/vendor/ros2 where it exists; a ROS install has them)")
    if not (Path(sys.prefix) / "share" / "wamdiff_ros" / "launch" / "planner.launch.py").is_file():
        return "wamdiff_ros is not installed into the venv's ament prefix (make setup)"
    return ""


needs_tools = pytest.mark.skipif(bool(_tools_missing()), reason=_tools_missing() or "-")


def readme_launch_lines(launch_file: str = "planner.launch.py") -> list[str]:
    """README's ``ros2 launch wamdiff_ros <launch_file> ...`` command lines (in its bash blocks), comments cut."""
    lines, in_bash = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_bash = line.strip() in ("```bash", "```sh", "```shell")
            continue
        command = line.split(" #")[0].strip()
        if in_bash and command.startswith(f"ros2 launch wamdiff_ros {launch_file}"):
            lines.append(command)
    return lines


def test_readme_has_runnable_launch_lines():
    lines = readme_launch_lines()
    assert lines, "README shows no `ros2 launch wamdiff_ros planner.launch.py` line"
    assert any("params_file:=" in line for line in lines), "README shows no params_file:= line"
    assert any("image:=" in line and "odometry:=" in line for line in lines), "README shows no remapping line"
    declared = set(_module_dicts(ast.parse((ROOT / "launch" / "planner.launch.py").read_text()))["ARGUMENTS"])
    for line in lines:
        for arg in shlex.split(line)[4:]:
            name, sep, value = arg.partition(":=")
            assert sep and name in declared, f"{line}: {arg} is not one of the launch file's arguments"
            assert "/path/to" not in value, f"{line}: a placeholder, not a line that runs"


def _worker_domain(base: int) -> str:
    """Domains 1-2 (launch tests) and 3-4 (test_bench2drive_ros's contract): no other test's; one per xdist worker."""
    return str(base + int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 2)


def launch_environment() -> dict:
    """What README's set-up line gives (a ROS install: its setup.bash): the venv's prefix for ament, its bin/ first
    (the node executables start with ``#!/usr/bin/env python3``); loopback discovery, a domain of its own."""
    env = dict(os.environ)
    env["AMENT_PREFIX_PATH"] = os.pathsep.join([sys.prefix] + [p for p in env.get("AMENT_PREFIX_PATH", "").split(
        os.pathsep) if p and p != sys.prefix])
    env["PATH"] = str(Path(sys.prefix) / "bin") + os.pathsep + env.get("PATH", "")
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_DOMAIN_ID=_worker_domain(1), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    return env


class Launched:
    """``ros2 launch ...`` in its own process group, its output in ``log``."""

    def __init__(self, command: str, cwd: Path, log: Path, env: dict) -> None:
        self.command, self.log, self.env, self.cwd = command, log, env, cwd
        with open(log, "w") as out:
            self.proc = subprocess.Popen(shlex.split(command), cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def ros2(self, *args: str, timeout: float = 60.0) -> str:
        """A ros2 CLI verb (without the daemon); its output."""
        result = subprocess.run([str(ROS2), *args, "--no-daemon"], cwd=self.cwd, env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        return result.stdout + result.stderr

    def wait_active(self, seconds: float = 150.0) -> None:
        end, state = time.monotonic() + seconds, ""
        while time.monotonic() < end and self.proc.poll() is None:
            state = self.ros2("lifecycle", "get", NODE)
            if state.startswith("active"):
                return
            time.sleep(1.0)
        raise AssertionError(f"{self.command}: not active ({state!r})\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


class Feeder:
    """An rclpy participant in the launch's domain: odometry, command and camera frames on the given topics, the
    planner's plans."""

    def __init__(self, env: dict, image: str, odometry: str, command: str) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from nav_msgs.msg import Odometry
        from sensor_msgs.msg import Image

        import wamdiff_ros.msg as msgs
        from wamdiff_ros.cli import load_rgb, sample_image_path

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=int(env["ROS_DOMAIN_ID"]))
        self.node = rclpy.create_node("wamdiff_launch_test", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.image_pub = self.node.create_publisher(Image, image, 1)
        self.odom_pub = self.node.create_publisher(Odometry, odometry, 10)
        self.command_pub = self.node.create_publisher(msgs.DrivingCommand, command, latched)
        self.plans: list = []
        self.node.create_subscription(msgs.PlannerOutput, f"{NODE}/output/plan", self.plans.append, 10)
        self.rgb = load_rgb(sample_image_path())

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)

    def plan(self, seconds: float = 60.0):
        """Frames (odometry, command, then the image, one stamp) until a plan for one of them comes."""
        from nav_msgs.msg import Odometry

        import wamdiff_ros.msg as msgs
        from wamdiff_ros.ros.conversions import quaternion_from_yaw, rgb_to_image, to_time

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            stamp = self.node.get_clock().now().nanoseconds * 1e-9
            command = msgs.DrivingCommand(command=msgs.DrivingCommand.LANE_FOLLOW)
            command.header.stamp = to_time(stamp)
            self.command_pub.publish(command)
            odom = Odometry()
            odom.header.stamp, odom.header.frame_id, odom.child_frame_id = to_time(stamp), "odom", "base_link"
            odom.pose.pose.orientation = quaternion_from_yaw(0.0)
            odom.twist.twist.linear.x = 6.0
            self.odom_pub.publish(odom)
            self.spin(0.1)
            self.image_pub.publish(rgb_to_image(self.rgb, stamp, "camera"))
            wait = time.monotonic() + 3.0
            while time.monotonic() < wait:
                self.spin(0.05)
                for p in self.plans:
                    if abs(p.header.stamp.sec + p.header.stamp.nanosec * 1e-9 - stamp) < 1e-6:
                        return p
        return None

    def close(self) -> None:
        import rclpy

        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def _topics(line: str) -> dict:
    """The line's remaps, else the launch file's defaults."""
    defaults = {"image": "/camera/front/image_raw", "odometry": "/odom", "command": "/route/command"}
    given = dict(a.split(":=", 1) for a in shlex.split(line)[4:] if ":=" in a)
    return {k: given.get(k, v) for k, v in defaults.items()}


@pytest.mark.ros
@needs_tools
@pytest.mark.timeout(400)
@pytest.mark.parametrize("line", readme_launch_lines() or ["(none)"])
def test_readme_launch_line_runs_verbatim(line, tmp_path):
    """The README line, as a user types it (in a folder holding the parameter file it names): active, a plan for
    frames on its topics; its params_file replaces the package's; ``ros2 param set`` changes the next plan."""
    assert line != "(none)", "README shows no `ros2 launch wamdiff_ros planner.launch.py` line"
    params = re.search(r"params_file:=(\S+)", line)
    if params:  # the user's copy of config/planner.yaml, edited: a smaller block
        text = (ROOT / "config" / "planner.yaml").read_text()
        text, n = re.subn(r"(?m)^(\s+block_size:\s*)\d+", r"\g<1>16", text)
        assert n == 1
        (tmp_path / params.group(1)).write_text(text)
    env = launch_environment()
    launched = Launched(line, tmp_path, tmp_path / "launch.log", env)
    feeder = None
    try:
        launched.wait_active()
        topics = _topics(line)
        feeder = Feeder(env, **topics)
        plan = feeder.plan()
        assert plan is not None, f"no plan for frames on {topics}\n{launched.log.read_text()[-4000:]}"
        if params:
            out = launched.ros2("param", "get", NODE, "block_size", "--timeout", "20")
            assert plan.block_size == 16 and "Integer value is: 16" in out, out
        else:
            assert plan.block_size == 32
            out = launched.ros2("param", "set", NODE, "block_size", "8", "--timeout", "20")  # discovery: 20 s
            assert "Set parameter successful" in out, out
            feeder.plans.clear()
            plan = feeder.plan()
            assert plan is not None and plan.block_size == 8, "ros2 param set block_size 8 did not take effect"
    finally:
        if feeder is not None:
            feeder.close()
        launched.stop()
    assert launched.proc.returncode is not None


@pytest.mark.ros
@needs_tools
@pytest.mark.timeout(400)
def test_bench2drive_launch_file_as_bench2drive_starts_it(tmp_path):
    """``ros2 launch wamdiff_ros bench2drive.launch.py k:=v ...`` built from the ROS2Agent's entry point as
    Bench2Drive's launcher builds it: the three nodes come up, ``/carla/hero/status`` turns true (the planner is
    active), and one tick's sensor messages get one control stamped with that tick."""
    sys.path.insert(0, str(ROOT / "test"))
    from bench2drive_stand_in import import_ros2_agent

    module = import_ros2_agent()
    agent = module.WamDiffROS2Agent.__new__(module.WamDiffROS2Agent)  # its __init__ would start the launch itself
    entry = agent.get_ros_entrypoint()
    command = " ".join(["ros2 launch", entry["package"], entry["launch_file"],
                        " ".join(f"{k}:={v}" for k, v in entry["parameters"].items())])
    env = launch_environment()
    launched = Launched(command, tmp_path, tmp_path / "launch.log", env)
    try:
        _bench2drive_round_trip(env, launched)
        nodes = launched.ros2("node", "list", "--spin-time", "5")  # without the daemon: wait for discovery
        for node in ("/wamdiff_planner", "/wamdiff_bench2drive_adapter", "/wamdiff_carla_control"):
            assert node in nodes.split(), nodes
    finally:
        launched.stop()


def _bench2drive_round_trip(env: dict, launched: Launched) -> None:
    import rclpy
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import Pose
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Imu, NavSatFix
    from std_msgs.msg import Bool

    carla_msgs = pytest.importorskip("carla_msgs.msg", reason="carla_msgs is not installed")
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=int(env["ROS_DOMAIN_ID"]))
    node = rclpy.create_node("fake_bench2drive", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    status, controls = [], []
    node.create_subscription(Bool, "/carla/hero/status", lambda m: status.append(m.data), latched)
    node.create_subscription(carla_msgs.CarlaEgoVehicleControl, "/carla/hero/vehicle_control_cmd", controls.append,
                             QoSProfile(depth=1))
    route_pub = node.create_publisher(carla_msgs.CarlaRoute, "/carla/hero/global_plan", latched)
    pubs = [node.create_publisher(Clock, "/clock", 10), node.create_publisher(Imu, "/carla/hero/imu", 10),
            node.create_publisher(NavSatFix, "/carla/hero/gnss", 10),
            node.create_publisher(carla_msgs.CarlaSpeedometer, "/carla/hero/speed", 10)]

    def spin_until(predicate, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not predicate() and launched.proc.poll() is None:
            executor.spin_once(timeout_sec=0.05)
        return predicate()

    try:
        assert spin_until(lambda: bool(status), 150.0), launched.log.read_text()[-4000:]
        assert all(status)
        route = carla_msgs.CarlaRoute()
        for x in (0.0, 50.0):
            pose = Pose()
            pose.position.x, pose.orientation.w = x, 1.0
            route.poses.append(pose)
            route.road_options.append(carla_msgs.CarlaRoute.LANEFOLLOW)
        route_pub.publish(route)
        assert spin_until(lambda: all(p.get_subscription_count() for p in pubs[1:]), 20.0)
        executor.spin_once(timeout_sec=0.5)  # the latched route on its way
        stamp = Time(sec=3, nanosec=50_000_000)
        imu = Imu()
        imu.header.stamp, imu.orientation.w = stamp, 1.0
        for pub, msg in zip(pubs, (Clock(clock=stamp), imu, NavSatFix(header=imu.header),
                                   carla_msgs.CarlaSpeedometer(header=imu.header, speed=1.0))):
            pub.publish(msg)
        assert spin_until(lambda: bool(controls), 20.0), launched.log.read_text()[-4000:]
        assert (controls[0].header.stamp.sec, controls[0].header.stamp.nanosec) == (3, 50_000_000)
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


@needs_tools
@pytest.mark.timeout(120)
def test_ros2_interface_show_lists_the_package_s_messages():
    env = launch_environment()
    names = sorted(p.stem for p in (ROOT / "msg").glob("*.msg"))
    for name in names:
        out = subprocess.run([str(ROS2), "interface", "show", f"wamdiff_ros/msg/{name}"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        fields = [line.split()[1] for line in (ROOT / "msg" / f"{name}.msg").read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#") and "=" not in line]
        for field in fields:
            assert re.search(rf"\b{re.escape(field)}\b", out.stdout), (name, field)
    listed = subprocess.run([str(ROS2), "interface", "package", "wamdiff_ros"], env=env, capture_output=True,
                            text=True, timeout=60).stdout.split()
    assert sorted(n.rsplit("/", 1)[1] for n in listed) == names
