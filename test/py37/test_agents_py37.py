"""The CARLA-side agents under Bench2Drive's own interpreter: Python 3.7 with carla==0.9.15 and numpy 1.21
(``make py37`` builds .venv37 from requirements-py37.lock; test/test_python37.py runs this folder there, with a real
``wamdiff-serve`` started from the main venv, WAMDIFF_TEST_SERVER). Python 3.7 syntax; the main suite's conftest
leaves this folder out (test/test_carla_agent.py covers the same agent under 3.11)."""

import json
import math
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (REPO, os.path.join(REPO, "test")):  # the package; the Bench2Drive stand-in beside the main suite
    if path not in sys.path:
        sys.path.insert(0, path)

carla = pytest.importorskip("carla", reason="the CARLA client (carla==0.9.15 / 0.9.16) is not installed")

from bench2drive_stand_in import import_ros2_agent  # noqa: E402
from wamdiff_ros.carla_bridge import agent as agent_module  # noqa: E402
from wamdiff_ros.carla_bridge.frames import pose_from_carla  # noqa: E402
from wamdiff_ros.carla_bridge.route import RoadOption, RouteCommands  # noqa: E402

ros2_agent = import_ros2_agent()

EARTH = 6378137.0


def _gps(x, y):
    """CARLA's GNSS (and the leaderboard's route GPS) at lat_ref = lon_ref = 0."""
    lon = x * 180.0 / (math.pi * EARTH)
    lat = 360.0 / math.pi * math.atan(math.exp(-y / EARTH)) - 90.0
    return {"lat": lat, "lon": lon, "z": 0.0}


def _route(length=200.0):
    xs = np.arange(0.0, length + 2.0, 2.0)
    option = [RoadOption.LEFT if 80.0 <= x <= 96.0 else RoadOption.LANEFOLLOW for x in xs]
    gps = [(_gps(float(x), 0.0), o) for x, o in zip(xs, option)]
    world = [(carla.Transform(carla.Location(x=float(x), y=0.0, z=0.0), carla.Rotation()), o)
             for x, o in zip(xs, option)]
    return gps, world


def _frame():
    """A BGRA frame of the model card's size: sky over a grey road with two white lane lines."""
    img = np.full((128, 256, 4), 255, np.uint8)
    img[:64, :, :3] = (235, 206, 135)
    img[64:, :, :3] = 90
    for row in range(64, 128):
        for centre in (128 - (row - 64) * 2, 128 + (row - 64) * 2):
            if 0 <= centre < 256:
                img[row, max(centre - 1, 0):centre + 2, :3] = 255
    return img


def _inputs(x=30.0, speed=4.0, frame=1):
    gps = _gps(x, 0.0)
    return {
        agent_module.CAMERA_ID: (frame, _frame()),
        agent_module.SPEED_ID: (frame, {"speed": speed}),
        agent_module.IMU_ID: (frame, np.array([0.3, -0.1, 9.81, 0.0, 0.0, 0.01, math.pi / 2.0])),
        agent_module.GNSS_ID: (frame, np.array([gps["lat"], gps["lon"], 0.0])),
    }


@pytest.fixture
def make_agent(tmp_path, monkeypatch):
    made = []

    def make(server="127.0.0.1:9", timeout_s=30.0):
        monkeypatch.setenv("WAMDIFF_SERVER", server)
        monkeypatch.setenv("WAMDIFF_TIMEOUT_S", str(timeout_s))
        monkeypatch.delenv("SAVE_PATH", raising=False)
        config = tmp_path / "agent.json"
        config.write_text(json.dumps({"plan_every_n_steps": 2}))
        agent = agent_module.WamDiffAgent("localhost", 2000, False)
        agent.set_global_plan(*_route())
        agent.setup(str(config) + "+route1_Town01_py37")
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.destroy()


@pytest.fixture(scope="module")
def server():
    address = os.environ.get("WAMDIFF_TEST_SERVER")
    if not address:
        pytest.skip("no WAMDIFF_TEST_SERVER (test/test_python37.py starts wamdiff-serve and gives its address)")
    return address


def _check(control):
    assert isinstance(control, carla.VehicleControl)
    assert 0.0 <= control.throttle <= 1.0 and 0.0 <= control.brake <= 1.0 and -1.0 <= control.steer <= 1.0


def test_thin_agent_plans_against_a_real_server(make_agent, server):
    agent = make_agent(server, timeout_s=60.0)
    for k in range(4):
        _check(agent.run_step(_inputs(x=30.0 + 0.2 * k, frame=k), 10.0 + 0.05 * k))
    assert agent.counters["plans"] == 2 and agent.counters["controls"] == 2
    assert agent.counters["errors"] == 0 and agent.counters["timeouts"] == 0
    assert agent.last_command == "left"  # the route's LEFT junction is 50 m ahead


def test_thin_agent_without_a_server_brakes(make_agent):
    agent = make_agent(timeout_s=0.05)
    control = agent.run_step(_inputs(), 1.0)
    _check(control)
    assert control.brake == 1.0 and control.throttle == 0.0 and agent.counters["errors"] == 1


def test_thin_agent_sensors_and_frames():
    sensors = agent_module.WamDiffAgent("localhost", 2000, False).sensors()
    assert [s["id"] for s in sensors] == [agent_module.CAMERA_ID, agent_module.IMU_ID, agent_module.GNSS_ID,
                                          agent_module.SPEED_ID]
    assert pose_from_carla(1.0, 2.0, 90.0) == pytest.approx((1.0, -2.0, -math.pi / 2.0))
    commands = RouteCommands([(0.0, 0.0), (50.0, 0.0), (100.0, 0.0)], [4, 1, 4], 60.0, 10.0)
    assert commands.update(0.0, 0.0) == "left"


def test_ros2_agent_entry_point_and_sensors():
    agent = ros2_agent.WamDiffROS2Agent("localhost", 2000, False)
    agent.setup("")
    entry = agent.get_ros_entrypoint()
    assert entry["package"] == "wamdiff_ros" and entry["launch_file"] == "bench2drive.launch.py"
    assert os.path.isfile(os.path.join(REPO, "launch", entry["launch_file"]))
    sensors = agent.sensors()
    assert {s["type"] for s in sensors} == {"sensor.camera.rgb", "sensor.other.imu", "sensor.other.gnss",
                                            "sensor.speedometer"}
    assert all(math.sqrt(s.get("x", 0.0) ** 2 + s.get("y", 0.0) ** 2 + s.get("z", 0.0) ** 2) <= 3.0 for s in sensors)
