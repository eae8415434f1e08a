"""The wire format between the Bench2Drive agent (a thin client) and ``wamdiff-serve``.

Stdlib only, Python 3.7 syntax: this module runs inside the leaderboard's own Python, where torch cannot.

A frame (over TCP or a Unix socket) is::

    fixed header, 24 bytes, network byte order (``>4sHHQII``):
        magic b"WMDF" | protocol version (uint16) | message type (uint16) | request id (uint64)
        | JSON header length (uint32) | payload length (uint32)
    JSON header: one UTF-8 JSON object (the message's fields)
    payload: raw bytes (a plan request's image; empty otherwise)

A reply carries its request's id. Messages (JSON header fields; units: m, s, rad, ego frame x forward / y left, world
frame right-handed as in ``wamdiff_ros.world.types``):

- ``PLAN``: ``image`` {encoding "rgb8" (H x W x 3, row-major) | "png", height, width}, ``ego`` (see ``check_ego``),
  ``command`` (left | right | straight | follow), optional ``deadline_s`` (the client gives up after this long),
  optional ``route_xy`` (the route from a little behind the ego to ~45 m ahead along it, ego frame, at most 100
  [x, y] points; sent only to a server whose model wants route points, see ``RESET_REPLY``).
  Reply ``PLAN_REPLY``: ``plan`` {waypoints [[x, y] x 8], confidence [8], valid, reason, stats}, ``control`` (see
  below), ``latency`` {queue_s, plan_s, server_s}.
- ``CONTROL``: ``ego`` only; the server's follower steps on the connection's last plan. Reply ``CONTROL_REPLY``:
  ``control``, ``plan_age_s``.
- ``RESET``: a new route / episode (``reason``); the connection's follower and plan are reset. Reply ``RESET_REPLY``:
  ``reset`` (true).
- ``STATUS``: reply ``STATUS_REPLY`` with the diagnostics ``values`` (the planner node's counter names).
- ``ERROR`` (reply only): ``code`` (see ``ErrorCode``), ``message``, optional ``field``.

``control``: ``acceleration`` (m/s^2) and ``steer_rad`` (front-wheel angle, positive left) always; ``throttle``,
``steer`` (CARLA's: positive right, normalised) and ``brake`` for the carla world; ``braking``, ``reason``,
``target_speed``.
"""

from __future__ import annotations

import enum
import json
import select
import socket
import struct
import time
from typing import Any, Dict, List, Optional, Tuple, Union

from wamdiff_ros.errors import FieldError, WamDiffError

MAGIC = b"WMDF"
PROTOCOL_VERSION = 1
FIXED_HEADER = struct.Struct(">4sHHQII")
FIXED_HEADER_SIZE = FIXED_HEADER.size
MAX_HEADER_BYTES = 1 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 32 << 20  # a 4K RGB frame is 25 MB
DEFAULT_PORT = 8799
DEFAULT_ADDRESS = "127.0.0.1:%d" % DEFAULT_PORT
COMMANDS = ("left", "right", "straight", "follow")  # wamdiff_ros.format.Command values
IMAGE_ENCODINGS = ("rgb8", "png")


class MessageType(enum.IntEnum):
    PLAN = 1
    CONTROL = 2
    RESET = 3
    STATUS = 4
    PLAN_REPLY = 101
    CONTROL_REPLY = 102
    RESET_REPLY = 103
    STATUS_REPLY = 104
    ERROR = 200


REQUEST_TYPES = (MessageType.PLAN, MessageType.CONTROL, MessageType.RESET, MessageType.STATUS)


class ErrorCode(str, enum.Enum):
    SUPERSEDED = "superseded"  # a newer plan request on the same connection was answered instead (no work done)
    BAD_FRAME = "bad_frame"  # the frame could not be read (framing, JSON, missing or wrong fields)
    BAD_INPUT = "bad_input"  # the planner refused an input (image, ego state, command)
    TIMEOUT = "timeout"  # the request's deadline passed before the planner could take it
    MODEL_ERROR = "model_error"
    UNSUPPORTED = "unsupported"  # a request type this server does not serve
    SHUTTING_DOWN = "shutting_down"


# ----------------------------------------------------------------------------------------------------------------
# Errors


class ProtocolError(WamDiffError):
    """A frame or message broke the protocol. ``field`` names what; ``recoverable`` is True when the frame's
    boundaries were still known (the connection can go on); ``request_id`` is set when it could be read."""

    recoverable = False

    def __init__(self, field: str, message: str, request_id: Optional[int] = None) -> None:
        super().__init__("%s: %s" % (field, message))
        self.field = field
        self.request_id = request_id


class BadMagicError(ProtocolError):
    pass


class VersionMismatchError(ProtocolError):
    def __init__(self, ours: int, theirs: int, request_id: Optional[int] = None) -> None:
        super().__init__("version", "peer speaks protocol version %d, this side speaks version %d" % (theirs, ours),
                         request_id)
        self.ours, self.theirs = ours, theirs


class TruncatedFrameError(ProtocolError):
    """The frame (or the stream) ended before the fixed header, the JSON header or the payload was complete."""

    def __init__(self, field: str, announced: int, received: int, request_id: Optional[int] = None,
                 detail: str = "") -> None:
        super().__init__(field, "frame truncated: %d of %d bytes%s" % (received, announced, detail), request_id)
        self.announced, self.received = announced, received


class FrameStalledError(TruncatedFrameError):
    """A frame started but its remaining bytes did not arrive within the frame timeout."""


class FrameTooLargeError(ProtocolError):
    def __init__(self, field: str, size: int, limit: int, request_id: Optional[int] = None) -> None:
        super().__init__(field, "%d bytes announced, the limit is %d" % (size, limit), request_id)
        self.size, self.limit = size, limit


class MalformedMessageError(ProtocolError, FieldError):
    """A complete frame whose JSON header or fields are wrong; the connection can go on."""

    recoverable = True

    def __init__(self, field: str, message: str, request_id: Optional[int] = None) -> None:
        FieldError.__init__(self, field, message)
        self.request_id = request_id


class UnknownMessageTypeError(MalformedMessageError):
    pass


class ConnectionClosedError(ProtocolError, ConnectionError):
    """The peer closed the connection between frames."""

    def __init__(self, message: str = "peer closed the connection") -> None:
        ProtocolError.__init__(self, "connection", message)


class ReplyTimeoutError(ProtocolError, TimeoutError):
    """No complete frame arrived within the wait; the stream stays usable (a partial frame stays buffered)."""

    def __init__(self, waited_s: float) -> None:
        ProtocolError.__init__(self, "reply", "no frame within %.3f s" % waited_s)
        self.waited_s = waited_s


# ----------------------------------------------------------------------------------------------------------------
# Frames


class Frame(object):
    """One decoded frame."""

    __slots__ = ("msg_type", "request_id", "header", "payload")

    def __init__(self, msg_type: MessageType, request_id: int, header: Dict[str, Any], payload: bytes = b"") -> None:
        self.msg_type = msg_type
        self.request_id = request_id
        self.header = header
        self.payload = payload

    def __repr__(self) -> str:
        return "Frame(%s, id=%d, header keys=%s, payload=%d bytes)" % (
            self.msg_type.name, self.request_id, sorted(self.header), len(self.payload))


def encode_frame(msg_type: int, request_id: int, header: Optional[Dict[str, Any]] = None, payload: bytes = b"",
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    body = json.dumps(header or {}, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_HEADER_BYTES:
        raise FrameTooLargeError("header length", len(body), MAX_HEADER_BYTES, request_id)
    if len(payload) > max_payload_bytes:
        raise FrameTooLargeError("payload length", len(payload), max_payload_bytes, request_id)
    fixed = FIXED_HEADER.pack(MAGIC, PROTOCOL_VERSION, int(msg_type), int(request_id), len(body), len(payload))
    return b"".join((fixed, body, bytes(payload)))


def read_fixed_header(data: bytes, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Tuple[int, int, int, int]:
    """(message type, request id, JSON header length, payload length) from the first 24 bytes. Raises the
    unrecoverable errors: wrong magic, wrong version, oversized lengths."""
    if len(data) < FIXED_HEADER_SIZE:
        raise TruncatedFrameError("fixed header", FIXED_HEADER_SIZE, len(data))
    magic, version, msg_type, request_id, header_len, payload_len = FIXED_HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadMagicError("magic", "expected %r, got %r (not a wamdiff-serve peer?)" % (MAGIC, bytes(magic)))
    if version != PROTOCOL_VERSION:
        raise VersionMismatchError(PROTOCOL_VERSION, version, request_id)
    if header_len > MAX_HEADER_BYTES:
        raise FrameTooLargeError("header length", header_len, MAX_HEADER_BYTES, request_id)
    if payload_len > max_payload_bytes:
        raise FrameTooLargeError("payload length", payload_len, max_payload_bytes, request_id)
    return msg_type, request_id, header_len, payload_len


def decode_frame(data: bytes, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Frame:
    """Exactly one frame from ``data``."""
    msg_type, request_id, header_len, payload_len = read_fixed_header(data, max_payload_bytes)
    end_header = FIXED_HEADER_SIZE + header_len
    if len(data) < end_header:
        raise TruncatedFrameError("json header", header_len, len(data) - FIXED_HEADER_SIZE, request_id)
    if len(data) < end_header + payload_len:
        raise TruncatedFrameError("payload", payload_len, len(data) - end_header, request_id)
    if len(data) > end_header + payload_len:
        raise MalformedMessageError("frame", "%d bytes beyond the announced lengths"
                                    % (len(data) - end_header - payload_len), request_id)
    return _build_frame(msg_type, request_id, bytes(data[FIXED_HEADER_SIZE:end_header]),
                        bytes(data[end_header:end_header + payload_len]))


def _build_frame(msg_type: int, request_id: int, body: bytes, payload: bytes) -> Frame:
    try:
        kind = MessageType(msg_type)
    except ValueError:
        raise UnknownMessageTypeError("message type", "unknown message type %d" % msg_type, request_id) from None
    try:
        header = json.loads(body.decode("utf-8")) if body else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedMessageError("json header", "not valid UTF-8 JSON: %s" % exc, request_id) from None
    if not isinstance(header, dict):
        raise MalformedMessageError("json header", "expected a JSON object, got %s" % type(header).__name__,
                                    request_id)
    return Frame(kind, request_id, header, payload)


class FrameReader(object):
    """Reads frames from a connected socket through a buffer, so a wait that times out mid-frame loses nothing.

    ``frame_timeout_s``: once a frame's first byte has arrived, the rest must follow within this time
    (``FrameStalledError``); between frames the caller's own wait applies (``ReplyTimeoutError``)."""

    def __init__(self, sock: socket.socket, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 frame_timeout_s: float = 10.0) -> None:
        self.sock = sock
        self.max_payload_bytes = max_payload_bytes
        self.frame_timeout_s = frame_timeout_s
        self._buffer = bytearray()
        self._frame_started = None  # type: Optional[float]
        self._eof = False

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next(self, timeout_s: Optional[float]) -> Frame:
        """The next frame, waiting at most ``timeout_s`` (None: forever). Recoverable errors
        (``MalformedMessageError``) consume their frame; the others leave the stream unusable."""
        deadline = None if timeout_s is None else time.monotonic() + max(timeout_s, 0.0)
        while True:
            frame = self._take()
            if frame is not None:
                return frame
            if self._eof:
                if self._buffer:
                    raise self._truncated(TruncatedFrameError, " (peer closed the connection)")
                raise ConnectionClosedError()
            now = time.monotonic()
            wait = None if deadline is None else deadline - now
            if self._frame_started is not None:
                stall = self._frame_started + self.frame_timeout_s - now
                if stall <= 0:
                    raise self._truncated(FrameStalledError, " (stalled %.1f s)" % self.frame_timeout_s)
                wait = stall if wait is None else min(wait, stall)
            if wait is not None and wait <= 0:
                raise ReplyTimeoutError(timeout_s or 0.0)
            self._fill(wait)

    def drain(self) -> List[Union[Frame, MalformedMessageError]]:
        """Every complete frame already received, without waiting; recoverable errors in their place. An end of
        stream is reported by the next ``next()``."""
        out = []  # type: List[Union[Frame, MalformedMessageError]]
        while self._fill(0.0):
            pass
        while True:
            try:
                frame = self._take()
            except MalformedMessageError as exc:
                out.append(exc)
                continue
            if frame is None:
                return out
            out.append(frame)

    def _fill(self, timeout_s: Optional[float]) -> bool:
        if self._eof:
            return False
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        if not readable:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        if not self._buffer:
            self._frame_started = time.monotonic()
        self._buffer.extend(chunk)
        return True

    def _take(self) -> Optional[Frame]:
        if len(self._buffer) < FIXED_HEADER_SIZE:
            return None
        msg_type, request_id, header_len, payload_len = read_fixed_header(self._buffer, self.max_payload_bytes)
        total = FIXED_HEADER_SIZE + header_len + payload_len
        if len(self._buffer) < total:
            return None
        body = bytes(self._buffer[FIXED_HEADER_SIZE:FIXED_HEADER_SIZE + header_len])
        payload = bytes(self._buffer[FIXED_HEADER_SIZE + header_len:total])
        del self._buffer[:total]
        self._frame_started = time.monotonic() if self._buffer else None
        return _build_frame(msg_type, request_id, body, payload)

    def _truncated(self, cls: type, detail: str) -> TruncatedFrameError:
        got = len(self._buffer)
        if got < FIXED_HEADER_SIZE:
            return cls("fixed header", FIXED_HEADER_SIZE, got, None, detail)
        _, request_id, header_len, payload_len = read_fixed_header(self._buffer, self.max_payload_bytes)
        if got < FIXED_HEADER_SIZE + header_len:
            return cls("json header", header_len, got - FIXED_HEADER_SIZE, request_id, detail)
        return cls("payload", payload_len, got - FIXED_HEADER_SIZE - header_len, request_id, detail)


def send_frame(sock: socket.socket, frame: bytes, timeout_s: Optional[float] = 5.0) -> None:
    """Send a whole encoded frame; ``socket.timeout`` (an ``OSError``) if the peer does not take it in time."""
    previous = sock.gettimeout()
    sock.settimeout(timeout_s)
    try:
        sock.sendall(frame)
    finally:
        sock.settimeout(previous)


# ----------------------------------------------------------------------------------------------------------------
# Addresses


def parse_address(text: str) -> Tuple[str, Union[Tuple[str, int], str]]:
    """``host:port`` | ``tcp://host:port`` | ``unix:///path`` | ``unix:/path`` -> ("tcp", (host, port)) or
    ("unix", path)."""
    if not isinstance(text, str) or not text.strip():
        raise FieldError("server", "expected an address like 127.0.0.1:%d or unix:///tmp/wamdiff.sock, got %r"
                         % (DEFAULT_PORT, text))
    text = text.strip()
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        path = path[2:] if path.startswith("//") else path
        if not path:
            raise FieldError("server", "unix address without a path: %r" % text)
        return "unix", path
    if text.startswith("tcp://"):
        text = text[len("tcp://"):]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise FieldError("server", "expected host:port, got %r" % text)
    try:
        number = int(port)
    except ValueError:
        raise FieldError("server", "port %r is not a number" % port) from None
    if not 0 <= number <= 65535:
        raise FieldError("server", "port %d out of range" % number)
    return "tcp", (host.strip("[]"), number)


def format_address(kind: str, where: Union[Tuple[str, int], str]) -> str:
    if kind == "unix":
        return "unix://%s" % where
    host, port = where  # type: ignore[misc]
    return "tcp://%s:%d" % (host, port)


def connect(address: str, timeout_s: float = 2.0) -> socket.socket:
    kind, where = parse_address(address)
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(where)
    except BaseException:
        sock.close()
        raise
    if kind == "tcp":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    return sock
