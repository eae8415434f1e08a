"""Bench2Drive's ROS 2 agent path: a ``ROS2Agent`` whose ROS graph is this package's (stdlib and Bench2Drive's own
modules only -- ``carla`` when a control comes --, Python 3.7 syntax: Bench2Drive imports it in CARLA 0.9.15's Python).

Bench2Drive (``leaderboard/autoagents/ros2_agent.py``) starts carla-ros-bridge (passive, synchronous), then runs
``ros2 launch <package> <launch_file> key:=value ...`` from ``get_ros_entrypoint()`` -- here
``launch/bench2drive.launch.py``: the planner node and the adapter
(``wamdiff_ros/ros/bridge/bench2drive_adapter.py``) --
spawns ``sensors()`` through the bridge, waits for ``/carla/hero/status``, publishes the route and takes one
``CarlaEgoVehicleControl`` per tick. ``get_ros_entrypoint`` runs in the base class's ``__init__``, before
``setup``: its launch arguments come from the environment (``WAMDIFF_MODEL``, ``WAMDIFF_DEVICE``,
``WAMDIFF_PLAN_TIMEOUT_S``).

Sensors: the thin agent's (``agent.py``: the front camera of the model card, IMU, GNSS, speedometer), with the ids
the adapter listens to. Bench2Drive 0.0.4's ROS path turns a sensor's roll / pitch / yaw (degrees) into a quaternion
as if they were radians, and the bridge reads the quaternion back in degrees; a non-zero angle is therefore given
here in radians so that the sensor is mounted at the intended angle in degrees.

**Tick contract.** Bench2Drive (0.0.4, ``ros_base_agent.py``) takes the controls in a one-slot ``queue.Queue(1)``:
its subscription callback drops, with a warning, a control whose stamp is not the world's current
``elapsed_seconds`` (within 1 ms) and puts the others with ``put_nowait`` (a full queue drops the new one);
``run_step`` takes one with a 1 s wait and warns when its stamp is not the tick's.
``agent_wrapper.ROSAgentWrapper.setup_sensors`` ticks the world once with no ``run_step`` after it. The ROS side
cannot tell that tick from the next (same topics, same messages) and answers it; its control then sat in the queue,
the next tick's control was dropped as "queue full", and every ``run_step`` returned the previous tick's control for
the whole route. Fixed here, the one place that knows which ticks a ``run_step`` reads:

- the queue ``run_step`` and the callback share is a ``TickControlSlot`` (the ``_control_queue`` property: Bench2Drive's
  own assignment in ``ROSBaseAgent.__init__`` installs it, before ``ROS2Agent.__init__`` subscribes): a newer tick's
  control replaces an older one that no ``run_step`` took, and ``get`` returns only the control stamped with the
  world's current tick (an older one is dropped), waiting for it up to Bench2Drive's 1 s;
- the control callback is this class's: one read of the world's tick per control; a control for an earlier tick
  (the ``setup_sensors`` tick's when the first tick came before it, or one past its ``run_step``'s 1 s) is dropped
  and counted (``late``) -- nothing waits for it, so Bench2Drive's "will be ignored" warning would only be noise --
  the tick's own goes into the slot as ``carla.VehicleControl``, as Bench2Drive's callback builds it.
- ``run_step`` stays Bench2Drive's: its 1 s wait and its stamp warning, which now fires only for a tick whose control
  did not come within 1 s.

So each ``run_step`` returns exactly its tick's control, whichever tick came before it and in whatever order the
bridge's messages arrived; a tick no ``run_step`` reads costs nothing. (The ROS side still answers each tick once,
stamped with it, from that tick's sensors: ``ros/bridge/bench2drive_adapter.py``.)

Leaderboard use: ``--agent=<repo>/wamdiff_ros/carla_bridge/ros2_agent.py`` with the package built in a sourced ROS 2
workspace (``colcon build``) and carla-ros-bridge's leaderboard-2.0 branch next to it.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    import wamdiff_ros  # noqa: F401
except ImportError:  # loaded by file path without the repository on PYTHONPATH
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from wamdiff_ros.carla_bridge.agent import AgentConfig  # noqa: E402
from wamdiff_ros.carla_bridge.frames import camera_pitch_carla  # noqa: E402

# Bench2Drive's classes and its scenario runner's world (the tests stand them in: test/bench2drive_stand_in.py)
from leaderboard.autoagents.autonomous_agent import Track  # noqa: E402
from leaderboard.autoagents.ros2_agent import ROS2Agent  # noqa: E402
from srunner.scenariomanager.carla_data_provider import CarlaDataProvider  # noqa: E402

PACKAGE, LAUNCH_FILE = "wamdiff_ros", "bench2drive.launch.py"
CAMERA_ID, IMU_ID, GNSS_ID, SPEED_ID = "rgb_front", "imu", "gnss", "speed"  # the adapter's defaults
EPSILON = 0.001  # s: Bench2Drive's stamp tolerance (ros_base_agent.EPSILON)


def world_tick_seconds() -> float:
    """The world's current tick, as Bench2Drive's callback and ``run_step`` read it (the snapshot, not GameTime)."""
    return CarlaDataProvider.get_world().get_snapshot().timestamp.elapsed_seconds


class TickControlSlot(object):
    """Bench2Drive's control queue held to the tick contract (the queue interface its callback and ``run_step``
    use: ``put_nowait``, ``get``). Items are ``(stamp_s, control)``.

    - ``put_nowait``: a control for a newer tick replaces the held one (a tick no ``run_step`` took: counted in
      ``replaced``); one for the held tick or an older one raises ``queue.Full``.
    - ``get(block, timeout)``: the held control if it is stamped with the world's current tick (``tick_seconds()``,
      within ``EPSILON``); an older one is dropped (``dropped``) and it waits, up to ``timeout``, for the tick's own;
      ``queue.Empty`` when none comes.
    """

    def __init__(self, tick_seconds: Callable[[], float] = world_tick_seconds) -> None:
        self._tick_seconds = tick_seconds
        self._cond = threading.Condition()
        self._item: Optional[Tuple[float, Any]] = None
        self.replaced = 0  # held controls of ticks no run_step took, replaced by a newer tick's
        self.dropped = 0  # held controls older than the tick a run_step asked for
        self.late = 0  # controls for a tick already past when they came (WamDiffROS2Agent's callback)
        self.repeated = 0  # a second control for the held tick (the first stands)

    def put_nowait(self, item: Tuple[float, Any]) -> None:
        with self._cond:
            if self._item is not None:
                if item[0] <= self._item[0] + EPSILON:
                    raise queue.Full
                self.replaced += 1
            self._item = item
            self._cond.notify_all()

    def put(self, item: Tuple[float, Any], block: bool = True, timeout: Optional[float] = None) -> None:
        self.put_nowait(item)

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Tuple[float, Any]:
        tick = self._tick_seconds()  # fixed while run_step waits: the world ticks only after it returns
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._item is not None:
                    if abs(self._item[0] - tick) <= EPSILON:
                        item, self._item = self._item, None
                        return item
                    if self._item[0] < tick:
                        self._item = None
                        self.dropped += 1
                left = None if end is None else end - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise queue.Empty
                self._cond.wait(left)

    def get_nowait(self) -> Tuple[float, Any]:
        return self.get(False)

    def qsize(self) -> int:
        with self._cond:
            return int(self._item is not None)

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return self.qsize() == 1


def get_entry_point() -> str:
    return "WamDiffROS2Agent"


class WamDiffROS2Agent(ROS2Agent):
    @property
    def _control_queue(self) -> TickControlSlot:
        """Bench2Drive's control queue: a ``TickControlSlot`` (module docstring: the tick contract)."""
        slot = self.__dict__.get("_wamdiff_control_slot")
        if slot is None:
            slot = self.__dict__["_wamdiff_control_slot"] = TickControlSlot()
        return slot

    @_control_queue.setter
    def _control_queue(self, bench2drive_queue: Any) -> None:
        # ROSBaseAgent.__init__ assigns queue.Queue(1) before ROS2Agent.__init__ subscribes: the slot takes its place
        self.__dict__["_wamdiff_control_slot"] = TickControlSlot()

    def _vehicle_control_cmd_callback(self, msg: Any) -> None:
        """Bench2Drive's control subscription (``ROS2Agent.__init__`` subscribes this method): the tick's control
        into the slot; an earlier tick's dropped and counted (module docstring)."""
        import carla  # Bench2Drive's interpreter has it; the module itself imports without it

        slot = self._control_queue
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        tick = world_tick_seconds()
        if stamp < tick - EPSILON:
            slot.late += 1
            return
        if stamp > tick + EPSILON:  # never from the package's control node (it stamps each control with its tick)
            print("WARNING: a vehicle command stamped {} is ahead of the world's tick {}; ignored".format(stamp, tick))
            return
        control = carla.VehicleControl(steer=msg.steer, throttle=msg.throttle, brake=msg.brake,
                                       hand_brake=msg.hand_brake, reverse=msg.reverse,
                                       manual_gear_shift=msg.manual_gear_shift, gear=msg.gear)
        try:
            slot.put_nowait((stamp, control))
        except queue.Full:
            slot.repeated += 1

    def setup(self, path_to_conf_file: str) -> None:
        self.track = Track.SENSORS

    def get_ros_entrypoint(self) -> Dict[str, Any]:
        """``ros2 launch wamdiff_ros bench2drive.launch.py`` with the model and limits from the environment."""
        env = os.environ
        return {
            "package": PACKAGE,
            "launch_file": LAUNCH_FILE,
            "parameters": {
                "model": env.get("WAMDIFF_MODEL", "wamdiff-tiny"),
                "device": env.get("WAMDIFF_DEVICE", "cpu"),
                "plan_timeout_s": env.get("WAMDIFF_PLAN_TIMEOUT_S", "0.5"),
                "role_name": "hero",
                "camera_id": CAMERA_ID,
            },
        }

    def sensors(self) -> List[Dict[str, Any]]:
        cfg = AgentConfig()  # the model card's camera (the thin agent's defaults)
        zero = {"x": 0.0, "y": 0.0, "z": 0.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}
        pitch = math.radians(camera_pitch_carla(cfg.camera_pitch_deg))  # radians: Bench2Drive 0.0.4's slip (above)
        return [
            {"type": "sensor.camera.rgb", "id": CAMERA_ID, "x": cfg.camera_x_m, "y": cfg.camera_y_m,
             "z": cfg.camera_z_m, "roll": 0.0, "pitch": pitch, "yaw": 0.0,
             "width": cfg.camera_width, "height": cfg.camera_height, "fov": cfg.camera_fov_deg},
            dict(zero, type="sensor.other.imu", id=IMU_ID),
            {"type": "sensor.other.gnss", "id": GNSS_ID, "x": 0.0, "y": 0.0, "z": 0.0},
            {"type": "sensor.speedometer", "id": SPEED_ID},
        ]
