"""Bench2Drive's ``ROS2Agent`` as far as a subclass sees it, for loading ``wamdiff_ros/carla_bridge/ros2_agent.py``
where Bench2Drive's leaderboard package is absent. Stdlib only, Python 3.7 syntax: test/py37 imports it too."""

import importlib
import importlib.util
import sys
import types

from wamdiff_ros.carla_bridge.agent import Track

AGENT_MODULE = "wamdiff_ros.carla_bridge.ros2_agent"
_LEADERBOARD = ("leaderboard", "leaderboard.autoagents", "leaderboard.autoagents.autonomous_agent",
                "leaderboard.autoagents.ros2_agent")


class ROS2Agent(object):
    """``__init__(host, port, debug)`` asks for the entry point (Bench2Drive then starts the bridge and the launch
    file)."""

    def __init__(self, carla_host=None, carla_port=None, debug=False):
        self.track = Track.SENSORS
        self.ros_entrypoint = self.get_ros_entrypoint()

    def setup(self, path_to_conf_file):
        pass

    @staticmethod
    def get_ros_version():
        return 2


def import_ros2_agent():
    """The agent module: on Bench2Drive's own classes where they import, else on this stand-in (its ``leaderboard``
    modules are in ``sys.modules`` only while the agent module loads)."""
    if AGENT_MODULE in sys.modules or importlib.util.find_spec("leaderboard") is not None:
        return importlib.import_module(AGENT_MODULE)
    modules = {name: types.ModuleType(name) for name in _LEADERBOARD}
    modules["leaderboard.autoagents.autonomous_agent"].Track = Track
    modules["leaderboard.autoagents.ros2_agent"].ROS2Agent = ROS2Agent
    sys.modules.update(modules)
    try:
        return importlib.import_module(AGENT_MODULE)
    finally:
        for name in _LEADERBOARD:
            del sys.modules[name]
