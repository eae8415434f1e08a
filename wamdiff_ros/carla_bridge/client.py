"""A blocking client of ``wamdiff-serve`` (stdlib only, Python 3.7 syntax): one request at a time, each with a
timeout; a reply to an earlier request that timed out is skipped by its request id. A lost connection is reopened
on the next request."""

from __future__ import annotations

import itertools
import socket  # noqa: F401  (type comments)
import time
from typing import Any, Dict, List, Optional

from wamdiff_ros.carla_bridge import messages, protocol
from wamdiff_ros.carla_bridge.protocol import Frame, MessageType
from wamdiff_ros.errors import WamDiffError


class RemoteError(WamDiffError):
    """The server answered with an ``ERROR`` frame; ``code`` is a ``protocol.ErrorCode`` value."""

    def __init__(self, code: str, message: str, field: Optional[str] = None, request_id: Optional[int] = None) -> None:
        super().__init__("%s: %s%s" % (code, "%s: " % field if field else "", message))
        self.code, self.detail, self.field, self.request_id = code, message, field, request_id


class ServerUnavailableError(WamDiffError, ConnectionError):
    """No connection to the server (refused, closed, broken stream)."""


class PlannerClient(object):
    def __init__(self, address: str = protocol.DEFAULT_ADDRESS, timeout_s: float = 2.0, connect_timeout_s: float = 1.0,
                 max_payload_bytes: int = protocol.DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        protocol.parse_address(address)  # fail early on a bad address
        self.address = address
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_payload_bytes = max_payload_bytes
        self.stale_replies = 0  # replies to requests that had already timed out
        self._ids = itertools.count(1)
        self._sock = None  # type: Optional[socket.socket]
        self._reader = None  # type: Optional[protocol.FrameReader]

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        if self._sock is not None:
            return
        try:
            sock = protocol.connect(self.address, self.connect_timeout_s)
        except OSError as exc:
            raise ServerUnavailableError("cannot connect to %s: %s" % (self.address, exc)) from None
        self._sock = sock
        # A stalled reply frame is the server's problem; our own deadline is the request's timeout.
        self._reader = protocol.FrameReader(sock, self.max_payload_bytes, frame_timeout_s=max(30.0, self.timeout_s))

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._reader = None, None

    def __enter__(self) -> "PlannerClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, msg_type: MessageType, header: Optional[Dict[str, Any]] = None, payload: bytes = b"",
                timeout_s: Optional[float] = None) -> Frame:
        """Send one request and wait for its reply. Raises ``protocol.ReplyTimeoutError`` (the connection stays
        open), ``RemoteError`` (an ERROR reply) or ``ServerUnavailableError``."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        self.connect()
        request_id = next(self._ids)
        data = protocol.encode_frame(msg_type, request_id, header, payload, self.max_payload_bytes)
        try:
            protocol.send_frame(self._sock, data, timeout)
        except OSError as exc:
            self.close()
            raise ServerUnavailableError("sending to %s failed: %s" % (self.address, exc)) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self._reader.next(max(deadline - time.monotonic(), 0.0))
            except protocol.ReplyTimeoutError:
                raise protocol.ReplyTimeoutError(timeout) from None
            except (protocol.ProtocolError, OSError) as exc:
                self.close()
                raise ServerUnavailableError("connection to %s lost: %s" % (self.address, exc)) from None
            if frame.request_id != request_id:
                self.stale_replies += 1
                continue
            if frame.msg_type == MessageType.ERROR:
                h = frame.header
                raise RemoteError(str(h.get("code", "")), str(h.get("message", "")), h.get("field"), request_id)
            return frame

    def plan(self, rgb: bytes, height: int, width: int, ego: Dict[str, Any], command: str, encoding: str = "rgb8",
             timeout_s: Optional[float] = None, route_xy: Optional[List[List[float]]] = None) -> Dict[str, Any]:
        """``rgb``: row-major H x W x 3 bytes; ``ego``: ``messages.ego_fields(...)``; ``route_xy``: the optional route
        near the ego, ego frame (``messages.check_route_xy``). Returns the reply header."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        header, payload = messages.plan_request(rgb, height, width, ego, command, encoding, deadline_s=timeout,
                                                route_xy=route_xy)
        return self.request(MessageType.PLAN, header, payload, timeout).header

    def control(self, ego: Dict[str, Any], timeout_s: Optional[float] = None) -> Dict[str, Any]:
        return self.request(MessageType.CONTROL, {"ego": ego}, b"", timeout_s).header

    def reset(self, reason: str = "", timeout_s: Optional[float] = None) -> Dict[str, Any]:
        return self.request(MessageType.RESET, {"reason": reason}, b"", timeout_s).header

    def status(self, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        return self.request(MessageType.STATUS, {}, b"", timeout_s).header
