"""Render benchmark: the world's front camera on two scenes with the ego moving, on one core, in one run.

Scenes, built here from plain lane strips: a straight 3-lane highway 1 km long with 10 vehicles around the ego, and
a roundabout (2-lane ring, lane centres at 20 m and 24 m, four entries and exits) with 8 vehicles. Each frame moves
the ego and the traffic by 0.05 s. The table reports frames/s over the timed frames (after a warm-up) and the
per-frame latency percentiles. Torch is not involved and numpy's work per call is too small for BLAS threads, so
the renderer runs on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.world.types import LINE_DASHED, LINE_NONE, LINE_SOLID, LaneStrip, RoadGeometry, VehicleBox

DT_S = 0.05
LANE_W = 4.0
PALETTE = ((200, 40, 40), (40, 90, 200), (230, 230, 230), (30, 30, 30), (220, 180, 30), (60, 150, 70),
           (150, 150, 160), (120, 40, 140), (230, 120, 30), (90, 60, 40))

Traffic = Callable[[int], tuple[Pose2D, list[VehicleBox]]]


@dataclass(frozen=True)
class Scene:
    name: str
    road: RoadGeometry
    state: Traffic  # frame index -> (ego pose, other vehicles)


def _lane(centre: np.ndarray, left: str, right: str) -> LaneStrip:
    return LaneStrip(centre, np.full(len(centre), LANE_W), left, right)


def highway_road(length_m: float = 1000.0, lanes: int = 3) -> RoadGeometry:
    """Straight lanes along +x (east), lane 0 leftmost (north), sampled every 5 m."""
    x = np.arange(0.0, length_m + 1e-9, 5.0)
    strips = []
    for i in range(lanes):
        left = LINE_SOLID if i == 0 else LINE_NONE
        right = LINE_SOLID if i == lanes - 1 else LINE_DASHED
        strips.append(_lane(np.stack([x, np.full_like(x, -i * LANE_W)], axis=1), left, right))
    return RoadGeometry(tuple(strips))


def highway_scene(length_m: float = 1000.0, vehicles: int = 10) -> Scene:
    """Ego in the middle lane at 25 m/s; the others keep their lanes at their own speeds, wrapped to stay within
    40 m behind and 120 m ahead of the ego."""
    rng = np.random.default_rng(0)
    lane = rng.integers(0, 3, vehicles)
    start = rng.uniform(-40.0, 120.0, vehicles)
    speed = rng.uniform(18.0, 32.0, vehicles)

    def state(frame: int) -> tuple[Pose2D, list[VehicleBox]]:
        t = frame * DT_S
        ego_x = 50.0 + (25.0 * t) % (length_m - 200.0)
        ahead = (start + (speed - 25.0) * t + 40.0) % 160.0 - 40.0
        cars = [VehicleBox(i, Pose2D(ego_x + float(ahead[i]), -float(lane[i]) * LANE_W, 0.0),
                           length=5.0 if i % 4 else 12.0, width=2.0 if i % 4 else 2.5, height=1.5 if i % 4 else 3.2,
                           speed=float(speed[i]), rgb=PALETTE[i % len(PALETTE)])
                for i in range(vehicles) if lane[i] != 1 or abs(ahead[i]) > 4.0]  # none inside the ego
        return Pose2D(ego_x, -LANE_W, 0.0), cars

    return Scene("highway", highway_road(length_m), state)


def _arc(radius: float, a0: float, a1: float, step_m: float = 1.0) -> np.ndarray:
    n = max(2, math.ceil(abs(a1 - a0) * radius / step_m) + 1)
    a = np.linspace(a0, a1, n)
    return radius * np.stack([np.cos(a), np.sin(a)], axis=1)


def _bezier(p0: np.ndarray, d0: np.ndarray, p3: np.ndarray, d3: np.ndarray, n: int = 40) -> np.ndarray:
    k = np.linalg.norm(p3 - p0) / 2.5
    t = np.linspace(0.0, 1.0, n)[:, None]
    p1, p2 = p0 + k * d0, p3 - k * d3
    return (1 - t) ** 3 * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t**2 * p2 + t**3 * p3


def roundabout_road(radius: float = 20.0, approach_m: float = 100.0) -> RoadGeometry:
    """Counter-clockwise 2-lane ring (centres at radius and radius + 4 m) and, at east/north/west/south, an entry
    (right-hand traffic) and an exit lane joining the outer lane tangentially 25 degrees either side."""
    join, gap = math.radians(25.0), math.radians(30.0)
    strips = [_lane(_arc(radius, 0.0, 2 * math.pi), LINE_SOLID, LINE_DASHED)]
    for q in range(4):  # outer lane: no edge line where the entries and exits join
        th = q * math.pi / 2
        strips.append(_lane(_arc(radius + LANE_W, th - gap, th + gap), LINE_NONE, LINE_NONE))
        strips.append(_lane(_arc(radius + LANE_W, th + gap, th + math.pi / 2 - gap), LINE_NONE, LINE_SOLID))
    r_out, r_road = radius + LANE_W, radius + 2 * LANE_W + 10.0
    for q in range(4):
        th = q * math.pi / 2
        u, n = np.array([math.cos(th), math.sin(th)]), np.array([-math.sin(th), math.cos(th)])
        far, near = (r_road + approach_m) * u, r_road * u
        straight = np.linspace(far, near, math.ceil(approach_m / 5.0) + 1)
        a_in, a_out = th + join, th - join
        ring_in = r_out * np.array([math.cos(a_in), math.sin(a_in)])
        ring_out = r_out * np.array([math.cos(a_out), math.sin(a_out)])
        tangent_in = np.array([-math.sin(a_in), math.cos(a_in)])
        tangent_out = np.array([-math.sin(a_out), math.cos(a_out)])
        strips.append(_lane(straight + LANE_W / 2 * n, LINE_SOLID, LINE_SOLID))
        strips.append(_lane(_bezier(near + LANE_W / 2 * n, -u, ring_in, tangent_in), LINE_NONE, LINE_SOLID))
        strips.append(_lane(_bezier(ring_out, tangent_out, near - LANE_W / 2 * n, u), LINE_NONE, LINE_SOLID))
        strips.append(_lane(straight[::-1] - LANE_W / 2 * n, LINE_NONE, LINE_SOLID))
    return RoadGeometry(tuple(strips))


def roundabout_scene(radius: float = 20.0) -> Scene:
    """Ego circling on the outer lane at 8 m/s; five vehicles on the ring, three waiting at or leaving the entries."""
    ring = [(radius, 0.6, 7.0), (radius + LANE_W, 1.3, 8.5), (radius, 2.6, 6.0), (radius + LANE_W, 3.8, 7.5),
            (radius, 5.0, 8.0)]  # (lane radius, start angle, speed)
    r_road = radius + 2 * LANE_W + 10.0

    def state(frame: int) -> tuple[Pose2D, list[VehicleBox]]:
        t = frame * DT_S
        ego_a = 8.0 * t / (radius + LANE_W)
        ego = _on_ring(radius + LANE_W, ego_a)
        cars = []
        for i, (r, a0, v) in enumerate(ring):
            cars.append(VehicleBox(i, _on_ring(r, a0 + v * t / r), speed=v, rgb=PALETTE[i]))
        for q in range(3):
            th = q * math.pi / 2 + math.pi / 2
            u, n = np.array([math.cos(th), math.sin(th)]), np.array([-math.sin(th), math.cos(th)])
            waiting = (r_road + 3.0 + 8.0 * q) * u + LANE_W / 2 * n
            cars.append(VehicleBox(5 + q, Pose2D(float(waiting[0]), float(waiting[1]), th + math.pi),
                                   rgb=PALETTE[5 + q], static=True))
        return ego, cars

    return Scene("roundabout", roundabout_road(radius), state)


def _on_ring(r: float, a: float) -> Pose2D:
    return Pose2D(r * math.cos(a), r * math.sin(a), a + math.pi / 2)


def demo_scenes() -> list[Scene]:
    return [highway_scene(), roundabout_scene()]


def run(frames: int, config: CameraConfig, warmup: int = 20) -> dict:
    results = []
    for scene in demo_scenes():
        camera = FrontCamera(scene.road, config)
        states = [scene.state(i) for i in range(warmup + frames)]  # the traffic model is not what is measured
        times, labelled = [], 0
        for i, (ego, cars) in enumerate(states):
            t0 = time.perf_counter()
            frame = camera.render(ego, cars)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
                labelled += len(frame.boxes)
        ms = np.array(times) * 1e3
        results.append({"scene": scene.name, "width": config.width, "height": config.height, "frames": frames,
                        "vehicles": len(states[0][1]), "frames_per_s": frames / (ms.sum() / 1e3),
                        "ms_p50": float(np.percentile(ms, 50)), "ms_p90": float(np.percentile(ms, 90)),
                        "boxes_per_frame": labelled / frames})
    return {"benchmark": "render", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "scenes": results}


def table(result: dict) -> str:
    lines = ["render benchmark: world front camera, one thread (no torch), after 20 warm-up frames per scene",
             f"| {'scene':<10} | {'size':>8} | {'vehicles':>8} | {'frames/s':>8} | {'ms p50':>6} | {'ms p90':>6} | "
             f"{'boxes/frame':>11} |",
             f"|{'-' * 12}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 8}|{'-' * 8}|{'-' * 13}|"]
    for r in result["scenes"]:
        size = f"{r['width']}x{r['height']}"
        lines.append(f"| {r['scene']:<10} | {size:>8} | {r['vehicles']:>8} | {r['frames_per_s']:8.0f} | "
                     f"{r['ms_p50']:6.2f} | {r['ms_p90']:6.2f} | {r['boxes_per_frame']:11.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench render", description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=2000, help="timed frames per scene (after 20 warm-up frames)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--height", type=int, default=128)
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    p.add_argument("--save-png", default=None, metavar="PREFIX",
                   help="also save each scene's first timed frame as PREFIX_<scene>.png")
    args = p.parse_args(argv)
    if args.frames < 1:
        p.error("--frames must be >= 1")
    config = CameraConfig(width=args.width, height=args.height)
    result = run(args.frames, config)
    print(table(result))
    if args.save_png:
        for scene in demo_scenes():
            ego, cars = scene.state(20)
            Image.fromarray(FrontCamera(scene.road, config).render(ego, cars).image).save(
                f"{args.save_png}_{scene.name}.png")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
