"""Bench2Drive's ``ROS2Agent`` as far as a subclass and the tick loop see it, for loading
``wamdiff_ros/carla_bridge/ros2_agent.py`` where Bench2Drive's leaderboard package is absent. Stdlib only (``carla``
where installed), Python 3.7 syntax: test/py37 imports it too.

Written from Bench2Drive 0.0.4's behaviour (``leaderboard/autoagents/ros_base_agent.py``, ``ros2_agent.py``), not
its code: ``__init__`` asks for the entry point (Bench2Drive then starts carla-ros-bridge and ``ros2 launch``) and makes
the control queue ``queue.Queue(1)``; the control callback drops a control whose stamp repeats the last accepted one
or is more than ``EPSILON`` off the world's current ``elapsed_seconds`` (a warning each), and ``put_nowait``s the
others (a full queue drops the new one, with a warning); ``run_step`` waits up to 1 s for a control (else CARLA's
default control, stamp 0) and warns when its stamp is more than ``EPSILON`` off the world's tick. The warnings are
printed with Bench2Drive's wording. ``CarlaDataProvider`` is scenario_runner's, reduced to the world the agent reads
(``set_world`` / ``get_world``). The ROS subscription ``ROS2Agent.__init__`` makes is the test's to make
(test/test_bench2drive_ros.py)."""

import importlib
import importlib.util
import queue
import sys
import types

from wamdiff_ros.carla_bridge.agent import Track

AGENT_MODULE = "wamdiff_ros.carla_bridge.ros2_agent"
_STAND_INS = ("leaderboard", "leaderboard.autoagents", "leaderboard.autoagents.autonomous_agent",
              "leaderboard.autoagents.ros2_agent", "srunner", "srunner.scenariomanager",
              "srunner.scenariomanager.carla_data_provider")
EPSILON = 0.001


def _vehicle_control(**fields):
    try:
        import carla
    except ImportError:
        return types.SimpleNamespace(**dict(dict(steer=0.0, throttle=0.0, brake=0.0, hand_brake=False,
                                                 reverse=False, manual_gear_shift=False, gear=0), **fields))
    return carla.VehicleControl(**fields)


class CarlaDataProvider(object):
    _world = None

    @staticmethod
    def set_world(world):
        CarlaDataProvider._world = world

    @staticmethod
    def get_world():
        return CarlaDataProvider._world


def _tick_seconds():
    return CarlaDataProvider.get_world().get_snapshot().timestamp.elapsed_seconds


class ROS2Agent(object):
    def __init__(self, carla_host=None, carla_port=None, debug=False):
        self.track = Track.SENSORS
        self.ros_entrypoint = self.get_ros_entrypoint()
        self._control_queue = queue.Queue(1)
        self._last_control_timestamp = None

    def setup(self, path_to_conf_file):
        pass

    @staticmethod
    def get_ros_version():
        return 2

    def _vehicle_control_cmd_callback(self, control_msg):
        stamp = control_msg.header.stamp.sec + control_msg.header.stamp.nanosec * 1e-9
        control = _vehicle_control(steer=control_msg.steer, throttle=control_msg.throttle, brake=control_msg.brake,
                                   hand_brake=control_msg.hand_brake, reverse=control_msg.reverse,
                                   manual_gear_shift=control_msg.manual_gear_shift, gear=control_msg.gear)
        if self._last_control_timestamp is not None and abs(self._last_control_timestamp - stamp) < EPSILON:
            print("WARNING: A new vehicle command with a repeated timestamp has been received {} .".format(stamp),
                  "This vehicle command will be ignored.")
            return
        tick = _tick_seconds()
        if abs(stamp - tick) > EPSILON:
            print("WARNING: Expecting a vehicle command with timestamp {} but the timestamp received was {} ."
                  .format(tick, stamp), "This vehicle command will be ignored.")
            return
        self._last_control_timestamp = stamp
        try:
            self._control_queue.put_nowait((stamp, control))
        except queue.Full:
            print("WARNING: A new vehicle command has been received while the previous one has not been yet "
                  "processed.", "This vehicle command will be ignored.")

    def run_step(self, _, timestamp):
        try:
            stamp, control = self._control_queue.get(True, 1.0)
        except queue.Empty:
            stamp, control = 0, _vehicle_control()
        tick = _tick_seconds()
        if abs(stamp - tick) > EPSILON:
            print("WARNING: Expecting a vehicle command with timestamp {} but the timestamp received was {} ."
                  .format(tick, stamp))
        return control


def import_ros2_agent():
    """The agent module: on Bench2Drive's own classes where they import, else on this stand-in (its ``leaderboard``
    and ``srunner`` modules are in ``sys.modules`` only while the agent module loads)."""
    if AGENT_MODULE in sys.modules or importlib.util.find_spec("leaderboard") is not None:
        return importlib.import_module(AGENT_MODULE)
    modules = {name: types.ModuleType(name) for name in _STAND_INS}
    modules["leaderboard.autoagents.autonomous_agent"].Track = Track
    modules["leaderboard.autoagents.ros2_agent"].ROS2Agent = ROS2Agent
    modules["srunner.scenariomanager.carla_data_provider"].CarlaDataProvider = CarlaDataProvider
    sys.modules.update(modules)
    try:
        return importlib.import_module(AGENT_MODULE)
    finally:
        for name in _STAND_INS:
            del sys.modules[name]
