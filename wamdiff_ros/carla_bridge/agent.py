"""The Bench2Drive / CARLA leaderboard agent: a thin client of ``wamdiff-serve``.

The leaderboard runs its agent inside CARLA 0.9.15's Python (3.7 / 3.8), where torch 2.x and transformers cannot
run; so this module is stdlib + numpy, Python 3.7 syntax, and imports no torch (nor any package module that does).
Each step it turns the sensors into the planner's inputs (RGB image, ego state, pose, navigation command from the
route), asks the server -- a ``PLAN`` every ``plan_every_n_steps`` steps, a ``CONTROL`` (follower only) between --
and returns the server's control as a ``carla.VehicleControl``. No answer within ``timeout_s``, or an error: full
brake, counted. Frames: ``wamdiff_ros.carla_bridge.frames``. Each plan request also carries the dense route from
``route_behind_m`` behind the ego to ``route_ahead_m`` ahead of it along the route (``route_xy``, ego frame, at most
``route_max_points``); the server's planner decides whether its model uses it.

Leaderboard use: ``--agent=<repo>/wamdiff_ros/carla_bridge/agent.py --agent-config=<repo>/config/bench2drive_agent.yaml``
(the leaderboard imports this file by path; the repository root is put on ``sys.path`` when needed). Bench2Drive
passes ``<config>+<save_name>`` to ``setup``; ``metric_info.json`` then goes to ``<SAVE_PATH>/<save_name>/``.
"""

from __future__ import annotations

import enum
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

try:
    import wamdiff_ros  # noqa: F401
except ImportError:  # loaded by file path without the repository on PYTHONPATH
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from wamdiff_ros.carla_bridge import frames, messages, protocol  # noqa: E402
from wamdiff_ros.carla_bridge.client import PlannerClient, RemoteError, ServerUnavailableError  # noqa: E402
from wamdiff_ros.carla_bridge.localization import PoseFilter  # noqa: E402
from wamdiff_ros.carla_bridge.metric_log import MetricLog, resolve_directory  # noqa: E402
from wamdiff_ros.carla_bridge.route import RouteCommands, to_ego_frame  # noqa: E402
from wamdiff_ros.errors import FieldError  # noqa: E402

try:
    import carla
except ImportError:  # the module must import without CARLA (tests, tools); run_step then returns the stand-in
    carla = None

try:
    from leaderboard.autoagents.autonomous_agent import AutonomousAgent, Track
except ImportError:

    class Track(enum.Enum):
        SENSORS = "SENSORS"
        MAP = "MAP"

    class AutonomousAgent(object):
        """Stand-in for ``leaderboard.autoagents.autonomous_agent.AutonomousAgent`` with the same interface, used
        when the leaderboard package is not importable (tests, driving the agent from your own loop)."""

        def __init__(self, carla_host: Optional[str] = None, carla_port: Optional[int] = None,
                     debug: bool = False) -> None:
            self.track = Track.SENSORS
            self._global_plan = None  # type: Optional[list]
            self._global_plan_world_coord = None  # type: Optional[list]
            self.wallclock_t0 = None

        def setup(self, path_to_conf_file: str) -> None:
            pass

        def sensors(self) -> List[Dict[str, Any]]:
            return []

        def run_step(self, input_data: Dict[str, Any], timestamp: float) -> Any:
            return make_control(0.0, 0.0, 0.0)

        def destroy(self) -> None:
            pass

        def set_global_plan(self, global_plan_gps: list, global_plan_world_coord: list) -> None:
            self._global_plan = global_plan_gps
            self._global_plan_world_coord = global_plan_world_coord

        @staticmethod
        def get_ros_version() -> int:
            return -1


class _VehicleControl(object):
    """``carla.VehicleControl``'s fields, when carla is not importable."""

    def __init__(self, throttle: float = 0.0, steer: float = 0.0, brake: float = 0.0) -> None:
        self.throttle, self.steer, self.brake = throttle, steer, brake
        self.hand_brake, self.reverse, self.manual_gear_shift, self.gear = False, False, False, 0

    def __repr__(self) -> str:
        return "VehicleControl(throttle=%.3f, steer=%.3f, brake=%.3f)" % (self.throttle, self.steer, self.brake)


def make_control(throttle: float, steer: float, brake: float) -> Any:
    """A ``carla.VehicleControl`` in range: throttle and brake in [0, 1], steer in [-1, 1], never throttle and brake
    together; NaN becomes a full brake."""
    values = [throttle, steer, brake]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        throttle, steer, brake = 0.0, 0.0, 1.0
    throttle = min(max(float(throttle), 0.0), 1.0)
    steer = min(max(float(steer), -1.0), 1.0)
    brake = min(max(float(brake), 0.0), 1.0)
    if brake > 0.0:
        throttle = 0.0
    cls = carla.VehicleControl if carla is not None else _VehicleControl
    return cls(throttle=throttle, steer=steer, brake=brake)


def get_entry_point() -> str:
    return "WamDiffAgent"


# ----------------------------------------------------------------------------------------------------------------
# Configuration

CAMERA_ID, IMU_ID, GNSS_ID, SPEED_ID = "rgb_front", "IMU", "GPS", "SPEED"

# The model card's camera: wamdiff_ros.world.camera.CameraConfig's defaults (a test holds them equal).
DEFAULTS = {
    "server": protocol.DEFAULT_ADDRESS,  # host:port or unix:///path
    "timeout_s": 2.0,  # per request; no reply by then -> full brake
    "connect_timeout_s": 1.0,
    "plan_every_n_steps": 4,  # 20 Hz simulation, 5 Hz planning as in the closed-loop world; the follower runs at 20 Hz
    "image_encoding": "rgb8",  # or png (smaller, for a server on another host)
    "camera_width": 256,
    "camera_height": 128,
    "camera_fov_deg": 90.0,
    "camera_x_m": 1.0,  # ahead of the vehicle's origin
    "camera_y_m": 0.0,
    "camera_z_m": 1.5,  # above the ground
    "camera_pitch_deg": 5.0,  # down (CARLA's sensor pitch is the negative)
    "command_lookahead_m": 60.0,
    "command_hold_m": 10.0,
    "route_behind_m": 5.0,  # route_xy (for a model that wants route points): this far behind the ego's progress ...
    "route_ahead_m": 45.0,  # ... to this far ahead (the route points lie 10 m and 30 m ahead)
    "route_max_points": 100,  # subsampled to at most this many (protocol limit: messages.MAX_ROUTE_POINTS)
    "gnss_gain": 0.05,
    "max_imu_acceleration_mps2": 15.0,  # the IMU spikes on spawn and collisions
    "metric_dir": None,  # metric_info.json goes to <metric_dir>/<save_name>/ (env WAMDIFF_METRIC_DIR, SAVE_PATH)
    "log_every_n": 20,  # a repeated failure is logged on its 1st, Nth, 2Nth... occurrence
}
_INTEGER_KEYS = ("camera_width", "camera_height", "plan_every_n_steps", "log_every_n", "route_max_points")
_STRING_KEYS = ("server", "image_encoding", "metric_dir")
ENV_OVERRIDES = (("WAMDIFF_SERVER", "server"), ("WAMDIFF_TIMEOUT_S", "timeout_s"),
                 ("SAVE_PATH", "metric_dir"), ("WAMDIFF_METRIC_DIR", "metric_dir"))  # later wins


class AgentConfig(object):
    """The agent's settings: ``DEFAULTS`` <- the config file <- the environment (``ENV_OVERRIDES``)."""

    def __init__(self, values: Optional[Dict[str, Any]] = None) -> None:
        merged = dict(DEFAULTS)
        for key, value in (values or {}).items():
            if key not in DEFAULTS:
                raise FieldError(key, "unknown agent setting; known: %s" % ", ".join(sorted(DEFAULTS)))
            merged[key] = _checked(key, value)
        self.__dict__.update(merged)
        protocol.parse_address(self.server)

    def as_dict(self) -> Dict[str, Any]:
        return {key: getattr(self, key) for key in DEFAULTS}


def _checked(key: str, value: Any) -> Any:
    if key in _STRING_KEYS:
        if value is None and key == "metric_dir":
            return None
        if not isinstance(value, str) or not value:
            raise FieldError(key, "expected a non-empty string, got %r" % (value,))
        if key == "image_encoding" and value not in protocol.IMAGE_ENCODINGS:
            raise FieldError(key, "expected one of %s, got %r" % (", ".join(protocol.IMAGE_ENCODINGS), value))
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise FieldError(key, "expected a number, got %r" % value) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(key, "expected a finite number, got %r" % (value,))
    if key in _INTEGER_KEYS:
        if value != int(value) or value < 1:
            raise FieldError(key, "expected a whole number >= 1, got %r" % (value,))
        if key == "route_max_points" and not 2 <= value <= messages.MAX_ROUTE_POINTS:
            raise FieldError(key, "expected a whole number in 2..%d, got %r" % (messages.MAX_ROUTE_POINTS, value))
        return int(value)
    if key == "gnss_gain" and not 0.0 < value <= 1.0:
        raise FieldError(key, "expected a value in (0, 1], got %r" % (value,))
    if key in ("timeout_s", "connect_timeout_s", "camera_fov_deg", "command_lookahead_m",
               "max_imu_acceleration_mps2", "route_ahead_m") and not value > 0:
        raise FieldError(key, "must be > 0, got %r" % (value,))
    if key == "route_behind_m" and not value >= 0:
        raise FieldError(key, "must be >= 0, got %r" % (value,))
    return float(value)


def split_conf_argument(path_to_conf_file: str) -> Tuple[str, Optional[str]]:
    """Bench2Drive passes ``<config path>+<save_name>``; other leaderboards the path alone."""
    text = path_to_conf_file or ""
    if text and not os.path.exists(text) and "+" in text:
        path, _, save_name = text.rpartition("+")
        return path, save_name or None
    return text, None


def read_config_file(path: str) -> Dict[str, Any]:
    """A flat mapping from JSON or YAML (PyYAML when installed, else plain ``key: value`` lines)."""
    if not path:
        return {}
    if not os.path.isfile(path):
        raise FieldError("path_to_conf_file", "no such config file: %r" % path)
    with open(path, "r") as f:
        text = f.read()
    if path.endswith(".json"):
        data = json.loads(text)
    else:
        try:
            import yaml
        except ImportError:
            data = _flat_yaml(text, path)
        else:
            data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FieldError("path_to_conf_file", "%s: expected a mapping of settings" % path)
    return data


def _flat_yaml(text: str, path: str) -> Dict[str, Any]:
    out = {}  # type: Dict[str, Any]
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        key, sep, raw = line.partition(":")
        if not sep:
            raise FieldError("path_to_conf_file", "%s:%d: expected 'key: value'" % (path, number))
        raw = raw.strip().strip("'\"") if raw.strip()[:1] in "'\"" else raw.strip()
        value = None if raw in ("", "null", "~") else raw  # type: Any
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                try:
                    value = float(value)
                except ValueError:
                    pass
        out[key.strip()] = value
    return out


def load_config(path_to_conf_file: str, environ: Optional[Dict[str, str]] = None) -> Tuple[AgentConfig, Optional[str]]:
    """(config, save_name) from ``setup``'s argument and the environment."""
    path, save_name = split_conf_argument(path_to_conf_file)
    values = read_config_file(path)
    env = os.environ if environ is None else environ
    for var, key in ENV_OVERRIDES:
        if env.get(var):
            values[key] = env[var]
    return AgentConfig(values), save_name


# ----------------------------------------------------------------------------------------------------------------
# The agent


class WamDiffAgent(AutonomousAgent):
    def setup(self, path_to_conf_file: str) -> None:
        self.track = Track.SENSORS
        self.config, self.save_name = load_config(path_to_conf_file)
        cfg = self.config
        self.client = PlannerClient(cfg.server, cfg.timeout_s, min(cfg.connect_timeout_s, cfg.timeout_s))
        self.step = -1
        self.counters = {"steps": 0, "plans": 0, "controls": 0, "timeouts": 0, "errors": 0, "superseded": 0,
                         "brakes": 0}
        self.last_latency_s = None  # type: Optional[float]
        self.last_command = "follow"
        self._pose = PoseFilter(cfg.gnss_gain)
        self._plan_due = True
        self._last_plan_step = None  # type: Optional[int]
        self._needs_reset = True
        self._warned = set()  # type: set
        if not hasattr(self, "_route_gps"):
            self._route_gps, self._route_world = [], []  # type: list, list
        self._build_route()
        directory = resolve_directory(cfg.metric_dir, self.save_name)
        self.metric_log = MetricLog(directory) if directory else None

    def set_global_plan(self, global_plan_gps: list, global_plan_world_coord: list) -> None:
        super(WamDiffAgent, self).set_global_plan(global_plan_gps, global_plan_world_coord)
        # The leaderboard keeps a copy downsampled to 50 m; the command needs the dense route.
        self._route_gps = list(global_plan_gps or [])
        self._route_world = list(global_plan_world_coord or [])
        if hasattr(self, "config"):  # set after setup (older leaderboards)
            self._build_route()
            self._needs_reset = True

    def _build_route(self) -> None:
        """The route in our world frame: GPS around the route's first point, shifted onto CARLA's world coordinates
        (converted) when the route gives them, so poses read like the simulator's."""
        self._projection, self._offset, self._route = None, (0.0, 0.0), None
        self._pose.reset()
        if not self._route_gps:
            return
        first = self._route_gps[0][0]
        self._projection = frames.GeoProjection(first["lat"], first["lon"])
        if self._route_world:
            loc = getattr(self._route_world[0][0], "location", None)
            if loc is not None:
                self._offset = frames.pose_from_carla(loc.x, loc.y, 0.0)[:2]
        points = [self._local(g["lat"], g["lon"]) for g, _ in self._route_gps]
        self._route = RouteCommands(points, [option for _, option in self._route_gps],
                                    self.config.command_lookahead_m, self.config.command_hold_m)

    def _local(self, lat: float, lon: float) -> Tuple[float, float]:
        east, north = self._projection.to_local(lat, lon)
        return east + self._offset[0], north + self._offset[1]

    def sensors(self) -> List[Dict[str, Any]]:
        cfg = self.config if hasattr(self, "config") else AgentConfig()
        zero = {"x": 0.0, "y": 0.0, "z": 0.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}
        return [
            {"type": "sensor.camera.rgb", "id": CAMERA_ID, "x": cfg.camera_x_m, "y": cfg.camera_y_m,
             "z": cfg.camera_z_m, "roll": 0.0, "pitch": frames.camera_pitch_carla(cfg.camera_pitch_deg), "yaw": 0.0,
             "width": cfg.camera_width, "height": cfg.camera_height, "fov": cfg.camera_fov_deg},
            dict(zero, type="sensor.other.imu", id=IMU_ID, sensor_tick=0.05),
            dict(zero, type="sensor.other.gnss", id=GNSS_ID, sensor_tick=0.01),
            {"type": "sensor.speedometer", "id": SPEED_ID, "reading_frequency": 20},
        ]

    # -- one step ----------------------------------------------------------------------------------------------
    def run_step(self, input_data: Dict[str, Any], timestamp: float) -> Any:
        self.step += 1
        self.counters["steps"] += 1
        record = {"t": float(timestamp), "request": "none", "ok": False}  # type: Dict[str, Any]
        try:
            rgb, ego, command = self._observe(input_data, float(timestamp))
            record.update(speed=ego["speed"], command=command, pose=[round(v, 3) for v in ego["pose"]])
            control, record["request"], record["latency_s"] = self._ask(rgb, ego, command)
            record["ok"] = True
        except protocol.ReplyTimeoutError as exc:
            control = self._fail("timeouts", exc)
        except RemoteError as exc:
            control = self._fail("superseded" if exc.code == protocol.ErrorCode.SUPERSEDED.value else "errors", exc)
        except Exception as exc:  # a bad sensor frame or a lost server must never stop the route: brake
            control = self._fail("errors", exc)
        record["control"] = [round(control.throttle, 4), round(control.steer, 4), round(control.brake, 4)]
        self._write_metrics(record)
        return control

    def _observe(self, input_data: Dict[str, Any], t: float) -> Tuple[np.ndarray, Dict[str, Any], str]:
        cfg = self.config
        bgra = np.asarray(input_data[CAMERA_ID][1])
        if bgra.ndim != 3 or bgra.shape[2] < 3:
            raise FieldError(CAMERA_ID, "expected an HxWx4 BGRA image, got shape %s" % (bgra.shape,))
        if bgra.shape[:2] != (cfg.camera_height, cfg.camera_width):
            self._warn_once("camera size", "camera frame is %dx%d, the model card's is %dx%d"
                            % (bgra.shape[1], bgra.shape[0], cfg.camera_width, cfg.camera_height))
        rgb = np.ascontiguousarray(bgra[:, :, 2::-1], dtype=np.uint8)
        speed = float(input_data[SPEED_ID][1]["speed"])
        imu = [float(v) for v in input_data[IMU_ID][1]]
        lat, lon = (float(v) for v in list(input_data[GNSS_ID][1])[:2])
        if not math.isfinite(speed):
            speed = 0.0
        limit = cfg.max_imu_acceleration_mps2
        acceleration = tuple(min(max(a, -limit), limit) if math.isfinite(a) else 0.0
                             for a in frames.ego_acceleration_from_imu(imu[0], imu[1]))
        heading = frames.heading_from_compass(imu[6]) if math.isfinite(imu[6]) else None
        position = None  # type: Optional[Tuple[float, float]]
        if math.isfinite(lat) and math.isfinite(lon):
            if self._projection is None:  # no route: the first fix is the origin
                self._projection = frames.GeoProjection(lat, lon)
            position = self._local(lat, lon)
        pose = self._pose.update(position, heading, speed, t)
        command = self._route.update(pose[0], pose[1]) if self._route is not None else "follow"
        self.last_command = command
        return rgb, messages.ego_fields((speed, 0.0), acceleration, speed, pose, t), command

    def _ask(self, rgb: np.ndarray, ego: Dict[str, Any], command: str) -> Tuple[Any, str, Optional[float]]:
        cfg = self.config
        if self._needs_reset:
            self.client.reset("new route" if self._route is not None else "new episode")
            self._needs_reset = False
        due = self._plan_due or self._last_plan_step is None or self.step - self._last_plan_step >= cfg.plan_every_n_steps
        started = time.perf_counter()
        if due:
            self._plan_due = True  # until a plan reply arrives
            route_xy = self.route_xy(ego["pose"])
            reply = self.client.plan(rgb.tobytes(), rgb.shape[0], rgb.shape[1], ego, command, cfg.image_encoding,
                                     route_xy=route_xy)
            self._plan_due, self._last_plan_step = False, self.step
            self.counters["plans"] += 1
            self.last_latency_s = time.perf_counter() - started
            kind = "plan"
        else:
            reply = self.client.control(ego)
            self.counters["controls"] += 1
            kind = "control"
        c = reply["control"]
        if not all(key in c for key in ("throttle", "steer", "brake")):
            raise FieldError("control", "the server's reply has no throttle / steer / brake: start it with --world carla")
        if c["brake"] > 0.0:
            self.counters["brakes"] += 1
        return make_control(c["throttle"], c["steer"], c["brake"]), kind, time.perf_counter() - started

    def route_xy(self, pose: Tuple[float, float, float]) -> Optional[List[List[float]]]:
        """The dense route around the ego's progress (``route_behind_m`` behind to ``route_ahead_m`` ahead, at most
        ``route_max_points``) in the ego frame of ``pose``: a plan request's ``route_xy``. None without a route or
        when it cannot be sent (warned once: the plan goes ahead without it)."""
        if self._route is None:
            return None
        cfg = self.config
        try:
            points = to_ego_frame(self._route.points_around(cfg.route_behind_m, cfg.route_ahead_m,
                                                            cfg.route_max_points), pose)
            return messages.check_route_xy({"route_xy": points})
        except (FieldError, ValueError, TypeError) as exc:
            self._warn_once("route_xy", "cannot send the route to the planner: %s" % (exc,))
            return None

    def _fail(self, kind: str, exc: BaseException) -> Any:
        self.counters[kind] += 1
        self.counters["brakes"] += 1
        if kind != "superseded":
            self._plan_due = True
        n = self.counters[kind]
        if n == 1 or n % self.config.log_every_n == 0:
            print("WamDiffAgent: step %d: %s #%d -> full brake: %s" % (self.step, kind, n, exc), flush=True)
        if isinstance(exc, ServerUnavailableError):
            self._needs_reset = True  # a new connection is a new session on the server
        return make_control(0.0, 0.0, 1.0)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print("WamDiffAgent: %s" % message, flush=True)

    def _write_metrics(self, record: Dict[str, Any]) -> None:
        if self.metric_log is None:
            return
        entry = {}  # type: Dict[str, Any]
        if getattr(self, "hero_actor", None) is not None and hasattr(self, "get_metric_info"):
            try:
                entry.update(self.get_metric_info())  # Bench2Drive's fields for its comfort metrics
            except Exception as exc:
                self._warn_once("metric info", "get_metric_info failed: %r" % (exc,))
        record["counters"] = dict(self.counters)
        entry["wamdiff"] = record
        try:
            self.metric_log.write(self.step, entry)
        except (OSError, ValueError, TypeError) as exc:
            self._warn_once("metric log", "cannot write %s: %r" % (self.metric_log.path, exc))

    def destroy(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        if getattr(self, "metric_log", None) is not None:
            self.metric_log.close()
        print("WamDiffAgent: route done: %s" % json.dumps(getattr(self, "counters", {})), flush=True)
