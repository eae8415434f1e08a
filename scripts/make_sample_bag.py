#!/usr/bin/env python3
"""Write the bundled sample drive, ``wamdiff_ros/assets/sample_drive.mcap``: ~10 s of the planner node's inputs.

Deterministic (same bytes on every run with the pinned packages). Stamps start at 1,700,000,000 s; the log time of
every message equals its header stamp. On the planner node's input topics:

* ``/wamdiff_planner/input/image``: sensor_msgs/msg/Image, rgb8 256x128, 10 Hz, 100 frames at t = 0.02 + 0.1 k s
  (20 ms after the odometry, as unsynchronised sensors are), frame ``camera``. The scene of
  ``scripts/make_sample_image.py`` (the bundled sample_front.png) drawn at 512x256 and box-downscaled, animated:
  the lane dashes scroll by the ego's 6 m/s and the three vehicles drift slowly.
* ``/wamdiff_planner/input/odometry``: nav_msgs/msg/Odometry, 20 Hz, 200 messages at t = 0.05 k s, frame ``odom``,
  child ``base_link``: driving straight along +x at 6 m/s (x = 6 t, yaw 0, twist.linear.x = 6).
* ``/wamdiff_planner/input/command``: wamdiff_ros/msg/DrivingCommand LEFT, once at t = 0 (offered QoS reliable +
  transient local: replay latches it).

Full-size frames (98 KB each, 9.8 MB raw) fit the 5 MB budget through the MCAP's zstd chunk compression, which
every MCAP reader (ros2 bag, rosbags, Foxglove) decodes; the messages themselves are plain sensor_msgs/Image.

Usage: python scripts/make_sample_bag.py [OUTPUT.mcap]
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from wamdiff_ros.ros.bags import McapFile, bag_qos, typestore
from wamdiff_ros.ros.conversions import quaternion_from_yaw, rgb_to_image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "wamdiff_ros" / "assets" / "sample_drive.mcap"
NODE = "/wamdiff_planner"
IMAGE_TOPIC, ODOM_TOPIC, COMMAND_TOPIC = (f"{NODE}/input/{t}" for t in ("image", "odometry", "command"))
T0_NS = 1_700_000_000 * 10**9
SPEED = 6.0  # m/s
IMAGE_HZ, ODOM_HZ = 10, 20
N_IMAGES, N_ODOM = 100, 200
IMAGE_OFFSET_NS = 20_000_000
SIZE = (256, 128)


def _scene():
    spec = importlib.util.spec_from_file_location("make_sample_image", ROOT / "scripts" / "make_sample_image.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def draw_frame(scene, t: float) -> np.ndarray:
    """The sample scene at time t: dashes 6 t metres further back (mod 9 m), vehicles drifting; 256x128 RGB."""
    img = Image.new("RGB", (scene.W, scene.H))
    d = ImageDraw.Draw(img)
    scene.draw_background(d)
    near, far, edge, lane = 1.0, scene.FAR, scene.EDGE, scene.LANE
    d.polygon(scene.ground_quad(near, far, -edge - 0.6, edge + 0.6), fill=(150, 150, 140))
    d.polygon(scene.ground_quad(near, far, -edge, edge), fill=(95, 95, 100))
    for y in (-0.85, 0.85, lane - 0.85, lane + 0.85, -lane - 0.85, -lane + 0.85):
        d.polygon(scene.ground_quad(near, far, y - 0.3, y + 0.3), fill=(90, 90, 95))
    for y in (-edge + 0.1, edge - 0.1):
        d.polygon(scene.ground_quad(near, far, y - 0.08, y + 0.08), fill=(235, 235, 225))
    phase = (SPEED * t) % 9.0
    for y in (-lane / 2, lane / 2):  # 3 m dashes every 9 m, scrolling towards the camera
        x = 2.0 - phase
        while x < 120.0:
            x0, x1 = max(x, near), x + 3.0
            if x1 > x0:
                d.polygon(scene.ground_quad(x0, x1, y - 0.07, y + 0.07), fill=(240, 240, 240))
            x += 9.0
    vehicles = ((40.0 + 0.8 * t, -lane, (205, 205, 210)), (20.0 - 0.4 * t, 0.0, (170, 40, 35)),
                (9.0 + 1.5 * math.sin(0.5 * t), lane, (40, 80, 160)))
    for x, y, colour in vehicles:  # far to near
        scene.draw_vehicle(d, x, y, colour)
    return np.asarray(img.resize(SIZE, Image.Resampling.BOX))


def make_bag(out: Path) -> Path:
    """Serialized with rosbags (its CDR zeroes the alignment padding, so the bytes are reproducible; rclpy's
    serializer leaves padding bytes uninitialised)."""
    scene = _scene()
    store = typestore()
    T = store.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    geo = {n: T[f"geometry_msgs/msg/{n}"] for n in ("Point", "Quaternion", "Pose", "PoseWithCovariance", "Vector3",
                                                     "Twist", "TwistWithCovariance")}

    def header(t_ns: int, frame: str):
        sec, nanosec = divmod(t_ns, 10**9)
        return Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=frame)

    def ser(msg, msgtype: str) -> bytes:
        return bytes(store.serialize_cdr(msg, msgtype))

    records: list[tuple[int, int, str, str, bytes, list]] = []  # (t, order, topic, type, data, offered qos)
    command_type = "wamdiff_ros/msg/DrivingCommand"
    cmd = T[command_type](header=header(T0_NS, "base_link"), command=T[command_type].LEFT)
    records.append((T0_NS, 0, COMMAND_TOPIC, command_type, ser(cmd, command_type), [bag_qos(True, True, 1)]))
    zero3, cov = geo["Vector3"](x=0.0, y=0.0, z=0.0), np.zeros(36, dtype=np.float64)
    for k in range(N_ODOM):
        t_ns = T0_NS + k * 10**9 // ODOM_HZ
        t = (t_ns - T0_NS) * 1e-9
        q = quaternion_from_yaw(0.0)
        pose = geo["Pose"](position=geo["Point"](x=SPEED * t, y=0.0, z=0.0),
                           orientation=geo["Quaternion"](x=q.x, y=q.y, z=q.z, w=q.w))
        twist = geo["Twist"](linear=geo["Vector3"](x=SPEED, y=0.0, z=0.0), angular=zero3)
        odom = T["nav_msgs/msg/Odometry"](header=header(t_ns, "odom"), child_frame_id="base_link",
                                          pose=geo["PoseWithCovariance"](pose=pose, covariance=cov),
                                          twist=geo["TwistWithCovariance"](twist=twist, covariance=cov))
        records.append((t_ns, 1, ODOM_TOPIC, "nav_msgs/msg/Odometry", ser(odom, "nav_msgs/msg/Odometry"),
                        [bag_qos(True)]))
    for k in tqdm(range(N_IMAGES), desc="frames", unit="frame", disable=None):
        t_ns = T0_NS + IMAGE_OFFSET_NS + k * 10**9 // IMAGE_HZ
        rgb = draw_frame(scene, (t_ns - T0_NS) * 1e-9)
        ref = rgb_to_image(rgb, 0.0, "camera")  # the node's own conversion fixes the layout (step, encoding)
        img = T["sensor_msgs/msg/Image"](header=header(t_ns, "camera"), height=ref.height, width=ref.width,
                                         encoding=ref.encoding, is_bigendian=ref.is_bigendian, step=ref.step,
                                         data=np.frombuffer(bytes(ref.data), dtype=np.uint8))
        records.append((t_ns, 2, IMAGE_TOPIC, "sensor_msgs/msg/Image", ser(img, "sensor_msgs/msg/Image"),
                        [bag_qos(False, False, 5)]))
    records.sort(key=lambda r: (r[0], r[1]))
    if out.exists():
        out.unlink()
    with McapFile(out, store, compress=True) as bag:
        for t_ns, _, topic, msgtype, data, qos in records:
            bag.write(topic, msgtype, t_ns, data, qos)
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    make_bag(out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
