"""Lane recoveries: single frames with the ego placed off its lane centre and off the lane direction, in traffic,
labelled by the expert (which steers back to the centre), for ``wamdiff-train data recoveries``.

Why: in the episodes the expert keeps its lane centre almost exactly, so a plan that ignores where the ego sits in
its lane loses nothing on them, and the tiny models learn exactly that (``wamdiff-train probe lane``: gain ~0). In a
recovery frame the expert's plan goes back to the centre, so the sideways waypoints depend on the offset and heading
the camera shows. Sample ``k`` of a scenario is one fresh world (seed ``RECOVERY_SEED_BASE + seed_offset + k`` in
its split's range, after every episode seed the exports use); the ego moves ``0 .. ahead_m`` along its start road,
to a random lane of that road, ``±max_offset_m`` sideways and ``±max_heading_rad`` turned; a placement closer than
``clearance_m`` to another road user is drawn again (``attempts`` times, then the world is skipped).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.scenarios import SEEDS_PER_SPLIT, SPLIT_SEED_BASE, ScenarioSet, ScenarioSpec
from wamdiff_ros.world.sim import World
from wamdiff_training.world.demonstrations import DatasetError, Frame

RECOVERY_SEED_BASE = 400_000  # within each split's seed range; the episode exports use the seeds below it
MAX_OFFSET_M = 1.2  # inside the lane (3.5-4 m wide) and short of where the expert changes lanes instead
MAX_HEADING_RAD = 0.08


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    max_offset_m: float = MAX_OFFSET_M
    max_heading_rad: float = MAX_HEADING_RAD
    ahead_m: float = 30.0  # how far along its start road the ego may be moved
    clearance_m: float = 10.0  # from every other road user (no frame starts in a collision)
    attempts: int = 20

    def __post_init__(self) -> None:
        if not (0 < self.max_offset_m <= 2.0 and 0 <= self.max_heading_rad <= 0.3 and self.ahead_m >= 0
                and self.clearance_m >= 0 and self.attempts >= 1):
            raise DatasetError(f"recovery settings out of range: {self} (offset in (0, 2] m, heading in [0, 0.3] "
                               "rad, ahead and clearance >= 0, attempts >= 1)")


@dataclass(frozen=True, slots=True)
class Placement:
    lane: int  # lane id on the ego's start road
    along_m: float  # metres moved along it
    offset_m: float  # left of the lane centre is positive (ego frame)
    heading_rad: float  # left of the lane direction is positive


def displace_ego(world: World, lane_id: int, along_m: float, offset_m: float, heading_rad: float) -> None:
    """Moves the ego ``along_m`` along its start road onto lane ``lane_id``, ``offset_m`` left of that lane's centre,
    heading ``heading_rad`` left of the lane direction, and updates the route bookkeeping (command, progress)."""
    ego = world.ego
    a, b, _ = ego.lane_index
    lane = world.road.network.get_lane((a, b, lane_id))
    s = lane.local_coordinates(ego.position)[0] + along_m
    ego.lane_index, ego.lane = (a, b, lane_id), lane
    # highway-env's lateral coordinate and heading are mirrored (y down): left is negative there
    ego.position = lane.position(s, -offset_m)
    ego.heading = lane.heading_at(s) - heading_rad
    world._k, world.progress_m, _ = world.route.locate(world._k, ego.position)


def place(world: World, rng: np.random.Generator, config: RecoveryConfig) -> Placement | None:
    """Draws a placement clear of traffic and applies it; None (the ego left where it was) when ``config.attempts``
    draws all came too close to another road user."""
    ego = world.ego
    a, b, lane_id = ego.lane_index
    lanes = len(world.road.network.graph[a][b])
    for _ in range(config.attempts):
        lane = lane_id if lanes == 1 else int(rng.integers(0, lanes))
        road_lane = world.road.network.get_lane((a, b, lane))
        s0 = road_lane.local_coordinates(ego.position)[0]
        room = max(0.0, min(config.ahead_m, road_lane.length - 10.0 - s0))  # stay on the start road
        along = float(rng.uniform(0.0, room)) if room > 0 else 0.0
        p = Placement(lane, along, float(rng.uniform(-config.max_offset_m, config.max_offset_m)),
                      float(rng.uniform(-config.max_heading_rad, config.max_heading_rad)))
        target = road_lane.position(s0 + along, -p.offset_m)
        if all(np.linalg.norm(np.asarray(v.position) - target) >= config.clearance_m
               for v in world.road.vehicles if v is not ego):
            displace_ego(world, p.lane, p.along_m, p.offset_m, p.heading_rad)
            return p
    return None


def recovery_seed(split: str, seed_offset: int, k: int) -> int:
    if split not in SPLIT_SEED_BASE:
        raise DatasetError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_SEED_BASE)}")
    seed = RECOVERY_SEED_BASE + seed_offset + k
    if seed_offset < 0 or k < 0 or seed >= SEEDS_PER_SPLIT:
        raise DatasetError(f"recovery seed offset {seed_offset} + sample {k} leaves the {split} split's seed range "
                           f"({SEEDS_PER_SPLIT - RECOVERY_SEED_BASE} recovery worlds per split)")
    return SPLIT_SEED_BASE[split] + seed


def recovery_frame(spec: ScenarioSpec, seed: int, scenarios: ScenarioSet, config: RecoveryConfig,
                   camera: CameraConfig | None = None, route_points: bool = False) -> tuple[Frame, Placement] | None:
    """World ``seed`` of ``spec`` with the ego placed off-centre: the camera frame and the expert's plan from there
    (a ``Frame`` at index 0, t 0, without questions); None when no placement kept clear of traffic.
    ``route_points``: the frame keeps its route's points from the placed ego (``World.route_points``)."""
    world = World(spec, seed, scenarios)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])  # scenarios draw apart at one seed
    placement = place(world, rng, config)
    if placement is None:
        return None
    shot = FrontCamera(world.geometry, camera or CameraConfig()).render(world.ego_pose, world.others())
    plan = Expert(world).plan()
    frame = Frame(spec.name, seed, 0, 0.0, shot.image, world.ego_velocity(), world.ego_acceleration(), world.command,
                  world.ego_speed, np.asarray(plan.waypoints), shot.boxes, [], None, plan.reason, 0,
                  route_points={world.command: world.route_points()} if route_points else {})
    return frame, placement
