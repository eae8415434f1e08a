"""Message contents of the agent <-> ``wamdiff-serve`` protocol: building a plan request and the checks both sides
apply to ego state, image, command and the optional route, so both refuse the same things. Stdlib only, Python 3.7
syntax (it runs in the leaderboard's Python)."""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any, Dict, List, Optional, Tuple

from wamdiff_ros.carla_bridge.protocol import COMMANDS, IMAGE_ENCODINGS, MalformedMessageError
from wamdiff_ros.errors import FieldError


def _finite_numbers(value: Any, field: str, count: int, request_id: Optional[int]) -> List[float]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise MalformedMessageError(field, "expected %d numbers, got %r" % (count, value), request_id)
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise MalformedMessageError(field, "expected finite numbers, got %r" % (value,), request_id)
        out.append(float(v))
    return out


def _finite(value: Any, field: str, request_id: Optional[int]) -> float:
    return _finite_numbers([value], field, 1, request_id)[0]


def ego_fields(velocity: Tuple[float, float], acceleration: Tuple[float, float], speed: float,
               pose: Tuple[float, float, float], t: float) -> Dict[str, Any]:
    """The ``ego`` object: velocity / acceleration in the ego frame, signed speed along the heading, the pose (x, y,
    heading) in a right-handed world frame (for ego-motion compensation between requests), sim time ``t``."""
    return {"velocity": [float(v) for v in velocity], "acceleration": [float(a) for a in acceleration],
            "speed": float(speed), "pose": [float(p) for p in pose], "t": float(t)}


def check_ego(header: Dict[str, Any], request_id: Optional[int] = None) -> Dict[str, Any]:
    ego = header.get("ego")
    if not isinstance(ego, dict):
        raise MalformedMessageError("ego", "missing (an object with velocity, acceleration, speed, pose, t)",
                                    request_id)
    return {
        "velocity": _finite_numbers(ego.get("velocity"), "ego.velocity", 2, request_id),
        "acceleration": _finite_numbers(ego.get("acceleration", [0.0, 0.0]), "ego.acceleration", 2, request_id),
        "speed": _finite(ego.get("speed"), "ego.speed", request_id),
        "pose": _finite_numbers(ego.get("pose"), "ego.pose", 3, request_id),
        "t": _finite(ego.get("t"), "ego.t", request_id),
    }


def check_image(header: Dict[str, Any], payload: bytes, request_id: Optional[int] = None) -> Tuple[str, int, int]:
    """(encoding, height, width) of a plan request's image, checked against the payload."""
    image = header.get("image")
    if not isinstance(image, dict):
        raise MalformedMessageError("image", "missing (an object with encoding, height, width)", request_id)
    encoding = image.get("encoding")
    if encoding not in IMAGE_ENCODINGS:
        raise MalformedMessageError("image.encoding", "expected one of %s, got %r"
                                    % (", ".join(IMAGE_ENCODINGS), encoding), request_id)
    size = []
    for key in ("height", "width"):
        v = image.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 16384:
            raise MalformedMessageError("image." + key, "expected a whole number in 1..16384, got %r" % (v,),
                                        request_id)
        size.append(v)
    height, width = size
    if encoding == "rgb8" and len(payload) != height * width * 3:
        raise MalformedMessageError("payload", "rgb8 %dx%d needs %d bytes, got %d"
                                    % (width, height, height * width * 3, len(payload)), request_id)
    if encoding == "png" and not payload.startswith(b"\x89PNG\r\n\x1a\n"):
        raise MalformedMessageError("payload", "not a PNG file", request_id)
    return encoding, height, width


def check_command(header: Dict[str, Any], request_id: Optional[int] = None) -> str:
    command = header.get("command")
    if command not in COMMANDS:
        raise MalformedMessageError("command", "expected one of %s, got %r" % (", ".join(COMMANDS), command),
                                    request_id)
    return command


MAX_ROUTE_POINTS = 100  # a plan request's route_xy: the agent sends ~50 m of the ~1 m spaced dense route


def check_route_xy(header: Dict[str, Any], request_id: Optional[int] = None) -> Optional[List[List[float]]]:
    """A plan request's optional ``route_xy``: the route near the ego (ego frame: x forward, y left, metres) as at most
    ``MAX_ROUTE_POINTS`` [x, y] pairs of finite numbers; None when absent (or null)."""
    route = header.get("route_xy")
    if route is None:
        return None
    if not isinstance(route, (list, tuple)):
        raise MalformedMessageError("route_xy", "expected a list of [x, y] points, got %r" % (route,), request_id)
    if len(route) > MAX_ROUTE_POINTS:
        raise MalformedMessageError("route_xy", "at most %d points, got %d" % (MAX_ROUTE_POINTS, len(route)),
                                    request_id)
    return [_finite_numbers(p, "route_xy[%d]" % i, 2, request_id) for i, p in enumerate(route)]


def plan_request(rgb: bytes, height: int, width: int, ego: Dict[str, Any], command: str,
                 encoding: str = "rgb8", deadline_s: Optional[float] = None,
                 route_xy: Optional[List[List[float]]] = None) -> Tuple[Dict[str, Any], bytes]:
    """(JSON header, payload) of a ``PLAN`` request from raw RGB bytes (row-major H x W x 3). ``route_xy``: the
    optional route near the ego in the ego frame (``check_route_xy``), for a model that wants route points."""
    if len(rgb) != height * width * 3:
        raise FieldError("image", "%dx%d RGB needs %d bytes, got %d" % (width, height, height * width * 3, len(rgb)))
    payload = encode_png(rgb, height, width) if encoding == "png" else bytes(rgb)
    header = {"image": {"encoding": encoding, "height": height, "width": width}, "ego": ego, "command": command}
    if deadline_s is not None:
        header["deadline_s"] = float(deadline_s)
    if route_xy is not None:
        header["route_xy"] = check_route_xy({"route_xy": route_xy})  # refuse here what the server would refuse
    return header, payload


def encode_png(rgb: bytes, height: int, width: int, level: int = 1) -> bytes:
    """A minimal 8-bit RGB PNG (filter 0 on every row), stdlib only."""
    stride = width * 3
    rows = b"".join(b"\x00" + bytes(rgb[r * stride:(r + 1) * stride]) for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows, level))
            + chunk(b"IEND", b""))
