"""``wamdiff-serve``: the planner as a process of its own, for simulators whose Python cannot run torch (the
Bench2Drive leaderboard runs CARLA 0.9.15's Python 3.7/3.8). Wire format: ``wamdiff_ros.carla_bridge.protocol``.

One thread per client connection reads frames; plans are made one at a time (one lock around the planner). On a
connection, the newest plan request wins: requests queued while the planner was busy are answered ``superseded``
without work, only the newest is planned. Each connection has its own waypoint follower (the agent stays thin): a
plan reply carries the control for the request's ego state, and ``CONTROL`` requests step the follower on the last
plan between plans. The follower is reset by a ``RESET`` message (new route / episode) or a jump in sim time.

The agent sends the route near the ego (``route_xy``, ego frame) with each plan request when it has one, and the
server plans with ``route=route_points_ahead(route_xy, (0, 0), 0)``; the Planner decides whether its model's prompt
takes them. A route that yields no points is counted as a bad input (the plan goes ahead without them).

Diagnostics (``STATUS``) use the planner node's counter names (``wamdiff_ros.stats.Counters``) with the same
meaning: ``frames`` plan requests received, ``planned``, ``dropped`` requests superseded by a newer one before the
planner took them, ``late`` requests past their deadline (``skipped.timeout``: not planned at all), ``fallback``
invalid plans (the follower brakes), ``bad_input`` bad frames, messages or planner inputs, ``errors`` model errors,
``resets`` follower resets; ``inference_p50_ms`` / ``inference_p99_ms`` / ``last_inference_ms``; ``route_used``
plans requested with route points.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.carla_bridge import messages, protocol
from wamdiff_ros.carla_bridge.protocol import ErrorCode, Frame, MessageType
from wamdiff_ros.control import CarlaActuator, FollowerGains, HighwayEnvActuator, TrackedPlan, WaypointFollower
from wamdiff_ros.control.hold import ValidPlan, held_waypoints
from wamdiff_ros.errors import FieldError, InputError, RouteError, WamDiffError
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.input_guard import RepeatedFrameGate
from wamdiff_ros.route_points import route_points_ahead
from wamdiff_ros.stats import Counters, LatencyWindow

WORLDS = ("carla", "highway_env")
_POLL_S = 0.2  # how often blocked threads look at the stop flag


@dataclass(frozen=True, slots=True)
class ServeConfig:
    world: str = "carla"  # the follower's gains and actuator
    idle_timeout_s: float = 600.0  # a connection silent this long is closed (loading a CARLA town takes minutes)
    frame_timeout_s: float = 5.0  # a started frame must be complete within this
    request_timeout_s: float = 10.0  # a plan request's deadline unless it names its own (``deadline_s``)
    send_timeout_s: float = 5.0
    max_payload_bytes: int = protocol.DEFAULT_MAX_PAYLOAD_BYTES
    max_time_gap_s: float = 1.0  # sim time jumping further (or back) resets the follower
    # A plan request whose image repeats the last planned one byte for byte while the car moves (a frozen camera, e.g.
    # Bench2Drive-Robust's cached frame drop) is not planned: the session keeps following its last valid plan while
    # that is at most max_plan_age_s old, then brakes (the node's parameters of the same names).
    repeated_frame_check: bool = False
    repeated_frame_min_speed: float = 0.5
    max_plan_age_s: float = 1.0
    actuation_delay_s: float | None = None  # the follower's (gains file's when None): a known control latency, e.g.
    # Bench2Drive-Robust's control FIFO of k ticks = k x 0.05 s

    def __post_init__(self) -> None:
        if self.world not in WORLDS:
            raise FieldError("world", f"expected one of {', '.join(WORLDS)}, got {self.world!r}")
        for f in dataclasses.fields(self):
            if f.name == "actuation_delay_s":
                if self.actuation_delay_s is not None and not 0.0 <= self.actuation_delay_s <= 2.0:
                    raise FieldError(f.name, f"expected seconds in [0, 2], got {self.actuation_delay_s!r}")
            elif f.name not in ("world", "repeated_frame_check") and not getattr(self, f.name) > 0:
                raise FieldError(f.name, f"must be > 0, got {getattr(self, f.name)!r}")


class Session:
    """One connection's follower: the plan it tracks and the controllers' state."""

    def __init__(self, gains: FollowerGains, world: str, max_time_gap_s: float, repeated_frame_min_speed: float = 0.5
                 ) -> None:
        self.follower = WaypointFollower(gains)
        self._carla = CarlaActuator(gains) if world == "carla" else None
        self._wheel = HighwayEnvActuator(gains)  # clipped acceleration and front-wheel angle, our convention
        self.max_time_gap_s = max_time_gap_s
        self.plan: TrackedPlan | None = None
        self.last_valid: TrackedPlan | None = None  # the last valid plan the model made (what a repeat holds)
        self.gate = RepeatedFrameGate(repeated_frame_min_speed)
        self.last_t: float | None = None

    def reset(self) -> None:
        self.follower.reset()
        self.gate.reset()
        self.plan, self.last_valid, self.last_t = None, None, None

    def time_jumped(self, t: float) -> bool:
        """Resets (and says so) when ``t`` goes back or jumps ahead of the last step."""
        if self.last_t is not None and (t < self.last_t - 1e-6 or t - self.last_t > self.max_time_gap_s):
            self.reset()
            return True
        return False

    def control(self, ego: dict) -> dict:
        t = ego["t"]
        c = self.follower.step(self.plan, Pose2D(*ego["pose"]), ego["speed"], t)
        self.last_t = t
        acceleration, steer_rad = self._wheel(c)
        out = {"acceleration": acceleration, "steer_rad": steer_rad, "braking": bool(c.brake), "reason": c.reason,
               "target_speed": c.target_speed}
        if self._carla is not None:
            throttle, steer, brake = self._carla(c)
            out.update(throttle=throttle, steer=steer, brake=brake)
        return out


@dataclass(slots=True)
class _PlanJob:
    frame: Frame
    ego: dict
    command: str
    image: np.ndarray
    received: float  # time.monotonic()
    route_xy: list | None = None  # the request's optional route near the ego, ego frame


class PlannerServer:
    def __init__(self, planner, config: ServeConfig = ServeConfig(), model_name: str = "") -> None:
        """``planner``: anything with ``plan(image, EgoState, command, route=None) -> Plan`` (a
        ``wamdiff_ros.planner.Planner``); ``route``: the route points, or None."""
        from wamdiff_ros.planner import EgoState  # torch, only where a model runs

        self._ego_state = EgoState
        self.planner, self.config, self.model_name = planner, config, model_name
        self.gains = FollowerGains.for_world(config.world)
        if config.actuation_delay_s is not None:
            self.gains = dataclasses.replace(self.gains, actuation_delay_s=config.actuation_delay_s)
        self.counters = Counters()
        self.dropped = 0
        self.controls = 0
        self.connections = 0
        self.route_used = 0  # plans requested with route points
        self.inference = LatencyWindow()
        self.last_inference_s = math.nan
        self.address = ""
        self._stats = threading.Lock()
        self._planner_lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._unix_path: str | None = None
        self._threads: list[threading.Thread] = []

    # -- listening -------------------------------------------------------------------------------------------------
    def bind(self, host: str = "127.0.0.1", port: int = protocol.DEFAULT_PORT, unix: str | None = None) -> str:
        if unix:
            if os.path.exists(unix) and stat.S_ISSOCK(os.stat(unix).st_mode):
                os.unlink(unix)  # a stale socket of an earlier run
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(unix)
            self._unix_path = unix
            self.address = protocol.format_address("unix", unix)
        else:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            self.address = protocol.format_address("tcp", (host, sock.getsockname()[1]))
        sock.listen(8)
        self._listener = sock
        return self.address

    def serve_forever(self) -> None:
        if self._listener is None:
            raise RuntimeError("bind() first")
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([self._listener], [], [], _POLL_S)
                if not readable:
                    continue
                try:
                    sock, peer = self._listener.accept()
                except OSError:
                    continue
                with self._stats:
                    self.connections += 1
                thread = threading.Thread(target=self._serve_connection, args=(sock, str(peer or "unix")),
                                          name="wamdiff-serve-conn", daemon=True)
                thread.start()
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        finally:
            self._listener.close()
            for thread in self._threads:
                thread.join(timeout=5.0)
            if self._unix_path and os.path.exists(self._unix_path):
                os.unlink(self._unix_path)

    def stop(self) -> None:
        """Signal-safe: the accept loop and the connections end within ``_POLL_S`` (a plan in progress finishes)."""
        self._stop.set()

    # -- diagnostics -----------------------------------------------------------------------------------------------
    def status_values(self) -> dict:
        with self._stats:
            c = self.counters
            values = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "reasons"}
            values.update({f"skipped.{k}": v for k, v in c.reasons.items()})
            values["dropped"] = self.dropped
            values["controls"] = self.controls
            values["connections"] = self.connections
            values["route_used"] = self.route_used
        for q in (50, 99):
            p = self.inference.percentile(q)
            values[f"inference_p{q}_ms"] = round(1e3 * p, 3) if math.isfinite(p) else None
        last = self.last_inference_s
        values["last_inference_ms"] = round(1e3 * last, 3) if math.isfinite(last) else None
        values["model"] = self.model_name
        values["world"] = self.config.world
        return values

    def _count(self, **increments: int) -> None:
        with self._stats:
            for name, n in increments.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)

    def _log(self, message: str) -> None:
        print(f"wamdiff-serve: {message}", file=sys.stderr, flush=True)

    # -- one connection --------------------------------------------------------------------------------------------
    def _serve_connection(self, sock: socket.socket, peer: str) -> None:
        cfg = self.config
        reader = protocol.FrameReader(sock, cfg.max_payload_bytes, cfg.frame_timeout_s)
        session = Session(self.gains, cfg.world, cfg.max_time_gap_s, cfg.repeated_frame_min_speed)
        last_frame = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    first = reader.next(_POLL_S)
                except protocol.ReplyTimeoutError:
                    if time.monotonic() - last_frame > cfg.idle_timeout_s:
                        self._log(f"closing {peer}: idle for {cfg.idle_timeout_s:.0f} s")
                        return
                    continue
                except protocol.MalformedMessageError as exc:
                    first = exc
                last_frame = time.monotonic()
                plans = self._handle_batch(sock, session, [first] + reader.drain())
                if plans:
                    self._plan_newest(sock, reader, session, plans)
        except protocol.ConnectionClosedError:
            pass
        except protocol.ProtocolError as exc:  # framing lost: say why, then close
            self._count(bad_input=1)
            self._set_error(f"{peer}: {exc}")
            self._reply_error(sock, exc.request_id or 0, ErrorCode.BAD_FRAME, str(exc), exc.field)
            self._log(f"closing {peer}: {exc}")
        except OSError as exc:
            self._log(f"connection {peer} lost: {exc}")
        finally:
            sock.close()

    def _handle_batch(self, sock: socket.socket, session: Session, items: list) -> list[_PlanJob]:
        """Answers everything but plan requests; returns the valid plan requests, oldest first."""
        plans: list[_PlanJob] = []
        for item in items:
            if isinstance(item, protocol.MalformedMessageError):
                self._count(bad_input=1)
                self._set_error(str(item))
                self._reply_error(sock, item.request_id or 0, ErrorCode.BAD_FRAME, str(item), item.field)
                continue
            frame: Frame = item
            try:
                if frame.msg_type == MessageType.PLAN:
                    self._count(frames=1)
                    plans.append(self._plan_job(frame))
                elif frame.msg_type == MessageType.CONTROL:
                    self._control(sock, session, frame)
                elif frame.msg_type == MessageType.RESET:
                    session.reset()
                    self._count(resets=1)
                    self._reply(sock, MessageType.RESET_REPLY, frame.request_id,
                                {"reset": True})
                elif frame.msg_type == MessageType.STATUS:
                    self._reply(sock, MessageType.STATUS_REPLY, frame.request_id, {"values": self.status_values()})
                else:
                    self._reply_error(sock, frame.request_id, ErrorCode.UNSUPPORTED,
                                      f"{frame.msg_type.name} is not a request", "message type")
            except protocol.MalformedMessageError as exc:
                self._count(bad_input=1)
                self._set_error(str(exc))
                self._reply_error(sock, frame.request_id, ErrorCode.BAD_FRAME, str(exc), exc.field)
        return plans

    def _plan_job(self, frame: Frame) -> _PlanJob:
        h, rid = frame.header, frame.request_id
        ego = messages.check_ego(h, rid)
        command = messages.check_command(h, rid)
        encoding, height, width = messages.check_image(h, frame.payload, rid)
        if encoding == "rgb8":
            image = np.frombuffer(frame.payload, dtype=np.uint8).reshape(height, width, 3)
        else:
            from PIL import Image

            try:
                with Image.open(io.BytesIO(frame.payload)) as img:
                    image = np.asarray(img.convert("RGB"))
            except Exception as exc:
                raise protocol.MalformedMessageError("payload", f"PNG does not decode: {exc}", rid) from None
            if image.shape[:2] != (height, width):
                raise protocol.MalformedMessageError(
                    "image", f"PNG is {image.shape[1]}x{image.shape[0]}, the header says {width}x{height}", rid)
        deadline = h.get("deadline_s", self.config.request_timeout_s)
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not deadline > 0:
            raise protocol.MalformedMessageError("deadline_s", f"expected seconds > 0, got {deadline!r}", rid)
        route_xy = messages.check_route_xy(h, rid)
        return _PlanJob(frame, ego, command, image, time.monotonic(), route_xy)

    def _supersede(self, sock: socket.socket, jobs: list[_PlanJob]) -> None:
        for job in jobs:
            with self._stats:
                self.dropped += 1
            self._reply_error(sock, job.frame.request_id, ErrorCode.SUPERSEDED,
                              "a newer plan request on this connection was answered instead")

    def _plan_newest(self, sock: socket.socket, reader: protocol.FrameReader, session: Session,
                     plans: list[_PlanJob]) -> None:
        self._supersede(sock, plans[:-1])
        job = plans[-1]
        with self._planner_lock:
            while True:  # requests that came in while this one waited for the planner: the newest wins
                newer = self._handle_batch(sock, session, reader.drain())
                if not newer:
                    break
                self._supersede(sock, [job] + newer[:-1])
                job = newer[-1]
            self._run_plan(sock, session, job)

    def _run_plan(self, sock: socket.socket, session: Session, job: _PlanJob) -> None:
        rid, ego = job.frame.request_id, job.ego
        deadline = float(job.frame.header.get("deadline_s", self.config.request_timeout_s))
        waited = time.monotonic() - job.received
        if waited > deadline:
            with self._stats:
                self.counters.late += 1
                self.counters.skip("timeout")
            self._reply_error(sock, rid, ErrorCode.TIMEOUT,
                              f"waited {waited:.3f} s for the planner, past the request's deadline {deadline:.3f} s")
            return
        if self.config.repeated_frame_check:
            if session.time_jumped(ego["t"]):
                self._count(resets=1)
            if session.gate.repeated(job.image, ego["speed"]):
                self._answer_repeated(sock, session, job)
                return
        route = self._route_points(job)
        t0 = time.perf_counter()
        try:
            ego_state = self._ego_state(tuple(ego["velocity"]), tuple(ego["acceleration"]))
            plan = self.planner.plan(job.image, ego_state, job.command, route=route)
        except InputError as exc:
            self._count(bad_input=1)
            self._set_error(str(exc))
            self._reply_error(sock, rid, ErrorCode.BAD_INPUT, str(exc), exc.field)
            return
        except Exception as exc:  # the server outlives one bad plan
            self._count(errors=1)
            self._set_error(f"model error: {exc!r}")
            self._log(f"model error: {exc!r}")
            self._reply_error(sock, rid, ErrorCode.MODEL_ERROR, repr(exc))
            return
        plan_s = time.perf_counter() - t0
        self.inference.add(plan_s)
        self.last_inference_s = plan_s
        if route is not None:
            with self._stats:
                self.route_used += 1
        self._count(planned=1, fallback=0 if plan.valid else 1)
        if session.time_jumped(ego["t"]):
            self._count(resets=1)
        session.plan = TrackedPlan.from_plan(plan, Pose2D(*ego["pose"]), ego["t"])
        if plan.valid:
            session.last_valid = session.plan
        control = session.control(ego)
        server_s = time.monotonic() - job.received
        if server_s > deadline:
            self._count(late=1)
        header = {
            "plan": {
                "waypoints": [[round(float(x), 3), round(float(y), 3)] for x, y in plan.waypoints],
                "confidence": [round(float(c), 4) for c in plan.waypoint_confidence],
                "valid": bool(plan.valid),
                "reason": plan.reason,
                "stats": plan.stats.as_dict(),
                "stamp": ego["t"],
            },
            "control": control,
            "latency": {"queue_s": round(server_s - plan_s, 6), "plan_s": round(plan_s, 6),
                        "server_s": round(server_s, 6)},
        }
        self._reply(sock, MessageType.PLAN_REPLY, rid, header)

    def _answer_repeated(self, sock: socket.socket, session: Session, job: _PlanJob) -> None:
        """A repeated image's reply: the session keeps following its last valid plan (the reply's waypoints: that
        plan re-timed to this request and put in its ego frame, ``held`` true) while it is at most
        ``max_plan_age_s`` old; past that, or without one, a stop (``valid`` false)."""
        ego, last = job.ego, session.last_valid
        t, pose = ego["t"], Pose2D(*ego["pose"])
        age = t - last.stamp if last is not None else None
        self._count(repeated_frames=1)
        if last is not None and 0.0 <= age <= self.config.max_plan_age_s:
            self._count(held=1)
            session.plan = last
            kept = ValidPlan(last.stamp, (last.origin.x, last.origin.y, last.origin.heading),
                             last.origin.to_world(last.waypoints))
            waypoints, valid = held_waypoints(kept, t, tuple(ego["pose"]), last.dt), True
            reason = f"held: repeated camera frame; the plan of {age:.2f} s before"
        else:
            self._count(fallback=1)
            waypoints, valid = np.zeros((fmt.NUM_WAYPOINTS, 2), np.float32), False
            session.plan = TrackedPlan(waypoints, pose, float(t), valid=False)
            why = "no valid plan yet" if last is None else f"the last valid plan is {age:.2f} s old " \
                f"(max_plan_age_s {self.config.max_plan_age_s:g})"
            reason = f"repeated camera frame: {why}"
        control = session.control(ego)
        server_s = time.monotonic() - job.received
        header = {
            "plan": {"waypoints": [[round(float(x), 3), round(float(y), 3)] for x, y in waypoints],
                     "confidence": [0.0] * len(waypoints), "valid": valid, "held": valid, "reason": reason,
                     "stats": {}, "stamp": t},
            "control": control,
            "latency": {"queue_s": round(server_s, 6), "plan_s": 0.0, "server_s": round(server_s, 6)},
        }
        self._reply(sock, MessageType.PLAN_REPLY, job.frame.request_id, header)

    def _route_points(self, job: _PlanJob) -> np.ndarray | None:
        """The route points (``fmt.ROUTE_AHEAD_M`` ahead along the request's ``route_xy``, ego frame); None without
        a route of >= 2 points, or (counted as a bad input, logged) when they cannot be computed."""
        if job.route_xy is None or len(job.route_xy) < 2:
            return None
        try:
            return route_points_ahead(job.route_xy, (0.0, 0.0), 0.0)
        except RouteError as exc:
            self._count(bad_input=1)
            self._set_error(f"route_xy: {exc}")
            self._log(f"request {job.frame.request_id}: planning without route points: {exc}")
            return None

    def _control(self, sock: socket.socket, session: Session, frame: Frame) -> None:
        ego = messages.check_ego(frame.header, frame.request_id)
        if session.time_jumped(ego["t"]):
            self._count(resets=1)
        control = session.control(ego)
        with self._stats:
            self.controls += 1
        age = ego["t"] - session.plan.stamp if session.plan is not None else None
        self._reply(sock, MessageType.CONTROL_REPLY, frame.request_id, {"control": control, "plan_age_s": age})

    # -- replies ---------------------------------------------------------------------------------------------------
    def _set_error(self, message: str) -> None:
        with self._stats:
            self.counters.last_error = message

    def _reply(self, sock: socket.socket, msg_type: MessageType, request_id: int, header: dict) -> None:
        protocol.send_frame(sock, protocol.encode_frame(msg_type, request_id, header), self.config.send_timeout_s)

    def _reply_error(self, sock: socket.socket, request_id: int, code: ErrorCode, message: str,
                     field: str | None = None) -> None:
        header = {"code": code.value, "message": message}
        if field:
            header["field"] = field
        try:
            self._reply(sock, MessageType.ERROR, request_id, header)
        except OSError:
            pass  # the peer is gone; its connection loop ends on the next read


# ----------------------------------------------------------------------------------------------------------------
# Command line

READY_PREFIX = "wamdiff-serve: ready on "


def launch(args: Sequence[str] = (), timeout_s: float = 120.0, python: str = sys.executable) -> tuple:
    """Start ``wamdiff-serve ARGS`` as a subprocess and wait for its ready line: (``subprocess.Popen``, address).
    Its output keeps being read into ``process.output`` (the last 200 lines). Stop it with ``process.terminate()``
    (SIGTERM: a clean shutdown)."""
    import subprocess
    from collections import deque

    process = subprocess.Popen([python, "-m", "wamdiff_ros.carla_bridge.server", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 0.5)
        if not readable:
            if process.poll() is not None:
                break
            continue
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(READY_PREFIX):
            process.output = deque(seen, maxlen=200)
            process.output_thread = threading.Thread(target=lambda: process.output.extend(process.stdout), daemon=True)
            process.output_thread.start()
            return process, line[len(READY_PREFIX):].split()[0]
    process.kill()
    process.wait()
    raise RuntimeError("wamdiff-serve did not get ready:\n" + "".join(seen[-20:]))


def _parser() -> argparse.ArgumentParser:
    from wamdiff_ros.cli import add_decode_args

    defaults = ServeConfig()
    p = argparse.ArgumentParser(prog="wamdiff-serve", description="Serve the planner (and a waypoint follower) to "
                                "simulator clients such as the Bench2Drive agent.")
    add_decode_args(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=protocol.DEFAULT_PORT, help="TCP port (0: any free port)")
    where.add_argument("--unix", default=None, metavar="PATH", help="listen on a Unix socket instead of TCP")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--world", choices=WORLDS, default="carla", help="follower gains and actuator (default carla)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--request-timeout", type=float, default=defaults.request_timeout_s,
                   help="deadline of a plan request that names none, s")
    p.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout_s,
                   help="close a connection silent this long, s")
    p.add_argument("--frame-timeout", type=float, default=defaults.frame_timeout_s)
    p.add_argument("--max-payload-mb", type=float, default=protocol.DEFAULT_MAX_PAYLOAD_BYTES / 2**20)
    p.add_argument("--no-warmup", action="store_true", help="do not plan one blank frame before serving")
    p.add_argument("--repeated-frame-check", action="store_true",
                   help="do not plan an image that repeats the last planned one while the car moves (a frozen "
                        "camera): follow the last valid plan up to --max-plan-age s, then brake")
    p.add_argument("--repeated-frame-min-speed", type=float, default=defaults.repeated_frame_min_speed, help="m/s")
    p.add_argument("--max-plan-age", type=float, default=defaults.max_plan_age_s, help="s")
    p.add_argument("--actuation-delay", type=float, default=None, metavar="S",
                   help="a known delay between a control reply and its effect (e.g. 0.1 for a 2-tick control FIFO): "
                        "the follower steers for the state the car will be in then (default: the gains file's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = ServeConfig(world=args.world, idle_timeout_s=args.idle_timeout, frame_timeout_s=args.frame_timeout,
                             request_timeout_s=args.request_timeout,
                             max_payload_bytes=int(args.max_payload_mb * 2**20),
                             repeated_frame_check=args.repeated_frame_check,
                             repeated_frame_min_speed=args.repeated_frame_min_speed, max_plan_age_s=args.max_plan_age,
                             actuation_delay_s=args.actuation_delay)
        import torch

        from wamdiff_ros.cli import load_overrides
        from wamdiff_ros.planner import EgoState, Planner

        if args.threads:
            torch.set_num_threads(args.threads)
        planner = Planner.from_pretrained(args.model, **load_overrides(args))
        if not args.no_warmup:
            planner.plan(np.zeros((128, 256, 3), np.uint8), EgoState((0.0, 0.0)), "follow")
        server = PlannerServer(planner, config, model_name=str(args.model))
        address = server.bind(args.host, args.port, args.unix)
    except (WamDiffError, OSError) as exc:
        print(f"wamdiff-serve: error: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    print(f"{READY_PREFIX}{address} (model {args.model}, world {args.world})", flush=True)
    server.serve_forever()
    print("wamdiff-serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
