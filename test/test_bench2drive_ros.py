"""Bench2Drive's ROS 2 agent path without CARLA: the ROS2Agent's entry point and sensors, the adapter with the
planner node and the control node driven by a fake bridge that behaves as Bench2Drive + carla-ros-bridge do (sensor
topics of the ROS2Agent's sensors, the routes latched, ``/clock`` once per tick, waiting for ``/carla/hero/status``,
then one control per tick awaited for up to 1 s), and Bench2Drive's tick contract (its extra ``setup_sensors`` tick,
its one-slot control queue, both orders of ``/clock`` and the sensor messages) with the agent's control path.

carla_msgs: the REAL one (carla-ros-bridge's leaderboard-2.0 branch, the interfaces Bench2Drive's ROS2Agent imports),
built into the venv by ``make setup`` from ../shared/vendor/ros2 where that folder exists (CI has it). Where it does
not, carla_msgs has no wheel, and the fallback is the test-only stand-in built from test/interfaces/carla_msgs
(``scripts/build_test_interfaces.sh``: the four messages the package uses, same fields and type hashes), outside
site-packages so the runtime never sees it; the tests say which one they ran on (``-rs`` / the printed line).

Bench2Drive's agent classes: its own (``leaderboard``, ``srunner`` with CARLA 0.9.15's client) where importable,
else test/bench2drive_stand_in.py, which reproduces their queue, callback and ``run_step`` behaviour."""

import importlib.util
import math
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_INTERFACES = Path(sys.prefix) / "lib" / "wamdiff_test_interfaces"
TICK_S, PLAN_TIMEOUT_S = 0.05, 0.5
SENSORS_LIMITS = {"sensor.camera.rgb": 8, "sensor.lidar.ray_cast": 2, "sensor.other.radar": 4,
                  "sensor.other.gnss": 1, "sensor.other.imu": 1, "sensor.speedometer": 1}  # Bench2Drive 0.0.4


def _agent():
    from bench2drive_stand_in import import_ros2_agent

    ros2_agent = import_ros2_agent()
    return ros2_agent, ros2_agent.WamDiffROS2Agent("localhost", 2000, False)


def test_ros2_agent_names_its_launch_file_and_the_validated_sensors():
    module, agent = _agent()
    assert module.get_entry_point() == "WamDiffROS2Agent" and agent.get_ros_version() == 2
    entry = agent.get_ros_entrypoint()
    assert set(entry) == {"package", "launch_file", "parameters"}  # run(**entry, wait=True) in Bench2Drive
    assert entry["package"] == "wamdiff_ros" and (ROOT / "launch" / entry["launch_file"]).is_file()
    launch = (ROOT / "launch" / entry["launch_file"]).read_text()
    for name in entry["parameters"]:  # every key is one of the launch file's arguments
        assert f'"{name}":' in launch, name
    sensors = agent.sensors()
    # the SENSORS track's rules (Bench2Drive's validate_sensor_configuration): allowed types and counts, unique ids,
    # within 3 m of the vehicle's origin
    counts = {}
    for s in sensors:
        assert s["type"] in SENSORS_LIMITS, s["type"]
        counts[s["type"]] = counts.get(s["type"], 0) + 1
        assert math.sqrt(s.get("x", 0) ** 2 + s.get("y", 0) ** 2 + s.get("z", 0) ** 2) <= 3.0
    assert all(counts[k] <= SENSORS_LIMITS[k] for k in counts)
    assert len({s["id"] for s in sensors}) == len(sensors)
    assert {s["type"] for s in sensors} == {"sensor.camera.rgb", "sensor.other.imu", "sensor.other.gnss",
                                            "sensor.speedometer"}
    camera = sensors[0]
    assert (camera["width"], camera["height"], camera["fov"]) == (256, 128, 90.0)  # the model card's
    assert camera["pitch"] == pytest.approx(math.radians(-5.0))  # 5 deg down, in radians (Bench2Drive's slip)


def test_ros2_agent_loads_with_bench2drive_s_own_entry_point_logic_where_present():
    if importlib.util.find_spec("leaderboard") is None:
        pytest.skip("Bench2Drive's leaderboard package is not importable here (no Bench2Drive checkout on "
                    "PYTHONPATH): its agent loading and sensor validator are not run")
    # what leaderboard_evaluator.py does: import the agent module by name from its folder, get_entry_point(),
    # get_ros_version(); then agent_wrapper.validate_sensor_configuration on the SENSORS track
    from leaderboard.autoagents.agent_wrapper import validate_sensor_configuration
    from leaderboard.autoagents.autonomous_agent import Track

    sys.path.insert(0, str(ROOT / "wamdiff_ros" / "carla_bridge"))
    module = importlib.import_module("ros2_agent")
    agent_class = getattr(module, module.get_entry_point())
    assert agent_class.get_ros_version() == 2
    agent = agent_class.__new__(agent_class)  # its __init__ starts carla-ros-bridge: not here
    validate_sensor_configuration(agent.sensors(), Track.SENSORS, "SENSORS")  # raises when invalid


# ---------------------------------------------------------------------------------------------------------------------
# the adapter, closed loop with a fake bridge


def _carla_msgs():
    """The real carla_msgs where installed (``make setup`` with ../shared/vendor/ros2), else the test-only stand-in."""
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")
    if not _real_carla_msgs() and str(TEST_INTERFACES) not in sys.path:
        sys.path.insert(0, str(TEST_INTERFACES))
    return pytest.importorskip("carla_msgs.msg", reason="neither the real carla_msgs (make setup with "
                                                        "../shared/vendor/ros2) nor the test-only stand-in is built")


def _real_carla_msgs() -> bool:
    """carla-ros-bridge's own carla_msgs (the stand-in has no services)."""
    try:
        from carla_msgs.srv import DestroyObject, SpawnObject  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_real_carla_msgs_is_used_where_the_vendor_folder_gave_it():
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    if not (Path(sys.prefix) / "share" / "carla_msgs" / "srv" / "SpawnObject.srv").is_file():
        pytest.skip("the real carla_msgs is not installed (no ../shared/vendor/ros2 at make setup): the Bench2Drive "
                    "tests run on the test-only stand-in")
    m = _carla_msgs()
    assert _real_carla_msgs() and str(TEST_INTERFACES) not in sys.path
    assert Path(m.__file__).resolve().is_relative_to(Path(sysconfig.get_path("purelib")).resolve())
    control = m.CarlaEgoVehicleControl()  # the fields the adapter, the control node and Bench2Drive use
    for field in ("header", "throttle", "steer", "brake", "hand_brake", "reverse", "gear", "manual_gear_shift"):
        assert hasattr(control, field), field
    assert hasattr(m.CarlaRoute(), "road_options") and hasattr(m.CarlaSpeedometer(), "speed")


def _empty_road():
    """The front camera (the world's renderer, the model card's camera) over an empty straight two-lane road along
    +x, the route in its right lane (y = 0)."""
    from wamdiff_ros.world.camera import CameraConfig, FrontCamera
    from wamdiff_ros.world.types import LINE_DASHED, LINE_SOLID, LaneStrip, RoadGeometry

    x = np.linspace(-20.0, 600.0, 63)
    lanes = tuple(LaneStrip(np.stack([x, np.full_like(x, y)], axis=1), np.full(len(x), 3.5),
                            LINE_SOLID if y > 0 else LINE_DASHED, LINE_DASHED if y > 0 else LINE_SOLID)
                  for y in (0.0, 3.5))
    return FrontCamera(RoadGeometry(lanes), CameraConfig())


class FakeBridge:
    """Bench2Drive + carla-ros-bridge as the agent's ROS graph sees them, on a straight route along +x (map frame),
    GNSS around (0, 0) degrees, the ego a kinematic bicycle driven by the controls it gets (CARLA's steer: positive
    right, normalised by the carla gains' maximum wheel angle)."""

    def __init__(self, node, carla_msgs) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image, Imu, NavSatFix
        from std_msgs.msg import Bool

        from wamdiff_ros.msg import PlannerOutput

        self.node, self.m = node, carla_msgs
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.clock_pub = node.create_publisher(Clock, "/clock", 10)
        self.image_pub = node.create_publisher(Image, "/carla/hero/rgb_front/image", 10)
        self.imu_pub = node.create_publisher(Imu, "/carla/hero/imu", 10)
        self.gnss_pub = node.create_publisher(NavSatFix, "/carla/hero/gnss", 10)
        self.speed_pub = node.create_publisher(carla_msgs.CarlaSpeedometer, "/carla/hero/speed", 10)
        self.route_pub = node.create_publisher(carla_msgs.CarlaRoute, "/carla/hero/global_plan", latched)
        self.gnss_route_pub = node.create_publisher(carla_msgs.CarlaGnssRoute, "/carla/hero/global_plan_gnss", latched)
        self.status, self.controls, self.plans = [], [], []
        node.create_subscription(Bool, "/carla/hero/status", lambda m: self.status.append(m.data), latched)
        node.create_subscription(carla_msgs.CarlaEgoVehicleControl, "/carla/hero/vehicle_control_cmd",
                                 lambda m: self.controls.append((time.monotonic(), m)), QoSProfile(depth=1))
        node.create_subscription(PlannerOutput, "/wamdiff_planner/output/plan",
                                 lambda m: self.plans.append((time.monotonic(), m)), 10)
        self.camera = _empty_road()
        self.x, self.y, self.heading, self.speed, self.t = 10.0, 0.0, 0.0, 8.0, 0.0  # rolling at 8 m/s
        self.max_abs_y = 0.0

    def publish_route(self) -> None:
        from geometry_msgs.msg import Pose

        route = self.m.CarlaRoute()
        for x in np.arange(10.0, 510.0, 50.0):  # Bench2Drive downsamples the route to 50 m
            pose = Pose()
            pose.position.x, pose.orientation.w = float(x), 1.0
            route.poses.append(pose)
            route.road_options.append(self.m.CarlaRoute.LANEFOLLOW)
        self.route_pub.publish(route)
        gnss = self.m.CarlaGnssRoute()
        gnss.road_options = list(route.road_options)  # Bench2Drive 0.0.4: the coordinates stay empty
        self.gnss_route_pub.publish(gnss)

    def tick(self, wait_s: float = 1.0):
        """One CARLA tick: the sensors stamped with its time, then /clock; the control stamped with it, if one comes
        within ``wait_s`` (Bench2Drive's 1 s); returns it or None."""
        from builtin_interfaces.msg import Time
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Imu, NavSatFix

        from wamdiff_ros.ros.conversions import quaternion_from_yaw, rgb_to_image

        self.t = round(self.t + TICK_S, 6)
        stamp = Time(sec=int(self.t), nanosec=int(round((self.t % 1) * 1e9)))
        from wamdiff_ros.geometry import Pose2D

        rgb = self.camera.render(Pose2D(self.x, self.y, self.heading), []).image  # the ego's view at this tick
        image = rgb_to_image(rgb, self.t, "hero/rgb_front", "bgra8")  # as carla-ros-bridge sends it
        self.image_pub.publish(image)
        imu = Imu()
        imu.header.stamp, imu.header.frame_id = stamp, "hero/imu"
        imu.orientation = quaternion_from_yaw(self.heading)  # the bridge's: the compass as a yaw in the map frame
        self.imu_pub.publish(imu)
        metres_per_degree = 6378137.0 * math.pi / 180.0  # CARLA's equatorial radius, at latitude 0
        self.gnss_pub.publish(NavSatFix(header=imu.header, latitude=self.y / metres_per_degree,
                                        longitude=self.x / metres_per_degree))
        self.speed_pub.publish(self.m.CarlaSpeedometer(header=imu.header, speed=self.speed))
        self.clock_pub.publish(Clock(clock=stamp))
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            for _, msg in reversed(self.controls):
                if abs(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9 - self.t) < 1e-3:
                    self._apply(msg)
                    return msg
            time.sleep(0.002)
        return None

    def _apply(self, control) -> None:
        from wamdiff_ros.control import FollowerGains

        wheel = -control.steer * FollowerGains.for_world("carla").max_steer_rad  # CARLA steers right positive
        self.speed = max(0.0, self.speed + (4.0 * control.throttle - 8.0 * control.brake) * TICK_S)
        self.heading += self.speed * math.tan(wheel) / 2.875 * TICK_S
        self.x += self.speed * math.cos(self.heading) * TICK_S
        self.y += self.speed * math.sin(self.heading) * TICK_S
        self.max_abs_y = max(self.max_abs_y, abs(self.y))


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """The planner node in its own process, as the launch file starts it (sim time, inputs remapped); the adapter and
    the control node in one process, as their executable runs them (here: with the fake bridge)."""
    carla_msgs = _carla_msgs()
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter

    from ros_harness import NodeProcess

    from wamdiff_ros.ros.bridge.bench2drive_adapter import Bench2DriveAdapter
    from wamdiff_ros.ros.bridge.carla_control import CarlaControl

    adapter_ns = "/wamdiff_bench2drive_adapter/output"
    planner = NodeProcess(  # its own domain (ROS_DOMAIN_ID, set here too), loopback discovery
        tmp_path_factory.mktemp("b2d") / "planner.log", "-p", "use_sim_time:=true", "-p", "model:=wamdiff-tiny",
        "-p", "blackbox_dir:=none", "-p", "detect_hz:=0.0", "-p", "describe_hz:=0.0", "-p", "torch_threads:=1",
        "-r", "~/input/image:=/carla/hero/rgb_front/image", "-r", "~/input/odometry:=/carla/hero/odometry",
        "-r", f"~/input/command:={adapter_ns}/command", "-r", f"~/input/route:={adapter_ns}/route")
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
    sim = Parameter("use_sim_time", value=True)
    adapter = Bench2DriveAdapter(context=ctx, parameter_overrides=[sim])
    control = CarlaControl(context=ctx, parameter_overrides=[
        sim, Parameter("plan_timeout_s", value=PLAN_TIMEOUT_S), Parameter("twist", value="off")])
    bridge_node = rclpy.create_node("fake_bench2drive", context=ctx)
    bridge = FakeBridge(bridge_node, carla_msgs)
    executor = MultiThreadedExecutor(num_threads=2, context=ctx)
    for n in (adapter, control, bridge_node):
        executor.add_node(n)
    spinning = threading.Thread(target=executor.spin, daemon=True)
    spinning.start()
    try:
        yield bridge, planner, adapter, control
    finally:
        planner.stop()
        executor.shutdown(timeout_sec=5.0)
        spinning.join(5.0)
        for n in (adapter, control, bridge_node):
            n.destroy_node()
        rclpy.shutdown(context=ctx)


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_the_adapter_drives_bench2drive_s_contract(loop):
    bridge, planner, adapter, control = loop
    end = time.monotonic() + 120.0
    while not bridge.status and time.monotonic() < end and planner.proc.poll() is None:  # Bench2Drive waits for it
        time.sleep(0.05)
    assert bridge.status and all(bridge.status), planner.log.read_text()[-3000:]
    bridge.publish_route()
    controls = []
    for _ in range(80):  # 4 s of sim time at 20 Hz, paced like the simulator in real time
        start = time.monotonic()
        controls.append((bridge.t + TICK_S, bridge.tick()))
        time.sleep(max(0.0, TICK_S - (time.monotonic() - start)))
    answered = [(t, c) for t, c in controls if c is not None]
    assert len(answered) >= len(controls) - 2, "ticks without a control (the first ones may precede the odometry)"
    stamps = [c.header.stamp.sec + c.header.stamp.nanosec * 1e-9 for _, c in answered]
    assert all(abs(s - t) < 1e-3 for s, (t, _) in zip(stamps, answered))  # each stamped with its tick
    per_tick = [sum(abs(s - t) < 1e-3 for s in (m.header.stamp.sec + m.header.stamp.nanosec * 1e-9
                                                for _, m in bridge.controls)) for t, _ in controls]
    assert max(per_tick) == 1  # one command per tick
    assert bridge.plans, "no plan"
    first = min(m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for _, m in bridge.plans)
    before_first_plan = sum(t <= first + 0.1 for t, _ in answered)
    # once plans come, they keep coming within plan_timeout_s: the follower tracks them (it brakes only as they say)
    assert control.counters.brake_no_plan <= before_first_plan + 4, (control.counters, before_first_plan)
    assert bridge.max_abs_y < 1.0 and abs(bridge.heading) < 0.15, (bridge.max_abs_y, bridge.heading)  # on the route
    assert bridge.x > 10.0 + 15.0 and bridge.speed > 2.0, (bridge.x, bridge.speed)  # it keeps driving
    assert adapter.counters["odometry"] >= 70 and adapter.counters["bad_messages"] == 0

    # the planner stops planning (its inference deactivated, its process alive): within plan_timeout_s of its last
    # plan every command is a full brake
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    client = bridge.node.create_client(ChangeState, "/wamdiff_planner/change_state")
    assert client.wait_for_service(timeout_sec=10.0)
    future = client.call_async(ChangeState.Request(transition=Transition(id=Transition.TRANSITION_DEACTIVATE)))
    end = time.monotonic() + 10.0
    while not future.done() and time.monotonic() < end:
        time.sleep(0.01)
    assert future.done() and future.result().success
    stalled_at = time.monotonic()
    braked = None
    for _ in range(30):
        start = time.monotonic()
        control = bridge.tick()
        if control is not None and control.brake == 1.0 and control.throttle == 0.0 and braked is None:
            braked = time.monotonic()
        time.sleep(max(0.0, TICK_S - (time.monotonic() - start)))
    last_plan = max(t for t, _ in bridge.plans)
    print(f"{len(answered)} of {len(controls)} ticks answered; ego at x = {bridge.x:.1f} m, |y| <= "
          f"{bridge.max_abs_y:.2f} m, {bridge.speed:.1f} m/s; "
          f"full brake {braked - last_plan:.3f} s after the last plan, {braked - stalled_at:.3f} s after the stall")
    assert braked is not None and braked - last_plan <= PLAN_TIMEOUT_S + 0.25, (braked - last_plan)  # a tick or two
    assert braked - stalled_at < 1.0  # well before Bench2Drive's 1 s coasting fallback


# ---------------------------------------------------------------------------------------------------------------------
# Bench2Drive's tick contract: the pieces, without ROS


def test_tick_assembler_gives_each_tick_once_from_its_own_messages_in_any_order():
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")
    from wamdiff_ros.ros.bridge.bench2drive_adapter import TickAssembler

    ms = 1_000_000
    t = 5_000 * ms  # 5 s of sim time
    a = TickAssembler(("gnss", "imu", "speed"))
    assert a.add("speed", t + 50 * ms, 1.0) is None and a.add("gnss", t + 50 * ms, "g1") is None
    assert a.add("imu", t + 100 * ms, 0.2) is None  # the next tick's first message
    assert a.add("imu", t + 50 * ms, 0.1) == (t + 50 * ms, {"speed": 1.0, "gnss": "g1", "imu": 0.1})
    assert a.add("imu", t + 50 * ms, 0.5) is None and a.counters["late_messages"] == 1  # answered already
    assert a.add("gnss", t + 100 * ms, "g2") is None
    assert a.add("speed", t + 100 * ms + 1000, 2.0) == (t + 100 * ms, {"imu": 0.2, "gnss": "g2", "speed": 2.0})
    a.add("gnss", t + 150 * ms, "g3")  # tick 150 ms never completes ...
    for part in ("gnss", "imu", "speed"):
        done = a.add(part, t + 200 * ms, part)
    assert done[0] == t + 200 * ms and a.counters["incomplete_ticks"] == 1  # ... dropped by the next complete one
    assert a.add("gnss", t - 500 * ms, "g") is None and a.counters["late_messages"] == 2  # within 1 s back: late
    for part in ("gnss", "imu", "speed"):  # more than 1 s back: the clock started over (a new route)
        done = a.add(part, 50 * ms, part)
    assert done == (50 * ms, {"gnss": "gnss", "imu": "imu", "speed": "speed"}) and a.counters["restarts"] == 1
    assert a.counters["complete"] == 4


def test_tick_control_slot_returns_only_the_world_s_current_tick_s_control():
    import queue

    from bench2drive_stand_in import import_ros2_agent

    Slot = import_ros2_agent().TickControlSlot
    tick = [0.05]
    slot = Slot(lambda: tick[0])
    slot.put_nowait((0.05, "setup"))  # the setup_sensors tick: no run_step reads it
    tick[0] = 0.10
    slot.put_nowait((0.10, "t1"))  # not dropped as "queue full": it replaces the setup tick's
    assert slot.replaced == 1 and slot.get(True, 1.0) == (0.10, "t1")
    tick[0] = 0.15
    slot.put_nowait((0.15, "t2"))
    with pytest.raises(queue.Full):
        slot.put_nowait((0.15, "t2 again"))
    assert slot.get(True, 1.0)[1] == "t2"
    tick[0] = 0.20
    slot.put_nowait((0.20, "t3"))  # taken by nobody (as if the world ticked on without a run_step) ...
    tick[0] = 0.25
    start = time.monotonic()
    with pytest.raises(queue.Empty):  # ... and never handed to the next tick's run_step
        slot.get(True, 0.2)
    assert slot.dropped == 1 and time.monotonic() - start >= 0.19
    threading.Timer(0.05, slot.put_nowait, args=((0.25, "t4"),)).start()
    assert slot.get(True, 1.0) == (0.25, "t4")  # waits for the tick's own


def test_the_agent_installs_the_slot_through_bench2drive_s_own_assignment():
    import queue

    from bench2drive_stand_in import import_ros2_agent

    module = import_ros2_agent()
    agent = module.WamDiffROS2Agent.__new__(module.WamDiffROS2Agent)
    agent._control_queue = queue.Queue(1)  # what ROSBaseAgent.__init__ does
    assert isinstance(agent._control_queue, module.TickControlSlot)
    if importlib.util.find_spec("leaderboard") is None:  # the stand-in's __init__ makes the same assignment
        assert isinstance(module.WamDiffROS2Agent("localhost", 2000, False)._control_queue, module.TickControlSlot)


# ---------------------------------------------------------------------------------------------------------------------
# Bench2Drive's tick contract, over ROS: the adapter and the control node (as their executable runs them) answering a
# fake bridge, and the agent's control path -- Bench2Drive's callback and run_step (its own where importable, else the
# stand-in's) with WamDiffROS2Agent's -- taking the controls. No planner: the contract is about which control each
# run_step gets, not what it says (without plans the control node brakes, once per tick as always).

ORDERS = ("clock_first", "clock_last")


class FakeWorld:
    """CARLA's world as the agent reads it (``get_snapshot().timestamp.elapsed_seconds``) and carla-ros-bridge in
    passive synchronous mode: each ``tick()`` takes 0-30 ms of simulation (the snapshot still at the previous tick),
    advances the clock 50 ms and returns while the bridge (a thread here, a process there) publishes that tick's IMU,
    GNSS and speedometer messages (stamped with it, in a shuffled order) and ``/clock``, before or after them; a speed
    unique to each tick lets the test see which tick's sensors an odometry message was built from."""

    def __init__(self, node, carla_msgs, rng) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Imu, NavSatFix

        self.node, self.m, self.rng = node, carla_msgs, rng
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.pubs = {"clock": node.create_publisher(Clock, "/clock", 10),
                     "imu": node.create_publisher(Imu, "/carla/hero/imu", 10),
                     "gnss": node.create_publisher(NavSatFix, "/carla/hero/gnss", 10),
                     "speed": node.create_publisher(carla_msgs.CarlaSpeedometer, "/carla/hero/speed", 10)}
        self.route_pub = node.create_publisher(carla_msgs.CarlaRoute, "/carla/hero/global_plan", latched)
        self.t, self.order, self.speeds, self.compute_s = 0.0, ORDERS[0], {}, (0.0, 0.03)
        self._bridge: threading.Thread | None = None

    def get_snapshot(self):
        from types import SimpleNamespace

        return SimpleNamespace(timestamp=SimpleNamespace(elapsed_seconds=self.t))

    def new_route(self, start_s: float) -> None:
        from geometry_msgs.msg import Pose

        route = self.m.CarlaRoute()
        for x in (0.0, 50.0, 100.0):
            pose = Pose()
            pose.position.x, pose.orientation.w = x, 1.0
            route.poses.append(pose)
            route.road_options.append(self.m.CarlaRoute.LANEFOLLOW)
        self.route_pub.publish(route)
        self.t, self.speeds = start_s, {}

    def tick(self) -> float:
        from builtin_interfaces.msg import Time
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Imu, NavSatFix

        self.flush()
        time.sleep(self.rng.uniform(*self.compute_s))  # the server computes the frame
        t = round(self.t + TICK_S, 6)
        ns = int(round(t * 1e9))
        stamp = Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
        speed = self.speeds[ns] = 5.0 + 0.01 * (len(self.speeds) % 500)
        imu = Imu()
        imu.header.stamp, imu.orientation.w = stamp, 1.0
        msgs = {"imu": imu, "gnss": NavSatFix(header=imu.header, latitude=0.0, longitude=0.0),
                "speed": self.m.CarlaSpeedometer(header=imu.header, speed=speed)}
        names = list(msgs)
        self.rng.shuffle(names)
        names = ["clock"] + names if self.order == "clock_first" else names + ["clock"]
        gaps = self.rng.uniform(0.0, 0.002, len(names))

        def bridge():
            for name, gap in zip(names, gaps):
                self.pubs[name].publish(Clock(clock=stamp) if name == "clock" else msgs[name])
                time.sleep(gap)  # the bridge's messages come one by one

        self.t = t  # the tick is done: world.tick() returns, the bridge publishes
        self._bridge = threading.Thread(target=bridge, daemon=True)
        self._bridge.start()
        return t

    def flush(self) -> None:
        if self._bridge is not None:
            self._bridge.join()


@pytest.fixture(scope="module")
def contract():
    """The adapter and the control node, a fake world, and Bench2Drive's control subscription (``leaderboard_node``,
    depth 1, spun on its own thread as ``ROS2Agent.__init__`` does) handing each control to the current agent's
    callback; an own ROS domain (the module's other loop publishes on the same topics)."""
    carla_msgs = _carla_msgs()
    import rclpy
    from nav_msgs.msg import Odometry
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from rclpy.qos import QoSProfile

    from bench2drive_stand_in import import_ros2_agent
    from ros_harness import ros_environment

    from wamdiff_ros.ros.bridge.bench2drive_adapter import Bench2DriveAdapter
    from wamdiff_ros.ros.bridge.carla_control import CarlaControl

    ros_environment()  # loopback discovery
    ctx = rclpy.Context()
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 2
    rclpy.init(context=ctx, domain_id=3 + worker)  # 3-4: no other test's
    sim = Parameter("use_sim_time", value=True)
    adapter = Bench2DriveAdapter(context=ctx, parameter_overrides=[sim])
    control = CarlaControl(context=ctx, parameter_overrides=[sim, Parameter("plan_timeout_s", value=PLAN_TIMEOUT_S),
                                                             Parameter("twist", value="off")])
    bridge = rclpy.create_node("fake_bench2drive_bridge", context=ctx)
    leaderboard = rclpy.create_node("leaderboard_node", context=ctx)
    world = FakeWorld(bridge, carla_msgs, np.random.default_rng(0))
    state = {"agent": None, "controls": [], "odometry": []}
    leaderboard.create_subscription(carla_msgs.CarlaEgoVehicleControl, "/carla/hero/vehicle_control_cmd",
                                    lambda m: state["agent"]._vehicle_control_cmd_callback(m), QoSProfile(depth=1))
    bridge.create_subscription(carla_msgs.CarlaEgoVehicleControl, "/carla/hero/vehicle_control_cmd",
                               lambda m: state["controls"].append(m), 1000)
    bridge.create_subscription(Odometry, "/carla/hero/odometry", lambda m: state["odometry"].append(m), 1000)
    ros_side = MultiThreadedExecutor(num_threads=2, context=ctx)
    for n in (adapter, control, bridge):
        ros_side.add_node(n)
    agent_side = SingleThreadedExecutor(context=ctx)  # rclpy.spin(self.ros_node) in Bench2Drive
    agent_side.add_node(leaderboard)
    threads = [threading.Thread(target=e.spin, daemon=True) for e in (ros_side, agent_side)]
    for th in threads:
        th.start()
    end = time.monotonic() + 20.0  # discovery: every publisher matched before the first tick
    while time.monotonic() < end and not (
            all(p.get_subscription_count() >= 1 for p in world.pubs.values() if p.topic_name != "/clock")
            and leaderboard.count_publishers("/carla/hero/vehicle_control_cmd") >= 1
            and bridge.count_publishers("/carla/hero/odometry") >= 1):
        time.sleep(0.05)
    module = import_ros2_agent()
    if importlib.util.find_spec("leaderboard") is not None:  # Bench2Drive's own CarlaDataProvider: its world
        module.CarlaDataProvider.get_world = staticmethod(lambda: world)
    else:
        module.CarlaDataProvider.set_world(world)
    try:
        yield module, world, adapter, control, state
    finally:
        for e in (ros_side, agent_side):
            e.shutdown(timeout_sec=5.0)
        for th in threads:
            th.join(5.0)
        for n in (adapter, control, bridge, leaderboard):
            n.destroy_node()
        rclpy.shutdown(context=ctx)


class _Alive:
    @staticmethod
    def is_alive():
        return True


def _agent_for_a_route(module, fixed: bool = True):
    """A new agent per route, as Bench2Drive makes one: ``WamDiffROS2Agent``, or (``fixed=False``) Bench2Drive's
    ROS2Agent as it is, for comparison. Bench2Drive's own ``__init__`` starts carla-ros-bridge and ``ros2 launch``:
    where its classes are importable, the attributes it sets for the control path are set here instead."""
    import queue

    cls = module.WamDiffROS2Agent
    if not fixed:
        cls = type("Bench2DriveROS2Agent", (module.ROS2Agent,), {
            "get_ros_entrypoint": module.WamDiffROS2Agent.get_ros_entrypoint})
    if importlib.util.find_spec("leaderboard") is None:
        return cls("localhost", 2000, False)  # the stand-in's __init__: the entry point, queue.Queue(1)
    agent = cls.__new__(cls)
    agent._control_queue = queue.Queue(1)
    agent._last_control_timestamp = None
    agent._bridge_process = agent._agent_process = _Alive()
    return agent


def _drive_routes(contract, capsys, runs: int, ticks: int, fixed: bool = True, setup_gap_s=(0.0, 0.15),
                  compute_s=(0.0, 0.03), agent_delay_s=(0.0, 0.01)):
    """``runs`` routes x both orders x ``ticks`` ticks, each route as Bench2Drive runs it: a new agent, the route
    published, the ``setup_sensors`` tick (no run_step), a pause of ``setup_gap_s`` (from 0: the first tick comes
    before that tick's control, to 150 ms: long after it), then per tick ``world.tick()`` (taking ``compute_s``), the
    scenario manager's work before the agent's call (``agent_delay_s``) and ``run_step``. Returns the counts
    (printed)."""
    module, world, adapter, control, state = contract
    rng = np.random.default_rng(1)
    counts = {"ticks": 0, "wrong_tick": 0, "b2d_stamp_warnings": 0, "b2d_warnings": 0, "first_tick_s_max": 0.0,
              "run_step_s_max": 0.0, "wire_controls_not_one_per_tick": 0, "odometry_from_another_tick": 0,
              "setup_tick_answered": 0, "replaced": 0, "dropped": 0, "late": 0, "repeated": 0}
    waits = []
    capsys.readouterr()
    for run in range(runs):
        for order in ORDERS:
            agent = _agent_for_a_route(module, fixed)
            returned = []
            slot = agent._control_queue
            get = slot.get

            def spy(*args, _get=get, **kwargs):
                try:
                    item = _get(*args, **kwargs)
                except Exception:
                    returned.append(None)
                    raise
                returned.append(item[0])
                return item

            slot.get = spy
            state["agent"] = agent
            routes = adapter.counters["routes"]
            world.order, world.compute_s = order, compute_s
            world.new_route(start_s=round(float(rng.uniform(1.0, 3.0)), 2))  # sim time starts over for each route
            end = time.monotonic() + 10.0
            while adapter.counters["routes"] == routes and time.monotonic() < end:
                time.sleep(0.01)
            assert adapter.counters["routes"] > routes, "the adapter never got the route"
            state["controls"].clear()
            state["odometry"].clear()
            setup_t = world.tick()  # ROSAgentWrapper.setup_sensors: one tick, no run_step
            time.sleep(float(rng.uniform(*setup_gap_s)))
            tick_times = []
            for i in range(ticks):
                t = world.tick()
                time.sleep(float(rng.uniform(*agent_delay_s)))  # the scenario manager's work before run_step
                start = time.monotonic()
                agent.run_step(None, t)
                elapsed = time.monotonic() - start
                counts["run_step_s_max"] = max(counts["run_step_s_max"], elapsed)
                waits.append(elapsed)
                if i == 0:
                    counts["first_tick_s_max"] = max(counts["first_tick_s_max"], elapsed)
                tick_times.append(t)
            assert len(returned) == ticks
            counts["ticks"] += ticks
            counts["wrong_tick"] += sum(r is None or abs(r - t) > 1e-3 for r, t in zip(returned, tick_times))
            world.flush()
            time.sleep(0.1)  # the last tick's messages on the wire
            wire = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in state["controls"]]
            counts["setup_tick_answered"] += sum(abs(s - setup_t) < 1e-3 for s in wire)
            counts["wire_controls_not_one_per_tick"] += sum(
                sum(abs(s - t) < 1e-3 for s in wire) != 1 for t in [setup_t] + tick_times) + sum(
                all(abs(s - t) >= 1e-3 for t in [setup_t] + tick_times) for s in wire)
            for odom in state["odometry"]:
                ns = odom.header.stamp.sec * 1_000_000_000 + odom.header.stamp.nanosec
                counts["odometry_from_another_tick"] += abs(odom.twist.twist.linear.x - world.speeds.get(ns, -1)) > 1e-9
            for k in ("replaced", "dropped", "late", "repeated"):
                counts[k] += getattr(slot, k, 0)
    counts["run_step_s_p99"] = float(np.percentile(waits, 99))
    out = capsys.readouterr().out
    counts["b2d_warnings"] = out.count("WARNING")
    counts["b2d_stamp_warnings"] = out.count("Expecting a vehicle command with timestamp")
    with capsys.disabled():
        print(f"\n{'WamDiffROS2Agent' if fixed else 'Bench2Drive ROS2Agent as is'}, {runs} runs x {len(ORDERS)} orders "
              f"x {ticks} ticks, Bench2Drive classes: "
              f"{'its own' if importlib.util.find_spec('leaderboard') else 'stand-in'}, carla_msgs: "
              f"{'real' if _real_carla_msgs() else 'stand-in'}: {counts}")
    return counts


def _assert_contract(c: dict, runs: int, ticks: int) -> None:
    assert c["ticks"] == runs * len(ORDERS) * ticks
    assert c["wrong_tick"] == 0 and c["b2d_stamp_warnings"] == 0 and c["b2d_warnings"] == 0, c
    assert c["first_tick_s_max"] < 1.0, c  # answered within Bench2Drive's 1 s wait
    assert c["wire_controls_not_one_per_tick"] == 0 and c["odometry_from_another_tick"] == 0, c
    assert c["setup_tick_answered"] == runs * len(ORDERS), c  # the case that broke it did happen, every route


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_bench2drive_s_tick_contract_holds_for_both_orders_and_the_setup_tick(contract, capsys):
    """The CI size (the full 10 runs x 2 orders x 200 ticks: the slow test below). First Bench2Drive's agent as it
    is, on the same harness, with the setup tick answered before the first tick, a server that takes 20-30 ms a
    tick and run_step called at once (the issue's case): every run_step gets the previous tick's control. Then
    WamDiffROS2Agent, with ticks of 0-30 ms, 0-10 ms before run_step and the first tick from 0 to 150 ms after the
    setup tick: every order of the setup tick's control, the first tick and the first run_step."""
    broken = _drive_routes(contract, capsys, runs=1, ticks=20, fixed=False, setup_gap_s=(0.15, 0.2),
                           compute_s=(0.02, 0.03), agent_delay_s=(0.0, 0.0))
    # how many of its 40 ticks go wrong depends on the scheduling (under the parallel suite's load about all of them;
    # alone on an idle machine 7-28 were seen): some do, where WamDiffROS2Agent below gets none
    assert broken["wrong_tick"] >= 5 and broken["b2d_stamp_warnings"] >= 5, broken
    _assert_contract(_drive_routes(contract, capsys, runs=2, ticks=100), runs=2, ticks=100)


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench2drive_s_tick_contract_full(contract, capsys):
    """The issue's acceptance: 10 runs x both orders x 200 ticks."""
    _assert_contract(_drive_routes(contract, capsys, runs=10, ticks=200), runs=10, ticks=200)
