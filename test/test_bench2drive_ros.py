"""Bench2Drive's ROS 2 agent path without CARLA: the ROS2Agent's entry point and sensors, and the adapter with the
planner node and the control node driven by a fake bridge that behaves as Bench2Drive + carla-ros-bridge do (sensor
topics of the ROS2Agent's sensors, the routes latched, ``/clock`` once per tick, waiting for ``/carla/hero/status``,
then one control per tick awaited for up to 1 s). carla_msgs has no wheel: its field lists are built, test-only,
from test/interfaces/carla_msgs (``make setup``)."""

import importlib.util
import math
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
    from wamdiff_ros.carla_bridge import ros2_agent

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


class FakeBridge:
    """Bench2Drive + carla-ros-bridge as the agent's ROS graph sees them, on a straight route along +x (map frame),
    GNSS around (0, 0) degrees, the ego integrating the controls it gets (speed only: the route is straight)."""

    def __init__(self, node, carla_msgs) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image, Imu, NavSatFix
        from std_msgs.msg import Bool

        from wamdiff_ros.cli import load_rgb, sample_image_path
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
        bgra = load_rgb(sample_image_path())[..., ::-1]  # a straight road ahead; carla-ros-bridge sends bgra8
        self.image = np.concatenate([bgra, np.full(bgra.shape[:2] + (1,), 255, np.uint8)], axis=2)
        self.x, self.speed, self.t = 10.0, 8.0, 0.0  # a scenario's start: rolling at 8 m/s

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
        image = rgb_to_image(self.image[..., 2::-1].copy(), self.t, "hero/rgb_front", "bgra8")
        self.image_pub.publish(image)
        imu = Imu()
        imu.header.stamp, imu.header.frame_id = stamp, "hero/imu"
        imu.orientation = quaternion_from_yaw(0.0)  # facing east, along the route
        self.imu_pub.publish(imu)
        north = 6378137.0 * math.pi / 180.0  # CARLA's equatorial radius, at latitude 0
        self.gnss_pub.publish(NavSatFix(header=imu.header, latitude=0.0, longitude=self.x / north))
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
        self.speed = max(0.0, self.speed + (4.0 * control.throttle - 8.0 * control.brake) * TICK_S)
        self.x += self.speed * TICK_S


@pytest.fixture(scope="module")
def loop():
    carla_msgs = _carla_msgs()
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from wamdiff_ros.ros.bench2drive_adapter import Bench2DriveAdapter
    from wamdiff_ros.ros.carla_control import CarlaControl
    from wamdiff_ros.ros.node import PlannerNode

    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=57)
    sim = Parameter("use_sim_time", value=True)
    adapter_ns = "/wamdiff_bench2drive_adapter/output"
    planner = PlannerNode(context=ctx, parameter_overrides=[
        sim, Parameter("model", value="wamdiff-tiny"), Parameter("blackbox_dir", value="none"),
        Parameter("detect_hz", value=0.0), Parameter("describe_hz", value=0.0)],
        cli_args=["--ros-args", "-r", "~/input/image:=/carla/hero/rgb_front/image",
                  "-r", "~/input/odometry:=/carla/hero/odometry", "-r", f"~/input/command:={adapter_ns}/command",
                  "-r", f"~/input/route:={adapter_ns}/route"])
    adapter = Bench2DriveAdapter(context=ctx, parameter_overrides=[sim])
    control = CarlaControl(context=ctx, parameter_overrides=[
        sim, Parameter("plan_timeout_s", value=PLAN_TIMEOUT_S), Parameter("twist", value="off")])
    bridge_node = rclpy.create_node("fake_bench2drive", context=ctx)
    bridge = FakeBridge(bridge_node, carla_msgs)
    executor = MultiThreadedExecutor(num_threads=3, context=ctx)
    for n in (planner, adapter, control, bridge_node):
        executor.add_node(n)
    threading.Thread(target=executor.spin, daemon=True).start()
    assert planner.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert planner.trigger_activate() == TransitionCallbackReturn.SUCCESS
    yield bridge, planner, adapter, control
    executor.shutdown()
    for n in (planner, adapter, control, bridge_node):
        n.destroy_node()
    rclpy.shutdown(context=ctx)


@pytest.mark.ros
@pytest.mark.timeout(300)
def test_the_adapter_drives_bench2drive_s_contract(loop):
    bridge, planner, adapter, control = loop
    end = time.monotonic() + 30.0
    while not bridge.status and time.monotonic() < end:  # Bench2Drive waits for the status before the route
        time.sleep(0.05)
    assert bridge.status and all(bridge.status), bridge.status
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
    tracking = [c for _, c in answered if c.brake < 1.0]
    assert len(tracking) >= len(answered) - 5, (control.counters, control.tracker.counters)  # braking only at first
    assert all(abs(c.steer) < 0.2 for c in tracking)  # straight on
    assert bridge.x > 10.0 + 4.0 * 4 and bridge.speed > 4.0, (bridge.x, bridge.speed)  # it keeps driving
    assert adapter.counters["odometry"] >= 70 and adapter.counters["bad_messages"] == 0

    # the planner stalls: within plan_timeout_s of its last plan every command is a full brake
    planner.trigger_deactivate()
    stalled_at = time.monotonic()
    braked = None
    for _ in range(30):
        start = time.monotonic()
        control = bridge.tick()
        if control is not None and control.brake == 1.0 and control.throttle == 0.0 and braked is None:
            braked = time.monotonic()
        time.sleep(max(0.0, TICK_S - (time.monotonic() - start)))
    last_plan = max(t for t, _ in bridge.plans)
    assert braked is not None and braked - last_plan <= PLAN_TIMEOUT_S + 2 * TICK_S, (braked - last_plan)
    assert braked - stalled_at < 1.0  # well before Bench2Drive's 1 s coasting fallback
