"""One closed-loop episode: world -> sensors -> planner -> ``WaypointFollower`` -> highway-env actuator -> world.

Two timing modes:
- ``paused``: the world waits for the planner; a plan takes effect at the time of its image.
- ``realtime``: the world does not wait: a plan takes effect ``latency x hardware_factor`` seconds after its image
  (the previous plan is followed meanwhile, one request in flight at a time, as in the node), and the follower
  re-expresses it in the current ego frame. A faster decoder therefore drives on fresher plans.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.control import FollowerGains, HighwayEnvActuator, TrackedPlan, WaypointFollower
from wamdiff_ros.control.stop import fallback_stop
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.input_guard import EgoStateFilter, RepeatedFrameGate
from wamdiff_ros.plan_check import steps_back
from wamdiff_ros.world.camera import CameraConfig, CameraFrame, FrontCamera
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.metrics import EpisodeLog
from wamdiff_ros.world.perturb import Perturbation, Perturber, label
from wamdiff_ros.world.scenarios import ScenarioSet, ScenarioSpec
from wamdiff_ros.world.sim import World

MODES = ("paused", "realtime")
# The node's answers to imperfect inputs (``input_guard``; the node's parameters of the same names):
# a repeated camera frame is not planned as new; the ego pose and speed go through ``EgoStateFilter``; the follower
# compensates the actuation delay it is told (here: the latency perturbation's).
ANSWERS = ("repeated_frame", "ego_filter", "actuation_delay")


@dataclass(frozen=True, slots=True)
class LoopConfig:
    mode: str = "paused"
    plan_hz: float = 5.0  # how often a new plan is requested (the node's timer; at most one in flight)
    hardware_factor: float = 1.0  # realtime mode: measured latency x this = sim delay
    camera: CameraConfig = field(default_factory=CameraConfig)
    keep_frames: bool = False  # keep (image, plan) pairs for a video
    plan_blend_tau_s: float | None = None  # the follower's plan blending (s; 0 = off); None: the gains file's
    perturb: tuple[Perturbation, ...] = ()  # deployment perturbations (``world/perturb.py``), seeded by the episode
    answers: tuple[str, ...] = ()  # the node's answers to them (``ANSWERS``), as the node's parameters switch them

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        if not self.plan_hz > 0 or not self.hardware_factor > 0:
            raise ValueError("plan_hz and hardware_factor must be > 0")
        if self.plan_blend_tau_s is not None and not 0 <= self.plan_blend_tau_s < math.inf:
            raise ValueError(f"plan_blend_tau_s: expected a finite number >= 0, got {self.plan_blend_tau_s}")
        if isinstance(self.perturb, str) or not all(isinstance(p, Perturbation) for p in self.perturb):
            raise ValueError("perturb: expected Perturbation items (perturb.parse_perturbations)")
        if isinstance(self.answers, str) or set(self.answers) - set(ANSWERS):
            raise ValueError(f"answers: expected some of {ANSWERS}, got {self.answers!r}")


@dataclass(slots=True)
class Observation:
    """What a planner may use. ``world`` is the privileged simulator state: only the expert reads it. ``pose``: the
    ego pose as the agent reads it (perturbed with ``gnss``), the world frame the planner's own memory is kept in."""

    frame: CameraFrame | None
    ego_velocity: tuple[float, float]
    ego_acceleration: tuple[float, float]
    command: fmt.Command
    world: World
    pose: Pose2D | None = None  # None: the world's


@dataclass(slots=True)
class PlanResult:
    waypoints: np.ndarray  # (8, 2) ego frame
    valid: bool = True
    forward_calls: int = 0
    new_tokens: int = 0
    boxes: list = field(default_factory=list)
    deadline: str = ""  # cut at the planning deadline: "anytime" (its best so far driven) | "stop" (the fallback)
    edited: bool = False  # the model's plan: reflection repaired waypoints (``Plan.edited``)
    implausible: bool = False  # ... it still fails the plan checker (``Plan.implausible``)


class ClosedLoopPlanner(Protocol):
    """What drives in the world (``run_episode``, the data export's DAgger rollouts, the probes): ``plan`` gets the
    observation and the route points of its command's route (``World.route_points``); a planner that takes no route
    ignores them."""

    name: str
    needs_camera: bool

    def reset(self, world: World) -> None: ...

    def plan(self, obs: Observation, route: np.ndarray | None = None) -> PlanResult: ...


class ExpertPlanner:
    name, needs_camera = "expert", False

    def reset(self, world: World) -> None:
        self._expert = Expert(world)

    def plan(self, obs: Observation, route: np.ndarray | None = None) -> PlanResult:
        return PlanResult(self._expert.plan().waypoints)


class ConstantVelocityPlanner:
    """Keeps the current velocity vector (ego frame) for 4 s: the baseline that ignores everything."""

    name, needs_camera = "constant_velocity", False

    def reset(self, world: World) -> None:
        pass

    def plan(self, obs: Observation, route: np.ndarray | None = None) -> PlanResult:
        t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
        return PlanResult((t * np.asarray(obs.ego_velocity)[None]).astype(np.float32))


ON_DEADLINE = ("anytime", "stop")


class ModelPlanner:
    """The package's ``Planner`` on the rendered front camera, ego velocity / acceleration, the route command and the
    route points (``Planner`` decides from its checkpoint whether the prompt carries them).

    With ``deadline_s`` each plan has that long (wall clock, from the request) as the node's ``deadline_ms``: decoding
    stops refining ``margin_s`` before it (time for the anytime fill forward). A plan cut there is answered as the
    node answers it: ``on_deadline`` "anytime" keeps the best-so-far plan when it is valid, "stop" (and an invalid
    anytime plan) gives the fallback stop along the last valid plan."""

    needs_camera = True

    def __init__(self, planner, name: str = "model", deadline_s: float | None = None, on_deadline: str = "anytime",
                 margin_s: float = 0.0, fallback_decel: float = 2.0) -> None:
        from wamdiff_ros.planner import EgoState  # torch only where a model runs

        if on_deadline not in ON_DEADLINE:
            raise ValueError(f"on_deadline: expected one of {ON_DEADLINE}, got {on_deadline!r}")
        if deadline_s is not None and not deadline_s > margin_s >= 0:
            raise ValueError(f"deadline_s {deadline_s} must exceed margin_s {margin_s} >= 0")
        self.planner, self._ego_state, self.name = planner, EgoState, name
        self.deadline_s, self.on_deadline, self.margin_s, self.fallback_decel = (deadline_s, on_deadline, margin_s,
                                                                                 fallback_decel)
        self._last_world: np.ndarray | None = None  # the last valid plan, world frame

    def reset(self, world: World) -> None:
        self._last_world = None

    def plan(self, obs: Observation, route: np.ndarray | None = None) -> PlanResult:
        ego = self._ego_state(obs.ego_velocity, obs.ego_acceleration)
        deadline = None if self.deadline_s is None else time.perf_counter() + self.deadline_s - self.margin_s
        p = self.planner.plan(obs.frame.image, ego, obs.command, route=route, deadline=deadline)
        pose = obs.pose or obs.world.ego_pose
        if p.anytime:
            if self.on_deadline == "stop" or not p.valid:  # the node's flagged fallback: a stop along the last plan
                stop = fallback_stop(math.hypot(*obs.ego_velocity), self._last_world, (pose.x, pose.y, pose.heading),
                                     self.fallback_decel)
                return PlanResult(stop, True, p.stats.forward_calls, p.stats.new_tokens, deadline="stop")
        if p.valid:
            self._last_world = pose.to_world(np.asarray(p.waypoints, np.float64))
        return PlanResult(p.waypoints, bool(p.valid), p.stats.forward_calls, p.stats.new_tokens, p.boxes,
                          "anytime" if p.anytime else "", bool(p.edited), bool(p.implausible))


@dataclass(slots=True)
class PlanQuality:
    """What an episode's plans were like (``EpisodeLog.plan_quality``): how many, valid, stepping back in x by more than
    0.5 m between consecutive waypoints (``plan_check.steps_back``), repaired by reflection, still implausible, and
    each plan's forward calls."""

    plans: int = 0
    valid: int = 0
    stepped_back: int = 0
    edited: int = 0
    implausible: int = 0
    forward_calls: list[int] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)  # each plan's wall time

    def add(self, result: PlanResult, seconds: float) -> None:
        self.plans += 1
        self.valid += bool(result.valid)
        self.stepped_back += bool(result.valid) and steps_back(result.waypoints)
        self.edited += bool(result.edited)
        self.implausible += bool(result.implausible)
        self.forward_calls.append(int(result.forward_calls))
        self.ms.append(round(seconds * 1e3, 3))

    def as_dict(self) -> dict:
        return {"plans": self.plans, "valid": self.valid, "stepped_back": self.stepped_back, "edited": self.edited,
                "implausible": self.implausible, "forward_calls": list(self.forward_calls), "ms": list(self.ms)}


@dataclass(slots=True)
class EpisodeResult:
    log: EpisodeLog
    sim_steps: int
    wall_s: float
    frames: list = field(default_factory=list)  # (image, waypoints, boxes, text) when keep_frames


def run_episode(spec: ScenarioSpec, seed: int, planner: ClosedLoopPlanner, config: LoopConfig = LoopConfig(),
                scenarios: ScenarioSet | None = None, gains: FollowerGains | None = None) -> EpisodeResult:
    start = time.perf_counter()
    world = World(spec, seed, scenarios)
    gains = gains or FollowerGains.for_world("highway_env")
    if config.plan_blend_tau_s is not None:
        gains = dataclasses.replace(gains, plan_blend_tau_s=config.plan_blend_tau_s)
    perturber = Perturber(config.perturb, seed, 1.0 / world.dt)
    if "actuation_delay" in config.answers:
        gains = dataclasses.replace(gains, actuation_delay_s=perturber.delay_ticks * world.dt)
    follower, actuator = WaypointFollower(gains), HighwayEnvActuator(gains)
    camera = FrontCamera(world.geometry, config.camera) if planner.needs_camera or config.keep_frames else None
    gate = RepeatedFrameGate() if "repeated_frame" in config.answers and planner.needs_camera else None
    ego_filter = EgoStateFilter() if "ego_filter" in config.answers else None
    repeats_skipped = 0

    def render() -> CameraFrame | None:
        return camera.render(world.ego_pose, world.others()) if camera is not None else None

    planner.reset(world)
    period = 1.0 / config.plan_hz
    next_request, active, pending = 0.0, None, None  # pending: (effective time, plan)
    latencies, calls, tokens, frames, steps = [], 0, 0, [], 0
    cut = {"anytime": 0, "stop": 0}
    quality = PlanQuality()
    while not world.done:
        # What the agent reads this tick (the world's own state unless a perturbation is on).
        pose = perturber.pose(world.ego_pose)
        speed_factor = perturber.speed_factor()
        speed = world.ego_speed * speed_factor
        if ego_filter is not None:
            estimate = ego_filter.update(world.t, pose.x, pose.y, pose.heading, speed)
            pose = Pose2D(estimate.x, estimate.y, estimate.heading)
            speed_factor = estimate.speed / world.ego_speed if world.ego_speed > 1e-3 else 1.0
            speed = estimate.speed
        if pending is not None and world.t >= pending[0] - 1e-9:
            active, pending = pending[1], None
        due = pending is None and world.t >= next_request - 1e-9
        frame = perturber.camera(render) if due else None
        if due and gate is not None and frame is not None and gate.repeated(frame.image, speed):
            # a frozen camera: not planned as new; the last plan is followed (until max_plan_age_s)
            repeats_skipped, next_request, due = repeats_skipped + 1, world.t + period, False
        if due:
            velocity = tuple(float(v) * speed_factor for v in world.ego_velocity())
            obs = Observation(frame, velocity, world.ego_acceleration(), world.command, world, pose)
            # the route source's part, not the planner's: outside the latency
            route = pose.to_ego(world.route_centre(fmt.ROUTE_AHEAD_M)) if perturber.perturbs_pose or ego_filter \
                else world.route_points()
            t0 = time.perf_counter()
            result = planner.plan(obs, route=route)
            latency = time.perf_counter() - t0
            latencies.append(latency)
            calls, tokens = calls + result.forward_calls, tokens + result.new_tokens
            quality.add(result, latency)
            if result.deadline:
                cut[result.deadline] += 1
            tracked = TrackedPlan(result.waypoints, pose, world.t, valid=result.valid)
            if config.mode == "paused":
                active = tracked
            else:
                pending = (world.t + latency * config.hardware_factor, tracked)
            next_request = world.t + period
            if config.keep_frames and frame is not None:
                frames.append((frame.image, np.asarray(result.waypoints), result.boxes,
                               f"{spec.name} t={world.t:4.1f}s {world.command.value} v={world.ego_speed:4.1f}m/s"))
        control = follower.step(active, pose, speed, world.t)
        perturber.before_tick(render)
        world.step(*perturber.actuate(actuator(control)))
        perturber.after_tick()
        steps += 1
    log = world.episode_log(planner.name, config.mode, latencies, calls / tokens if tokens else None)
    log.plans_cut, log.anytime_plans = cut["anytime"] + cut["stop"], cut["anytime"]
    log.plan_quality = quality.as_dict()
    if perturber.active or config.answers:
        log.perturbation = {"label": label(config.perturb), **perturber.stats, "answers": list(config.answers)}
        if gate is not None:
            log.perturbation["repeats_skipped"] = repeats_skipped
        if ego_filter is not None:
            log.perturbation.update(pose_jumps=ego_filter.jumps, speed_scaled=ego_filter.scaled)
    return EpisodeResult(log, steps, time.perf_counter() - start, frames)
