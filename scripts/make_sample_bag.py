#!/usr/bin/env python3
"""Write the bundled sample drive, ``wamdiff_ros/assets/sample_drive.mcap``, and the sample image
``wamdiff_ros/assets/sample_front.png``: the first 10 s of a real episode of the package's CPU world.

The episode: the frozen ``highway`` scenario (``scenarios_v1.yaml``) at held-out seed 1000009 (test split), driven
as the data export drives it (``wamdiff_training.world.demonstrations.rollout`` without perturbations): the
privileged expert replans at every camera frame and the package's WaypointFollower and highway-env actuator follow
it. The ego closes at 24 m/s on a 15 m/s car 60 m ahead in its lane (passing a braking car on its right), brakes,
changes to the left lane from 2.5 s and is drawing level with the slow car at 10 s; traffic is in view throughout.

Deterministic (same bytes on every run with the pinned packages). Stamps start at 1,700,000,000 s; the log time of
every message equals its header stamp. On the planner node's input topics:

* ``/wamdiff_planner/input/image``: sensor_msgs/msg/Image, rgb8 256x128 (the world's front camera, as in the
  training data), 10 Hz, 100 frames. Frame k is the world at t = 0.1 k s, stamped 20 ms later (as unsynchronised
  sensors are), so the node pairs it with the odometry of that very instant. Frame ``camera``.
* ``/wamdiff_planner/input/odometry``: nav_msgs/msg/Odometry, 20 Hz (every world step), 200 messages at t = 0.05 k s,
  frame ``odom`` (the ego's start pose: it starts at the origin facing +x), child ``base_link``: the pose in odom,
  the twist in base_link (REP-105), i.e. the world's ego-frame velocity, and the yaw rate of the last step. The node
  derives the ego acceleration from it.
* ``/wamdiff_planner/input/command``: wamdiff_ros/msg/DrivingCommand, the route's command at t = 0 and again
  whenever it changes (on the highway: LANE_FOLLOW once); offered QoS reliable + transient local: replay latches it.
* ``/route/path``: nav_msgs/msg/Path, the route the drive followed as the highway bridge publishes it (its
  ``route/path``: the route lane's centre 0-60 m ahead, ``ROUTE_PATH_M``), in ``odom``, at every camera frame, stamped
  with the frame's world instant; offered QoS reliable + transient local. The shipped model was trained with the
  route points the node reads from it (``wamdiff-demo`` remaps the node's ``~/input/route`` to it).

sample_front.png is frame ``SAMPLE_FRAME`` of the bag, pixel for pixel. The frames (98 KB each, 9.8 MB raw) shrink
to ~0.14 MB in the MCAP's zstd chunk compression, which every MCAP reader (ros2 bag, rosbags, Foxglove) decodes.

Usage: python scripts/make_sample_bag.py [OUTPUT.mcap] [--image OUTPUT.png]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image as PILImage

from wamdiff_ros import format as fmt
from wamdiff_ros.control import HighwayEnvActuator, TrackedPlan, WaypointFollower
from wamdiff_ros.geometry import Pose2D, wrap_angle
from wamdiff_ros.ros.bags import McapFile, bag_qos, typestore
from wamdiff_ros.route_points import ROUTE_PATH_M
from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, ScenarioSet, load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.world.demonstrations import REPLAN_HZ, recording_gains, sample_steps

ASSETS = Path(__file__).resolve().parents[1] / "wamdiff_ros" / "assets"
DEFAULT_OUT, DEFAULT_IMAGE = ASSETS / "sample_drive.mcap", ASSETS / "sample_front.png"
NODE = "/wamdiff_planner"
IMAGE_TOPIC, ODOM_TOPIC, COMMAND_TOPIC = (f"{NODE}/input/{t}" for t in ("image", "odometry", "command"))
ROUTE_TOPIC = "/route/path"  # the highway bridge's route topic (wamdiff_ros.ros.bridge.highway.TOPICS["route"])
SCENARIO = "highway"
SEED = SPLIT_SEED_BASE["test"] + 9  # held out; the expert overtakes a slower car in the first 10 s
SECONDS = 10.0
SAMPLE_FRAME = 20  # t = 2 s: the slow car 43 m ahead in the ego's lane, a braking one close on the right
T0_NS = 1_700_000_000 * 10**9
IMAGE_HZ, ODOM_HZ = 10, 20
IMAGE_OFFSET_NS = 20_000_000
# DrivingCommand's constant per route command, as wamdiff_ros.ros.bridge.messages.COMMAND_VALUES (which needs
# rclpy; this script needs only rosbags, and stays light without the torch that rclpy's side of the package pulls in)
COMMAND_CONSTANTS = {fmt.Command.FOLLOW: "LANE_FOLLOW", fmt.Command.LEFT: "LEFT", fmt.Command.RIGHT: "RIGHT",
                     fmt.Command.STRAIGHT: "STRAIGHT"}


@dataclass(frozen=True, slots=True)
class Tick:
    """The ego at one world step (0.05 s apart): what the bag's odometry, command and (every other step) image
    carry."""

    pose: Pose2D  # in the odom frame (the start pose)
    velocity: tuple[float, float]  # ego frame, m/s
    yaw_rate: float  # over the last step, rad/s
    command: fmt.Command
    image: np.ndarray | None  # (128, 256, 3) uint8 on camera steps
    route: np.ndarray | None  # (61, 2) the route lane's centre 0-60 m ahead, odom frame, on camera steps


def drive(seed: int = SEED, seconds: float = SECONDS, scenarios: ScenarioSet | None = None) -> list[Tick]:
    """The episode's first ``seconds``, one Tick per world step (the driving of ``demonstrations.rollout``)."""
    scenarios = scenarios or load_scenarios()
    world = World(scenarios.get(SCENARIO), seed, scenarios)
    expert, camera = Expert(world), FrontCamera(world.geometry, CameraConfig())
    gains = recording_gains()
    follower, actuator = WaypointFollower(gains), HighwayEnvActuator(gains)
    if sample_steps(1.0 / ODOM_HZ, world.dt, "the odometry period") != 1:
        raise ValueError(f"odometry at {ODOM_HZ} Hz needs a {ODOM_HZ} Hz world, got {1 / world.dt:g} Hz")
    frame_every = sample_steps(1.0 / IMAGE_HZ, world.dt, "the camera period")
    replan_every = max(1, round(1.0 / (REPLAN_HZ * world.dt)))
    start, ticks, active = world.ego_pose, [], None
    for step in range(round(seconds / world.dt)):
        if world.done:
            raise RuntimeError(f"{SCENARIO} seed {seed} ended ({world.end_reason}) before {seconds} s")
        frame = step % frame_every == 0
        if frame or step % replan_every == 0:
            active = TrackedPlan(expert.plan().waypoints, world.ego_pose, world.t)
        image = camera.render(world.ego_pose, world.others()).image if frame else None
        route = start.to_ego(world.route_centre(ROUTE_PATH_M)) if frame else None  # the start pose is odom's origin
        pose = start.relative(world.ego_pose)
        yaw_rate = wrap_angle(pose.heading - ticks[-1].pose.heading) / world.dt if ticks else 0.0
        ticks.append(Tick(pose, world.ego_velocity(), yaw_rate, world.command, image, route))
        world.step(*actuator(follower.step(active, world.ego_pose, world.ego_speed, world.t)))
    return ticks


def make_bag(out: Path, ticks: list[Tick]) -> Path:
    """Serialized with rosbags (its CDR zeroes the alignment padding, so the bytes are reproducible; rclpy's
    serializer leaves padding bytes uninitialised)."""
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
    command_type, cov, command = "wamdiff_ros/msg/DrivingCommand", np.zeros(36, dtype=np.float64), None
    for k, tick in enumerate(ticks):
        t_ns = T0_NS + k * 10**9 // ODOM_HZ
        if tick.command != command:
            command = tick.command
            cmd = T[command_type](header=header(t_ns, "base_link"),
                                  command=getattr(T[command_type], COMMAND_CONSTANTS[command]))
            records.append((t_ns, 0, COMMAND_TOPIC, command_type, ser(cmd, command_type), [bag_qos(True, True, 1)]))
        half_yaw = 0.5 * tick.pose.heading
        pose = geo["Pose"](position=geo["Point"](x=tick.pose.x, y=tick.pose.y, z=0.0),
                           orientation=geo["Quaternion"](x=0.0, y=0.0, z=math.sin(half_yaw), w=math.cos(half_yaw)))
        twist = geo["Twist"](linear=geo["Vector3"](x=tick.velocity[0], y=tick.velocity[1], z=0.0),
                             angular=geo["Vector3"](x=0.0, y=0.0, z=tick.yaw_rate))
        odom = T["nav_msgs/msg/Odometry"](header=header(t_ns, "odom"), child_frame_id="base_link",
                                          pose=geo["PoseWithCovariance"](pose=pose, covariance=cov),
                                          twist=geo["TwistWithCovariance"](twist=twist, covariance=cov))
        records.append((t_ns, 1, ODOM_TOPIC, "nav_msgs/msg/Odometry", ser(odom, "nav_msgs/msg/Odometry"),
                        [bag_qos(True)]))
        if tick.image is None:
            continue
        path = T["nav_msgs/msg/Path"](header=header(t_ns, "odom"), poses=[
            T["geometry_msgs/msg/PoseStamped"](header=header(t_ns, "odom"), pose=geo["Pose"](
                position=geo["Point"](x=float(x), y=float(y), z=0.0),
                orientation=geo["Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0))) for x, y in tick.route])
        records.append((t_ns, 1, ROUTE_TOPIC, "nav_msgs/msg/Path", ser(path, "nav_msgs/msg/Path"),
                        [bag_qos(True, True, 1)]))
        t_ns += IMAGE_OFFSET_NS
        h, w, _ = tick.image.shape  # rgb8, rows unpadded
        img = T["sensor_msgs/msg/Image"](header=header(t_ns, "camera"), height=h, width=w, encoding="rgb8",
                                         is_bigendian=0, step=3 * w, data=np.ascontiguousarray(tick.image).reshape(-1))
        records.append((t_ns, 2, IMAGE_TOPIC, "sensor_msgs/msg/Image", ser(img, "sensor_msgs/msg/Image"),
                        [bag_qos(False, False, 5)]))
    records.sort(key=lambda r: (r[0], r[1]))
    with McapFile(out, store, compress=True, overwrite=True) as bag:
        for t_ns, _, topic, msgtype, data, qos in records:
            bag.write(topic, msgtype, t_ns, data, qos)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bag", nargs="?", default=str(DEFAULT_OUT), help="output .mcap")
    p.add_argument("--image", default=str(DEFAULT_IMAGE), help="output PNG: frame SAMPLE_FRAME of the drive")
    args = p.parse_args(argv)
    ticks = drive()
    out, image = make_bag(Path(args.bag), ticks), Path(args.image)
    frames = [t.image for t in ticks if t.image is not None]
    PILImage.fromarray(frames[SAMPLE_FRAME]).save(image, optimize=True)
    speeds = [math.hypot(*t.velocity) for t in ticks]
    print(f"{SCENARIO} seed {SEED}: {len(ticks)} steps, {len(frames)} frames, {ticks[-1].pose.x:.0f} m driven, speed "
          f"{min(speeds):.1f}-{max(speeds):.1f} m/s")
    print(f"wrote {out} ({out.stat().st_size} bytes) and {image} ({image.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
