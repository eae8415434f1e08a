"""Bench2Drive's ROS 2 agent path without CARLA: the ROS2Agent's entry point and sensors, and the adapter with the
planner node and the control node driven by a fake bridge that behaves as Bench2Drive + carla-ros-bridge do (sensor
topics of the ROS2Agent's sensors, the routes latched, ``/clock`` once per tick, waiting for ``/carla/hero/status``,
then one control per tick awaited for up to 1 s). carla_msgs has no wheel: its field lists are built, test-only,
from test/interfaces/carla_msgs (``make setup``)."""

import importlib.util
import math
import os
import sys
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
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")
    if str(TEST_INTERFACES) not in sys.path:
        sys.path.insert(0, str(TEST_INTERFACES))
    return pytest.importorskip("carla_msgs.msg", reason="the test-only carla_msgs is not built (make setup: "
                                                        "scripts/build_test_interfaces.sh)")


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
