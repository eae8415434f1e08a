"""ROS message <-> plain type conversions, with the real rclpy message classes."""

import io
import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Quaternion
from nav_msgs.msg import Odometry, Path
from PIL import Image as PILImage
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import CompressedImage, Image
from visualization_msgs.msg import Marker, MarkerArray

from wamdiff_ros.errors import EgoStateError, ImageError, InputError
from wamdiff_ros.format import Box
from wamdiff_ros.planner import EgoState
from wamdiff_ros.ros.conversions import (
    ENCODINGS,
    EgoEstimator,
    box_to_pixels,
    compressed_to_rgb,
    image_to_rgb,
    markers_msg,
    odometry_to_velocity,
    path_msg,
    pose2d,
    quaternion_from_yaw,
    rgb_to_image,
    stamp_to_sec,
    waypoints_to_odom,
    yaw_from_quaternion,
)

H, W = 48, 64


@pytest.fixture
def rgb() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (H, W, 3), dtype=np.uint8)


def raw_image(pixels: np.ndarray, encoding: str, pad: int = 0, big_endian: bool = False) -> Image:
    """An Image built by hand from (H, W, C) channel values (uint8 or uint16), with ``pad`` junk bytes per row."""
    h, w = pixels.shape[:2]
    if pixels.dtype == np.uint16:
        pixels = pixels.astype(">u2" if big_endian else "<u2")
    rows = np.ascontiguousarray(pixels).view(np.uint8).reshape(h, -1)
    rows = np.concatenate([rows, np.full((h, pad), 0xAB, dtype=np.uint8)], axis=1)
    msg = Image(height=h, width=w, encoding=encoding, is_bigendian=int(big_endian), step=rows.shape[1])
    msg.data = rows.tobytes()
    return msg


# ---------------------------------------------------------------------------------------------------------------
# sensor_msgs/Image


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_every_encoding_round_trips_pixel_exactly(rgb, encoding):
    image = np.repeat(rgb[..., :1], 3, axis=2) if encoding.startswith("mono") else rgb
    msg = rgb_to_image(image, 12.5, "camera", encoding)
    msg = deserialize_message(serialize_message(msg), Image)  # what a subscriber receives
    out = image_to_rgb(msg)
    assert out.shape == (H, W, 3) and out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.writeable
    np.testing.assert_array_equal(out, image)


def test_rgb_to_image_fields(rgb):
    msg = rgb_to_image(rgb, Time(sec=3, nanosec=7), "cam_front", "bgra8")
    assert (msg.height, msg.width, msg.step, msg.encoding, msg.is_bigendian) == (H, W, W * 4, "bgra8", 0)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (3, 7, "cam_front")
    first = bytes(msg.data[:4])
    assert first == bytes([rgb[0, 0, 2], rgb[0, 0, 1], rgb[0, 0, 0], 255])
    assert rgb_to_image(rgb, 1.25, "c").header.stamp == Time(sec=1, nanosec=250_000_000)
    assert bytes(rgb_to_image(rgb, 0, "c", "mono8").data[:1]) == bytes(
        [(299 * int(rgb[0, 0, 0]) + 587 * int(rgb[0, 0, 1]) + 114 * int(rgb[0, 0, 2]) + 500) // 1000])


def test_image_to_rgb_returns_a_copy(rgb):
    msg = rgb_to_image(rgb, 0.0, "c")
    out = image_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)


def test_bgr_swaps_channels(rgb):
    np.testing.assert_array_equal(image_to_rgb(raw_image(rgb[..., ::-1], "bgr8")), rgb)
    np.testing.assert_array_equal(image_to_rgb(raw_image(rgb, "bgr8")), rgb[..., ::-1])


def test_alpha_is_dropped(rgb):
    alpha = np.random.default_rng(2).integers(0, 256, (H, W, 1), dtype=np.uint8)
    np.testing.assert_array_equal(image_to_rgb(raw_image(np.concatenate([rgb, alpha], 2), "rgba8")), rgb)
    np.testing.assert_array_equal(image_to_rgb(raw_image(np.concatenate([rgb[..., ::-1], alpha], 2), "bgra8")), rgb)


def test_mono8_broadcasts(rgb):
    grey = rgb[..., :1]
    out = image_to_rgb(raw_image(grey, "mono8"))
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], grey[..., 0])


@pytest.mark.parametrize("encoding,channels", [("rgb8", 3), ("bgr8", 3), ("rgba8", 4), ("mono8", 1),
                                                ("rgb16", 3), ("mono16", 1)])
def test_padded_rows_are_skipped(rgb, encoding, channels):
    px = np.concatenate([rgb, rgb[..., :1]], 2)[..., :channels]
    if encoding.startswith("bgr"):
        px = px[..., ::-1]
    expected = np.repeat(px, 3, axis=2) if channels == 1 else rgb
    if encoding.endswith("16"):
        px = px.astype(np.uint16) * 256 + 77
    msg = raw_image(px, encoding, pad=13)
    assert msg.step == W * channels * (2 if encoding.endswith("16") else 1) + 13
    np.testing.assert_array_equal(image_to_rgb(msg), expected)


@pytest.mark.parametrize("big_endian", [True, False])
def test_16_bit_honours_byte_order_and_keeps_the_high_byte(rgb, big_endian):
    values = rgb.astype(np.uint16) * 256 + np.random.default_rng(3).integers(0, 256, rgb.shape).astype(np.uint16)
    msg = raw_image(values, "rgb16", big_endian=big_endian)
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)
    msg.is_bigendian = int(not big_endian)  # the same bytes read the other way round give the low bytes
    assert not np.array_equal(image_to_rgb(msg), rgb)
    mono = raw_image(values[..., :1], "mono16", big_endian=big_endian)
    np.testing.assert_array_equal(image_to_rgb(mono), np.repeat(rgb[..., :1], 3, axis=2))


def test_data_longer_than_needed_and_list_data(rgb):
    msg = rgb_to_image(rgb, 0.0, "c")
    msg.data = bytes(msg.data) + b"\x00" * 10
    np.testing.assert_array_equal(image_to_rgb(msg), rgb)
    tiny = Image(height=1, width=2, encoding="mono8", step=2)
    tiny.data = [5, 250]
    np.testing.assert_array_equal(image_to_rgb(tiny), [[[5, 5, 5], [250, 250, 250]]])


@pytest.mark.parametrize("change,words", [
    (dict(encoding="yuv422"), ["unsupported encoding", "yuv422", "rgb8"]),
    (dict(encoding="32FC1"), ["unsupported encoding"]),
    (dict(encoding=""), ["unsupported encoding"]),
    (dict(height=0), ["empty", "64x0"]),
    (dict(width=0), ["empty"]),
    (dict(step=W * 3 - 1), ["step 191", "width*channels*bytes", "192"]),
    (dict(data=b"\x00" * (H * W * 3 - 1)), ["data has 9215 bytes", "height*step", "9216"]),
    (dict(data=b""), ["data has 0 bytes"]),
])
def test_malformed_images_raise_image_error(rgb, change, words):
    msg = rgb_to_image(rgb, 0.0, "c")
    for key, value in change.items():
        setattr(msg, key, value)
    with pytest.raises(ImageError) as info:
        image_to_rgb(msg)
    assert info.value.field == "image" and isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


def test_16_bit_step_counts_two_bytes_per_channel(rgb):
    msg = rgb_to_image(rgb, 0.0, "c", "rgb16")
    msg.step = W * 3
    with pytest.raises(ImageError, match=r"64\*3\*2 = 384"):
        image_to_rgb(msg)


def test_rgb_to_image_rejects_bad_arrays(rgb):
    for bad in (rgb[..., :2], rgb.astype(np.float32), np.zeros((0, 4, 3), np.uint8), rgb[..., 0]):
        with pytest.raises(ImageError, match="HxWx3 uint8"):
            rgb_to_image(bad, 0.0, "c")
    with pytest.raises(ImageError, match="unsupported encoding"):
        rgb_to_image(rgb, 0.0, "c", "jpeg")


# ---------------------------------------------------------------------------------------------------------------
# sensor_msgs/CompressedImage


def compressed(pil: PILImage.Image, fmt: str, **kwargs) -> CompressedImage:
    buf = io.BytesIO()
    pil.save(buf, format=fmt, **kwargs)
    msg = CompressedImage(format=fmt.lower())
    msg.data = buf.getvalue()
    return msg


def test_png_decodes_pixel_exactly(rgb):
    out = compressed_to_rgb(compressed(PILImage.fromarray(rgb), "PNG"))
    assert out.flags.c_contiguous and out.dtype == np.uint8
    np.testing.assert_array_equal(out, rgb)
    grey = compressed_to_rgb(compressed(PILImage.fromarray(rgb[..., 0]), "PNG"))
    np.testing.assert_array_equal(grey, np.repeat(rgb[..., :1], 3, axis=2))
    np.testing.assert_array_equal(compressed_to_rgb(compressed(PILImage.fromarray(rgb).convert("RGBA"), "PNG")), rgb)


def test_16_bit_png_keeps_the_high_byte(rgb):
    values = rgb[..., 0].astype(np.uint16) * 256 + 200
    out = compressed_to_rgb(compressed(PILImage.fromarray(values), "PNG"))
    np.testing.assert_array_equal(out, np.repeat(rgb[..., :1], 3, axis=2))


def test_jpeg_decodes_close_to_the_source():
    y, x = np.mgrid[0:H, 0:W]
    smooth = np.stack([x * 4, y * 5, (x + y) * 2], axis=2).astype(np.uint8)
    out = compressed_to_rgb(compressed(PILImage.fromarray(smooth), "JPEG", quality=95))
    assert out.shape == (H, W, 3)
    assert np.abs(out.astype(int) - smooth).mean() < 3


@pytest.mark.parametrize("data", [b"", b"not an image at all", None])
def test_corrupt_compressed_raises_image_error(rgb, data):
    msg = CompressedImage(format="jpeg")
    if data is None:  # a PNG cut in half: the header parses, the pixels do not
        data = bytes(compressed(PILImage.fromarray(rgb), "PNG").data)[:200]
    msg.data = data
    with pytest.raises(ImageError) as info:
        compressed_to_rgb(msg)
    assert info.value.field == "image" and "jpeg" in str(info.value)


def test_compressed_depth_is_refused(rgb):
    msg = compressed(PILImage.fromarray(rgb), "PNG")
    msg.format = "16UC1; compressedDepth png"
    with pytest.raises(ImageError, match="depth"):
        compressed_to_rgb(msg)


# ---------------------------------------------------------------------------------------------------------------
# Odometry, poses, ego state


def odometry(t: float, vx: float, vy: float = 0.0, x: float = 0.0, y: float = 0.0, yaw: float = 0.0,
             yaw_rate: float = 0.0) -> Odometry:
    msg = Odometry(child_frame_id="base_link")
    msg.header.frame_id = "odom"
    msg.header.stamp = Time(sec=int(t // 1), nanosec=int(round((t % 1) * 1e9)))
    msg.pose.pose.position.x, msg.pose.pose.position.y = x, y
    msg.pose.pose.orientation = quaternion_from_yaw(yaw)
    msg.twist.twist.linear.x, msg.twist.twist.linear.y = vx, vy
    msg.twist.twist.angular.z = yaw_rate
    return msg


def test_odometry_velocity_is_the_body_frame_twist():
    assert odometry_to_velocity(odometry(1.0, 3.5, -0.25, yaw=2.0)) == (3.5, -0.25)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_odometry_non_finite_velocity_raises(bad):
    with pytest.raises(EgoStateError, match="finite") as info:
        odometry_to_velocity(odometry(1.0, bad))
    assert info.value.field.startswith("odometry.twist")
    with pytest.raises(EgoStateError):
        odometry_to_velocity(odometry(1.0, 1.0, bad))


@pytest.mark.parametrize("yaw", [0.0, 0.3, math.pi / 2, -2.5, 3.1])
def test_yaw_and_pose2d(yaw):
    q = quaternion_from_yaw(yaw)
    assert yaw_from_quaternion(q) == pytest.approx(yaw)
    scaled = Quaternion(x=q.x * 3, y=q.y * 3, z=q.z * 3, w=q.w * 3)
    assert yaw_from_quaternion(scaled) == pytest.approx(yaw)
    assert pose2d(odometry(0.0, 0.0, x=4.0, y=-2.0, yaw=yaw)) == pytest.approx((4.0, -2.0, yaw))


def test_pose2d_rejects_nan_and_zero_quaternion():
    with pytest.raises(EgoStateError, match="finite"):
        pose2d(odometry(0.0, 0.0, x=math.nan))
    msg = odometry(0.0, 0.0)
    msg.pose.pose.orientation = Quaternion(x=0.0, y=0.0, z=0.0, w=0.0)
    with pytest.raises(EgoStateError, match="zero"):
        pose2d(msg)


def test_stamp_to_sec():
    assert stamp_to_sec(Time(sec=5, nanosec=250_000_000)) == 5.25


STAMPS = np.cumsum(np.r_[100.0, 0.02 + 0.004 * np.sin(np.arange(150))])  # ~50 Hz with jitter


def test_estimator_steady_ramp_gives_its_acceleration():
    est = EgoEstimator(time_constant=0.2)
    states = [est.update(t, (2.0 * (t - STAMPS[0]) + 1.0, 0.0), yaw=0.0) for t in STAMPS]
    assert states[0] == EgoState((1.0, 0.0), (0.0, 0.0))
    assert isinstance(states[-1], EgoState)
    assert states[-1].acceleration == pytest.approx((2.0, 0.0), abs=1e-6)
    assert states[-1].velocity == pytest.approx((2.0 * (STAMPS[-1] - STAMPS[0]) + 1.0, 0.0))


def test_estimator_constant_velocity_gives_zero():
    est = EgoEstimator()
    for t in STAMPS:
        state = est.update(t, (8.0, 0.3), yaw=1.0)
    assert state.acceleration == pytest.approx((0.0, 0.0), abs=1e-9)


def test_estimator_low_pass_follows_its_time_constant():
    est = EgoEstimator(time_constant=0.5)
    t0 = 50.0
    for t in np.arange(0, 1.0, 0.02) + t0:  # constant speed
        est.update(t, (5.0, 0.0))
    start = t
    for t in np.arange(1, 26) * 0.02 + start:  # then 2 m/s^2 for 0.5 s = one time constant
        state = est.update(t, (5.0 + 2.0 * (t - start), 0.0))
    assert state.acceleration[0] == pytest.approx(2.0 * (1 - math.exp(-1.0)), rel=1e-6)
    raw = EgoEstimator(time_constant=0.0)
    raw.update(0.0, (0.0, 0.0))
    assert raw.update(0.5, (1.0, 0.0)).acceleration == (2.0, 0.0)


@pytest.mark.parametrize("direction", [1.0, -1.0])
@pytest.mark.parametrize("yaw0", [0.0, 3.0])  # 3.0 crosses the +-pi wrap
def test_estimator_turn_gives_centripetal_acceleration(direction, yaw0):
    speed, rate = 5.0, 0.5 * direction
    est = EgoEstimator(time_constant=0.1)
    for t in STAMPS:
        state = est.update(t, (speed, 0.0), yaw=math.remainder(yaw0 + rate * (t - STAMPS[0]), math.tau))
    ax, ay = state.acceleration
    assert ay == pytest.approx(speed * rate, rel=0.01)  # +y (left) for a left turn
    assert abs(ax) < 0.05


@pytest.mark.parametrize("yaw_from", ["pose", "twist"])
def test_estimator_from_odometry_messages(yaw_from):
    est = EgoEstimator(time_constant=0.1, yaw_from=yaw_from)
    for t in STAMPS:
        state = est.update_odometry(odometry(t, 4.0, yaw=0.25 * (t - STAMPS[0]), yaw_rate=0.25))
    assert state.acceleration == pytest.approx((0.0, 1.0), abs=0.01)


def test_estimator_ignores_duplicate_stamps():
    est = EgoEstimator(time_constant=0.0)
    est.update(10.0, (1.0, 0.0))
    first = est.update(10.1, (1.2, 0.0))
    again = est.update(10.1, (1.2, 0.0))
    assert again == first and first.acceleration == pytest.approx((2.0, 0.0))
    assert est.update(10.2, (1.4, 0.0)).acceleration == pytest.approx((2.0, 0.0))
    assert est.resets == 0


def test_estimator_resets_when_time_goes_backwards_or_jumps():
    est = EgoEstimator(time_constant=0.0, max_gap=1.0)
    est.update(10.0, (1.0, 0.0))
    assert est.update(10.5, (2.0, 0.0)).acceleration == pytest.approx((2.0, 0.0))
    after = est.update(3.0, (7.0, 0.0))  # e.g. a bag restarted
    assert after == EgoState((7.0, 0.0), (0.0, 0.0)) and est.resets == 1
    assert est.update(3.5, (6.0, 0.0)).acceleration == pytest.approx((-2.0, 0.0))
    assert est.update(9.0, (6.0, 0.0)).acceleration == (0.0, 0.0) and est.resets == 2


def test_estimator_rejects_non_finite_input_and_keeps_its_state():
    est = EgoEstimator(time_constant=0.0)
    est.update(0.0, (0.0, 0.0))
    est.update(1.0, (1.0, 0.0))
    with pytest.raises(EgoStateError):
        est.update(2.0, (math.nan, 0.0))
    with pytest.raises(EgoStateError):
        est.update(math.inf, (1.0, 0.0))
    assert est.state == EgoState((1.0, 0.0), (1.0, 0.0))
    with pytest.raises(InputError):
        EgoEstimator(time_constant=-1.0)


# ---------------------------------------------------------------------------------------------------------------
# Plans: waypoints, Path, markers, boxes

WAYPOINTS = np.array([[2.0 * (i + 1), 0.1 * i] for i in range(8)], dtype=np.float32)


def test_waypoints_to_odom_rotated_90_degrees():
    out = waypoints_to_odom(np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 2.0]]), (10.0, -5.0, math.pi / 2))
    np.testing.assert_allclose(out, [[10.0, -4.0], [9.0, -5.0], [8.0, -2.0]], atol=1e-12)
    assert waypoints_to_odom(WAYPOINTS, (0.0, 0.0, 0.0)).shape == (8, 2)
    with pytest.raises(InputError, match=r"\(N, 2\)"):
        waypoints_to_odom(np.zeros(16), (0.0, 0.0, 0.0))


def test_path_stamps_and_frame():
    path = path_msg(WAYPOINTS, Time(sec=10, nanosec=750_000_000), "odom")
    path = deserialize_message(serialize_message(path), Path)
    assert path.header.frame_id == "odom" and len(path.poses) == 8
    for i, pose in enumerate(path.poses):
        assert stamp_to_sec(pose.header.stamp) == pytest.approx(10.75 + 0.5 * (i + 1))
        assert pose.header.frame_id == "odom"
        assert (pose.pose.position.x, pose.pose.position.y) == pytest.approx(tuple(WAYPOINTS[i]))
    assert path.poses[0].header.stamp == Time(sec=11, nanosec=250_000_000)


def test_path_orientations_follow_the_path():
    pose = (3.0, 4.0, math.pi / 2)
    straight = waypoints_to_odom(WAYPOINTS * [1, 0], pose)  # straight ahead of an ego facing +y
    path = path_msg(straight, 0.0, "odom", origin=pose)
    assert all(yaw_from_quaternion(p.pose.orientation) == pytest.approx(math.pi / 2) for p in path.poses)
    bent = path_msg(np.array([[1.0, 1.0], [2.0, 1.0], [2.0, 0.0]]), 0.0, "map", origin=(0.0, 0.0))
    yaws = [yaw_from_quaternion(p.pose.orientation) for p in bent.poses]
    assert yaws == pytest.approx([math.pi / 4, 0.0, -math.pi / 2])  # the first from the ego origin
    no_origin = path_msg(np.array([[1.0, 1.0], [2.0, 1.0]]), 0.0, "map")
    assert [yaw_from_quaternion(p.pose.orientation) for p in no_origin.poses] == pytest.approx([0.0, 0.0])


def test_stopped_plan_keeps_the_ego_heading():
    pose = (1.0, 2.0, -0.7)
    path = path_msg(waypoints_to_odom(np.zeros((8, 2)), pose), 0.0, "odom", origin=pose)
    assert all(yaw_from_quaternion(p.pose.orientation) == pytest.approx(-0.7) for p in path.poses)


def test_markers_count_order_and_colours():
    conf = np.array([0.0, 0.25, 0.5, 1.0, 1.5, math.nan, 0.9, 0.1])
    arr = markers_msg(WAYPOINTS, conf, "car:1,2,3,4", Time(sec=7), "odom", "plan")
    arr = deserialize_message(serialize_message(arr), MarkerArray)
    kinds = [(m.type, m.action) for m in arr.markers]
    assert kinds[0][1] == Marker.DELETEALL
    assert kinds[1:] == [(Marker.LINE_STRIP, Marker.ADD), (Marker.SPHERE_LIST, Marker.ADD),
                         (Marker.TEXT_VIEW_FACING, Marker.ADD)]
    for m in arr.markers:
        assert (m.ns, m.header.frame_id, m.header.stamp.sec, m.pose.orientation.w) == ("plan", "odom", 7, 1.0)
    ids = [(m.type, m.id) for m in arr.markers[1:]]
    assert len(set(ids)) == len(ids)
    line, spheres, text = arr.markers[1:]
    assert len(line.points) == len(spheres.points) == len(spheres.colors) == 8
    assert (spheres.points[3].x, spheres.points[3].y) == pytest.approx(tuple(WAYPOINTS[3]))
    rg = [(c.r, c.g, c.b, c.a) for c in spheres.colors]
    expected = [0.0, 0.25, 0.5, 1.0, 1.0, 0.0, 0.9, 0.1]
    np.testing.assert_allclose(rg, [(1 - c, c, 0.0, 1.0) for c in expected], atol=1e-6)
    assert text.text == "car:1,2,3,4" and text.scale.z > 0 and line.scale.x > 0 and spheres.scale.x > 0


def test_markers_without_text_or_points():
    assert len(markers_msg(WAYPOINTS, np.ones(8), "", 0.0, "odom", "plan").markers) == 3
    empty = markers_msg(np.zeros((0, 2)), [], "no plan", 0.0, "odom", "plan")
    assert [m.type for m in empty.markers[1:]] == [Marker.TEXT_VIEW_FACING]
    with pytest.raises(InputError, match="one per waypoint"):
        markers_msg(WAYPOINTS, np.ones(7), "", 0.0, "odom", "plan")


def test_box_to_pixels():
    assert box_to_pixels(Box("car", 0, 0, 1000, 1000), 640, 480) == (0, 0, 640, 480)
    assert box_to_pixels(Box("car", 250, 500, 750, 1000), 640, 480) == (160, 240, 480, 480)
    assert box_to_pixels(Box("car", 750, 900, 250, 100), 640, 480) == (160, 48, 480, 432)  # swapped corners
    assert box_to_pixels(Box("car", -50, 0, 1200, 10), 100, 100) == (0, 0, 100, 1)  # clipped
    with pytest.raises(ImageError):
        box_to_pixels(Box("car", 0, 0, 1, 1), 0, 480)
