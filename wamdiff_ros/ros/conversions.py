"""ROS 2 messages <-> the plain types of wamdiff_ros (numpy images, EgoState, ego-frame waypoints).

Uses rclpy message classes only, no node machinery. Frames: the planner's waypoints are in the ego frame
(x forward, y left, metres, one every 0.5 s); odometry follows REP-105 (pose in the odom frame, twist in the
child frame, i.e. base_link = the ego frame).
"""

from __future__ import annotations

import io
import math
from typing import NamedTuple, Sequence

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, PoseStamped, Quaternion
from nav_msgs.msg import Odometry, Path
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from wamdiff_ros import format as fmt
from wamdiff_ros.errors import EgoStateError, ImageError, InputError
from wamdiff_ros.geometry import ego_to_world, rotate_to_ego
from wamdiff_ros.planner import EgoState

_NS = 1_000_000_000


class _Encoding(NamedTuple):
    channels: int
    depth: int  # bytes per channel
    rgb: tuple[int, int, int] | None  # the message channels holding R, G, B; None for mono


ENCODINGS: dict[str, _Encoding] = {
    "rgb8": _Encoding(3, 1, (0, 1, 2)), "bgr8": _Encoding(3, 1, (2, 1, 0)),
    "rgba8": _Encoding(4, 1, (0, 1, 2)), "bgra8": _Encoding(4, 1, (2, 1, 0)), "mono8": _Encoding(1, 1, None),
    "rgb16": _Encoding(3, 2, (0, 1, 2)), "bgr16": _Encoding(3, 2, (2, 1, 0)),
    "rgba16": _Encoding(4, 2, (0, 1, 2)), "bgra16": _Encoding(4, 2, (2, 1, 0)), "mono16": _Encoding(1, 2, None),
}


def _encoding(name: str) -> _Encoding:
    spec = ENCODINGS.get(str(name).strip().lower())
    if spec is None:
        raise ImageError("image", f"unsupported encoding {name!r}; expected one of {', '.join(ENCODINGS)}")
    return spec


# ---------------------------------------------------------------------------------------------------------------
# Time


def stamp_to_sec(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def stamp_ns(stamp: Time) -> int:
    return int(stamp.sec) * _NS + int(stamp.nanosec)


def to_time(stamp: Time | float | int) -> Time:
    """A builtin_interfaces/Time from a Time (copied) or seconds."""
    return time_ns(stamp_ns(stamp) if isinstance(stamp, Time) else round(float(stamp) * _NS))


def time_ns(ns: int) -> Time:
    """A builtin_interfaces/Time from integer nanoseconds (exact: a stamp that goes out and comes back matches)."""
    sec, nanosec = divmod(int(ns), _NS)
    return Time(sec=sec, nanosec=nanosec)


# ---------------------------------------------------------------------------------------------------------------
# Images


def _buffer(data: object) -> np.ndarray:
    try:
        return np.frombuffer(data, dtype=np.uint8)  # bytes, array.array('B'), memoryview: no copy
    except TypeError:
        try:
            return np.asarray(data, dtype=np.uint8).reshape(-1)
        except (TypeError, ValueError, OverflowError) as e:
            raise ImageError("image", f"data is not a byte buffer ({type(data).__name__}: {e})") from None


def image_to_rgb(msg: Image) -> np.ndarray:
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB, C-contiguous, a copy. Honours ``step`` padding; 16-bit
    encodings keep their high byte (``is_bigendian`` honoured); alpha is dropped; mono is broadcast."""
    spec = _encoding(msg.encoding)
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h == 0 or w == 0:
        raise ImageError("image", f"image is empty ({w}x{h} pixels)")
    row = w * spec.channels * spec.depth
    if step < row:
        raise ImageError("image", f"step {step} is smaller than width*channels*bytes = "
                                  f"{w}*{spec.channels}*{spec.depth} = {row} for {msg.encoding!r}")
    buf = _buffer(msg.data)
    if buf.size < h * step:
        raise ImageError("image", f"data has {buf.size} bytes, fewer than height*step = {h}*{step} = {h * step}")
    px = buf[: h * step].reshape(h, step)[:, :row]
    if spec.depth == 2:  # keep the most significant byte: v >> 8
        px = px[:, (0 if msg.is_bigendian else 1)::2]
    px = px.reshape(h, w, spec.channels)
    if spec.channels == 3 and spec.rgb == (0, 1, 2):
        return np.array(px, dtype=np.uint8, order="C")  # a copy
    out = np.empty((h, w, 3), dtype=np.uint8)
    for dst, src in enumerate(spec.rgb or (0, 0, 0)):  # per channel: ~4x faster than one strided (h,w,3) copy
        out[..., dst] = px[..., src]
    return out


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """sensor_msgs/CompressedImage (JPEG, PNG, anything PIL reads) -> (H, W, 3) uint8 RGB."""
    data = bytes(msg.data)
    if not data:
        raise ImageError("image", f"compressed image ({msg.format!r}) has no data")
    if "compresseddepth" in msg.format.lower():
        raise ImageError("image", f"compressed depth images ({msg.format!r}) are not colour images")
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            img.load()
            if img.mode.startswith("I"):  # 16/32-bit grey: keep the high byte like mono16
                grey = (np.asarray(img, dtype=np.int64) >> 8).clip(0, 255).astype(np.uint8)
                return np.ascontiguousarray(np.broadcast_to(grey[..., None], grey.shape + (3,)))
            out = np.array(img.convert("RGB"), dtype=np.uint8, order="C")
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, OSError, SyntaxError, ValueError ...)
        raise ImageError("image", f"compressed image ({msg.format!r}, {len(data)} bytes) does not decode: "
                                  f"{type(e).__name__}: {e}") from None
    if out.size == 0:
        raise ImageError("image", "compressed image decodes to an empty image")
    return out


def rgb_to_image(arr: np.ndarray, stamp: Time | float, frame_id: str, encoding: str = "rgb8", *,
                 big_endian: bool = False) -> Image:
    """(H, W, 3) uint8 RGB -> sensor_msgs/Image, unpadded. Mono uses BT.601 luma; alpha is 255; 16-bit is v*257."""
    spec = _encoding(encoding)
    arr = np.asarray(arr)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8 or arr.size == 0:
        raise ImageError("image", f"expected a non-empty HxWx3 uint8 array, got {arr.shape} {arr.dtype}")
    h, w = arr.shape[:2]
    if spec.rgb is None:
        r, g, b = (arr[..., c].astype(np.uint32) for c in range(3))
        px = ((299 * r + 587 * g + 114 * b + 500) // 1000).astype(np.uint8)
    elif spec.channels == 3 and spec.rgb == (0, 1, 2):
        px = arr
    else:
        px = np.empty((h, w, spec.channels), dtype=np.uint8)
        for colour, channel in enumerate(spec.rgb):
            px[..., channel] = arr[..., colour]
        if spec.channels == 4:
            px[..., 3] = 255
    if spec.depth == 2:  # v * 257: both bytes are v, so the byte order does not change the data
        px = np.repeat(px.reshape(-1), 2)
    msg = Image(height=h, width=w, encoding=str(encoding).strip().lower(), is_bigendian=int(bool(big_endian)),
                step=w * spec.channels * spec.depth)
    msg.header.stamp = to_time(stamp)
    msg.header.frame_id = frame_id
    msg.data = np.ascontiguousarray(px).tobytes()
    return msg


def box_to_pixels(box: fmt.Box, width: int, height: int) -> tuple[int, int, int, int]:
    """A Box on the 0-1000 grid -> (x_min, y_min, x_max, y_max) pixels, rounded and clipped to the image."""
    if width <= 0 or height <= 0:
        raise ImageError("image", f"image size must be positive, got {width}x{height}")
    xs = sorted(min(max(round(v * width / fmt.BOX_GRID), 0), width) for v in (box.x1, box.x2))
    ys = sorted(min(max(round(v * height / fmt.BOX_GRID), 0), height) for v in (box.y1, box.y2))
    return xs[0], ys[0], xs[1], ys[1]


# ---------------------------------------------------------------------------------------------------------------
# Odometry and ego state


def odometry_to_velocity(msg: Odometry) -> tuple[float, float]:
    """(vx, vy) in m/s in the ego frame: REP-105 puts the twist in child_frame_id (base_link)."""
    lin = msg.twist.twist.linear
    v = (float(lin.x), float(lin.y))
    if not all(math.isfinite(c) for c in v):
        raise EgoStateError("odometry.twist.twist.linear", f"velocity must be finite, got {v}")
    return v


def yaw_from_quaternion(q: Quaternion) -> float:
    """Heading (rotation about z) in radians, [-pi, pi]; the quaternion need not be normalised."""
    return math.atan2(2.0 * (q.w * q.z + q.x * q.y), q.w * q.w + q.x * q.x - q.y * q.y - q.z * q.z)


def quaternion_from_yaw(yaw: float) -> Quaternion:
    return Quaternion(x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0))


def pose2d(msg: Odometry) -> tuple[float, float, float]:
    """(x, y, yaw) of the ego in the odometry frame."""
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    values = (p.x, p.y, q.x, q.y, q.z, q.w)
    if not all(math.isfinite(v) for v in values):
        raise EgoStateError("odometry.pose.pose", f"pose must be finite, got {values}")
    if q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w < 1e-12:
        raise EgoStateError("odometry.pose.pose.orientation", "quaternion is zero")
    return float(p.x), float(p.y), yaw_from_quaternion(q)


class EgoEstimator:
    """Velocity plus low-pass finite-difference acceleration, both in the current ego frame.

    The previous velocity is rotated into the current frame by the yaw change, so a turn at constant speed gives
    the centripetal acceleration (+y for a left turn). Acceleration is smoothed by a first-order low-pass with
    ``time_constant`` s (0: raw). A repeated stamp changes nothing (its velocity is returned with the current
    acceleration); time going backwards or a gap above ``max_gap`` s restarts it (``resets`` counts these).
    ``yaw_from`` picks the yaw-change source of :meth:`update_odometry`: "pose" (orientation) or "twist"
    (angular.z * dt; for sources that publish no pose).
    """

    def __init__(self, time_constant: float = 0.2, max_gap: float = 1.0, yaw_from: str = "pose") -> None:
        if not (time_constant >= 0.0 and max_gap > 0.0 and yaw_from in ("pose", "twist")):
            raise InputError("ego_estimator", f"need time_constant >= 0, max_gap > 0, yaw_from pose|twist; got "
                                              f"{time_constant}, {max_gap}, {yaw_from!r}")
        self.time_constant, self.max_gap, self.yaw_from = float(time_constant), float(max_gap), yaw_from
        self.resets = 0
        self.reset()

    def reset(self) -> None:
        self._t: float | None = None
        self._v = np.zeros(2)
        self._yaw: float | None = None
        self._acc: np.ndarray | None = None

    @property
    def state(self) -> EgoState:
        acc = (0.0, 0.0) if self._acc is None else (float(self._acc[0]), float(self._acc[1]))
        return EgoState((float(self._v[0]), float(self._v[1])), acc)

    def update(self, stamp: float, velocity: Sequence[float], yaw: float | None = None,
               yaw_rate: float | None = None) -> EgoState:
        """Feed one sample: stamp (s), ego-frame velocity (m/s), and the heading (rad) or yaw rate (rad/s)."""
        v = np.array([float(velocity[0]), float(velocity[1])])
        extra = [x for x in (yaw, yaw_rate) if x is not None]
        if not all(math.isfinite(x) for x in (float(stamp), *v, *extra)):
            raise EgoStateError("ego", f"stamp, velocity and yaw must be finite, got {stamp}, {tuple(v)}, {extra}")
        stamp = float(stamp)
        if self._t is not None and stamp == self._t:
            return EgoState((float(v[0]), float(v[1])), self.state.acceleration)
        if self._t is not None and not (0.0 < stamp - self._t <= self.max_gap):
            self.resets += 1
            self.reset()
        if self._t is not None:
            dt = stamp - self._t
            if yaw is not None and self._yaw is not None:
                dyaw = math.remainder(yaw - self._yaw, math.tau)
            else:
                dyaw = (yaw_rate or 0.0) * dt
            prev = np.array(rotate_to_ego(self._v[0], self._v[1], dyaw))  # R(-dyaw) v
            raw = (v - prev) / dt
            if self._acc is None:
                self._acc = raw
            else:
                alpha = 1.0 - math.exp(-dt / self.time_constant) if self.time_constant > 0 else 1.0
                self._acc = self._acc + alpha * (raw - self._acc)
        self._t, self._v = stamp, v
        self._yaw = None if yaw is None else float(yaw)
        return self.state

    def update_odometry(self, msg: Odometry) -> EgoState:
        v = odometry_to_velocity(msg)
        if self.yaw_from == "pose":
            return self.update(stamp_to_sec(msg.header.stamp), v, yaw=pose2d(msg)[2])
        return self.update(stamp_to_sec(msg.header.stamp), v, yaw_rate=float(msg.twist.twist.angular.z))


# ---------------------------------------------------------------------------------------------------------------
# Plans


def _points(waypoints: object, name: str) -> np.ndarray:
    wp = np.asarray(waypoints, dtype=np.float64)
    if wp.ndim != 2 or wp.shape[1] != 2:
        raise InputError(name, f"expected an (N, 2) array of (x, y), got shape {wp.shape}")
    return wp


def waypoints_to_odom(waypoints: np.ndarray, pose: Sequence[float]) -> np.ndarray:
    """Ego-frame (N, 2) waypoints -> the odometry frame, given the ego pose (x, y, yaw) there."""
    wp = _points(waypoints, "waypoints")
    x, y, yaw = (float(v) for v in pose)
    return ego_to_world(wp, x, y, yaw)


def path_msg(waypoints_odom: np.ndarray, stamp: Time | float, frame_id: str,
             origin: Sequence[float] | None = None) -> Path:
    """nav_msgs/Path of the waypoints, pose i stamped ``stamp + 0.5 s * (i + 1)``, each oriented along the segment
    reaching it. ``origin`` is the ego pose (x, y[, yaw]) in the same frame: the first segment starts there (without
    it, the first pose takes the second's heading). Segments under 1 mm keep the previous heading."""
    wp = _points(waypoints_odom, "waypoints_odom")
    t0 = to_time(stamp)
    base_ns = t0.sec * _NS + t0.nanosec
    start = None if origin is None else np.array([float(origin[0]), float(origin[1])])
    heading = float(origin[2]) if origin is not None and len(origin) > 2 else 0.0
    yaws = []
    for i in range(len(wp)):
        frm = start if i == 0 else wp[i - 1]
        if frm is not None and np.hypot(*(wp[i] - frm)) >= 1e-3:
            heading = math.atan2(wp[i][1] - frm[1], wp[i][0] - frm[0])
        yaws.append(heading)
    if start is None and len(wp) > 1:
        yaws[0] = yaws[1]
    path = Path()
    path.header.stamp, path.header.frame_id = t0, frame_id
    for i, ((x, y), yaw) in enumerate(zip(wp, yaws)):
        pose = PoseStamped()
        pose.header.stamp = time_ns(base_ns + round(fmt.WAYPOINT_DT_S * _NS) * (i + 1))
        pose.header.frame_id = frame_id
        pose.pose.position.x, pose.pose.position.y = float(x), float(y)
        pose.pose.orientation = quaternion_from_yaw(yaw)
        path.poses.append(pose)
    return path


def confidence_color(confidence: float) -> ColorRGBA:
    """Red at 0 to green at 1 (NaN counts as 0)."""
    c = min(max(float(confidence), 0.0), 1.0) if math.isfinite(confidence) else 0.0
    return ColorRGBA(r=1.0 - c, g=c, b=0.0, a=1.0)


def markers_msg(waypoints_odom: np.ndarray, confidence: Sequence[float], boxes_text: str, stamp: Time | float,
                frame_id: str, ns: str = "wamdiff") -> MarkerArray:
    """RViz markers: DELETEALL (so stale ones vanish), then a LINE_STRIP of the path, a SPHERE_LIST coloured by
    confidence (red 0 .. green 1) and, when ``boxes_text`` is not empty, a TEXT_VIEW_FACING above the first point."""
    wp = _points(waypoints_odom, "waypoints_odom")
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    if conf.size != len(wp):
        raise InputError("confidence", f"expected {len(wp)} values (one per waypoint), got {conf.size}")
    t0 = to_time(stamp)

    def marker(mid: int, mtype: int, action: int = Marker.ADD) -> Marker:
        m = Marker(ns=ns, id=mid, type=mtype, action=action)
        m.header.stamp, m.header.frame_id = t0, frame_id
        m.pose.orientation.w = 1.0
        return m

    out = MarkerArray()
    out.markers.append(marker(0, Marker.SPHERE, Marker.DELETEALL))
    points = [Point(x=float(x), y=float(y), z=0.0) for x, y in wp]
    if len(points) >= 2:
        line = marker(0, Marker.LINE_STRIP)
        line.scale.x = 0.15
        line.color = ColorRGBA(r=0.0, g=0.6, b=1.0, a=0.9)
        line.points = points
        out.markers.append(line)
    if points:
        spheres = marker(1, Marker.SPHERE_LIST)
        spheres.scale.x = spheres.scale.y = spheres.scale.z = 0.4
        spheres.color = confidence_color(float(np.nan_to_num(conf.mean())))
        spheres.points = points
        spheres.colors = [confidence_color(c) for c in conf]
        out.markers.append(spheres)
    if boxes_text:
        text = marker(2, Marker.TEXT_VIEW_FACING)
        text.pose.position.x, text.pose.position.y = (float(wp[0, 0]), float(wp[0, 1])) if len(wp) else (0.0, 0.0)
        text.pose.position.z = 2.0
        text.scale.z = 0.6
        text.color = ColorRGBA(r=1.0, g=1.0, b=1.0, a=1.0)
        text.text = boxes_text
        out.markers.append(text)
    return out
