"""Expert demonstrations in the CPU driving world, with DAgger-lite noise: the rollouts behind ``wamdiff-train data``.

Each episode drives the privileged expert through the waypoint follower (replanned at ``REPLAN_HZ`` and at every
sample, so each label is the plan being followed) and samples the front camera every ``sample_period_s``. A fraction
of episodes is perturbed: at random times, for 0.5-1.5 s, the EXECUTED control gets a steering and/or acceleration
offset while the label stays the expert's plan at the perturbed state, so the data shows recoveries (as in the data
of TCP / LAV-style imitation). Deterministic per (scenario, seed): seeded numpy generators only.

DAgger (Ross et al., 2011): given a ``driver`` (a trained planner), each sample interval is driven by the driver's plan
with probability ``1 - expert_share`` and by the expert's otherwise, while every label stays the expert's plan at the
state reached. The data then covers the states the trained model drives into (the drift and late turns that behaviour
cloning never sees), labelled with how the expert gets out of them. Deterministic given a deterministic driver.

The driver is a ``ClosedLoopPlanner``, as in ``run_episode``, but ``rollout`` keeps its own loop: it schedules by sim
step (expert replans, samples, the hand-over between expert and driver) and perturbs the executed control, which
``run_episode``'s time-scheduled plan requests would shift, so the recorded data would change.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.control import FollowerGains, HighwayEnvActuator, TrackedPlan, WaypointFollower
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.world.camera import CameraConfig, FrontCamera, LabelledBox
from wamdiff_ros.world.closed_loop import ClosedLoopPlanner, Observation
from wamdiff_ros.world.expert import Expert, ExpertPlan
from wamdiff_ros.world.route import Route
from wamdiff_ros.world.scenarios import ScenarioSet, ScenarioSpec
from wamdiff_ros.world.sim import World
from wamdiff_training.world import questions

REPLAN_HZ = 5.0


class DatasetError(ValueError):
    """A bad generation setting; the message names it."""


@dataclass(frozen=True, slots=True)
class NoiseConfig:
    """DAgger-lite perturbations of the executed control (ranges are uniform; signs are random)."""

    fraction: float = 0.5  # of episodes
    steer_rad: tuple[float, float] = (0.05, 0.15)
    accel_mps2: tuple[float, float] = (1.0, 3.0)
    duration_s: tuple[float, float] = (0.5, 1.5)
    first_s: tuple[float, float] = (1.0, 3.0)  # start of the first perturbation
    gap_s: tuple[float, float] = (2.0, 5.0)  # from the end of one to the start of the next
    kinds: tuple[float, float, float] = (0.45, 0.25, 0.30)  # P(steer only), P(accel only), P(both)


@dataclass(frozen=True, slots=True)
class Perturbation:
    start: float
    end: float
    steer_rad: float
    accel_mps2: float

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    sample_period_s: float = 0.5
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    questions_per_frame: int = 2
    max_seconds: float | None = None  # cut episodes (quick sets, tests)
    max_samples: int | None = None
    camera: CameraConfig = field(default_factory=CameraConfig)
    expert_share: float = 0.5  # with a driver: probability that a sample interval is driven by the expert
    # junction scenarios: also label each approach frame with the expert's plan under every other command (the same
    # image; only the command and the plan differ), so a model cannot fit the turns without reading the command
    counterfactual_commands: bool = False
    # the plan prompts' optional route points (``World.route_points``; not in the paper's prompt): each frame keeps
    # those of its own route and of each counterfactual command's route
    route_points: bool = False

    def __post_init__(self) -> None:
        checks = {"sample_period_s": self.sample_period_s > 0, "noise.fraction": 0 <= self.noise.fraction <= 1,
                  "expert_share": 0 <= self.expert_share <= 1,
                  "questions_per_frame": self.questions_per_frame >= 0,
                  "max_seconds": self.max_seconds is None or self.max_seconds > 0,
                  "max_samples": self.max_samples is None or self.max_samples >= 1}
        for name, ok in checks.items():
            if not ok:
                raise DatasetError(f"{name}: out of range")


@dataclass(slots=True)
class Frame:
    """One sampled instant: what the planner would get, the expert's label, and the privileged answers."""

    scenario: str
    seed: int
    index: int
    t: float
    image: np.ndarray  # (H, W, 3) uint8
    velocity: tuple[float, float]  # ego frame, as given to EgoState
    acceleration: tuple[float, float]
    command: fmt.Command
    speed: float
    waypoints: np.ndarray  # (8, 2) expert plan, ego frame
    boxes: list[LabelledBox]
    questions: list[tuple[str, str, str]]  # (key, question, answer)
    perturbation: Perturbation | None  # active at this instant
    expert_reason: str
    infractions: int  # so far in the episode
    executed: np.ndarray | None = None  # (8, 2) where the ego really was at the waypoint times (NaN past the end)
    driver: str = "expert"  # who drives from this frame to the next: "expert" or "model" (DAgger)
    # (command, the expert's waypoints under it, its reason) for the other commands (RolloutConfig)
    counterfactuals: list[tuple[fmt.Command, np.ndarray, str]] = field(default_factory=list)
    # command -> the route points (2, 2) of its route (``World.route_points``) for the frame's own command and each
    # counterfactual one (RolloutConfig.route_points); empty: the paper's prompt, without the route line
    route_points: dict[fmt.Command, np.ndarray] = field(default_factory=dict)


class RouteView:
    """``world`` seen along another of its routes (``World.alternative_routes``): the expert reads the route from
    here and everything else (the ego, the traffic, the ego's segment, shared with the approach) from the world."""

    def __init__(self, world: World, route: Route) -> None:
        self._world, self.route = world, route

    def __getattr__(self, name: str):
        return getattr(self._world, name)


def counterfactual_plans(world: World) -> dict[fmt.Command, ExpertPlan]:
    """What the expert would plan at this instant under each of the other commands of a junction scenario, while the
    ego is on the shared approach (``World.alternative_routes``; empty elsewhere). A fresh expert per call: the
    expert keeps state only on the highway (its target lane)."""
    return {command: Expert(RouteView(world, route)).plan() for command, route in world.alternative_routes().items()}


def frame_route_points(world: World, counterfactual: bool) -> dict[fmt.Command, np.ndarray]:
    """The route points of the world's own command and, with ``counterfactual``, of each command of
    ``World.alternative_routes`` (the commands ``counterfactual_plans`` labels)."""
    out = {world.command: world.route_points()}
    if counterfactual:
        out.update((command, world.route_points(route)) for command, route in world.alternative_routes().items())
    return out


@dataclass(slots=True)
class Episode:
    scenario: str
    seed: int
    perturbed: bool
    perturbations: list[Perturbation]
    frames: list[Frame]
    end_reason: str
    sim_s: float


def _stream(spec: ScenarioSpec, seed: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(spec.name.encode()), purpose])


def perturbation_schedule(spec: ScenarioSpec, seed: int, noise: NoiseConfig) -> tuple[bool, list[Perturbation]]:
    """Whether the episode is perturbed, and its perturbations over the whole scenario duration (independent of any
    cut, so a cut episode is a prefix of the full one)."""
    rng = _stream(spec, seed, 1)
    if not rng.uniform() < noise.fraction:
        return False, []
    out, t = [], float(rng.uniform(*noise.first_s))
    while t < spec.duration_s:
        end = t + float(rng.uniform(*noise.duration_s))
        kind = int(rng.choice(3, p=noise.kinds))
        steer = float(rng.choice((-1.0, 1.0)) * rng.uniform(*noise.steer_rad)) if kind in (0, 2) else 0.0
        accel = float(rng.choice((-1.0, 1.0)) * rng.uniform(*noise.accel_mps2)) if kind in (1, 2) else 0.0
        out.append(Perturbation(round(t, 3), round(end, 3), steer, accel))
        t = end + float(rng.uniform(*noise.gap_s))
    return True, out


def sample_steps(period_s: float, dt: float, what: str) -> int:
    n = round(period_s / dt)
    if n < 1 or abs(n * dt - period_s) > 1e-6:
        raise DatasetError(f"{what} {period_s} s must be a positive multiple of the sim step {dt} s")
    return n


def recording_gains() -> FollowerGains:
    """The follower gains the recorded drives use: the world's, without plan blending. The exports were made before
    blending existed, and the expert's plans are followed as it made them."""
    return dataclasses.replace(FollowerGains.for_world("highway_env"), plan_blend_tau_s=0.0)


def rollout(spec: ScenarioSpec, seed: int, config: RolloutConfig = RolloutConfig(),
            scenarios: ScenarioSet | None = None, driver: ClosedLoopPlanner | None = None) -> Episode:
    """Drive one episode with the expert (plus the episode's perturbations), or with the expert and ``driver`` taking
    turns (DAgger; it gets the camera frame and the world's route points, and an invalid plan counts as none), and
    sample it."""
    world = World(spec, seed, scenarios)
    expert, camera = Expert(world), FrontCamera(world.geometry, config.camera)
    gains = recording_gains()
    follower, actuator = WaypointFollower(gains), HighwayEnvActuator(gains)
    perturbed, schedule = perturbation_schedule(spec, seed, config.noise)
    ask_rng, turn_rng = _stream(spec, seed, 2), _stream(spec, seed, 3)
    driving = "expert"
    sample_every = sample_steps(config.sample_period_s, world.dt, "the sample period")
    replan_every = max(1, round(1.0 / (REPLAN_HZ * world.dt)))
    frames, frame_steps, active, step = [], [], None, 0
    if driver is not None:
        driver.reset(world)
    while not world.done:
        if config.max_seconds is not None and world.t >= config.max_seconds - 1e-9:
            break
        sample = step % sample_every == 0
        if sample and config.max_samples is not None and len(frames) >= config.max_samples:
            break
        noise = next((p for p in schedule if p.active(world.t)), None)
        if sample and driver is not None:
            driving = "expert" if turn_rng.uniform() < config.expert_share else "model"
        if sample or step % replan_every == 0:  # the expert replans at its own rate whoever drives (it keeps state)
            plan = expert.plan()
            if driving == "expert":
                active = TrackedPlan(plan.waypoints, world.ego_pose, world.t)
        if sample:
            shot = camera.render(world.ego_pose, world.others())
            velocity, acceleration = world.ego_velocity(), world.ego_acceleration()
            if driving == "model":
                result = driver.plan(Observation(shot, velocity, acceleration, world.command, world),
                                     route=world.route_points())
                own = result.waypoints if result.valid else None
                # a driver without a plan keeps following its previous one, as the node does
                if own is not None or active is None:
                    active = TrackedPlan(np.asarray(plan.waypoints if own is None else own), world.ego_pose, world.t)
            frames.append(Frame(
                spec.name, seed, len(frames), round(world.t, 3), shot.image, velocity, acceleration, world.command,
                world.ego_speed, np.asarray(plan.waypoints), shot.boxes,
                questions.ask(world, ask_rng, config.questions_per_frame), noise, plan.reason, len(world.events),
                driver=driving, counterfactuals=[] if not config.counterfactual_commands else [
                    (command, np.asarray(other.waypoints), other.reason)
                    for command, other in counterfactual_plans(world).items()],
                route_points={} if not config.route_points else frame_route_points(
                    world, config.counterfactual_commands)))
            frame_steps.append(step)
        acceleration, steer = actuator(follower.step(active, world.ego_pose, world.ego_speed, world.t))
        if noise is not None:
            steer += noise.steer_rad
            acceleration = max(acceleration + noise.accel_mps2, -world.ego_speed / world.dt)  # never reverse
        world.step(acceleration, steer)
        step += 1
    _attach_executed(world, frames, frame_steps)
    return Episode(spec.name, seed, perturbed, schedule, frames, world.end_reason or "cut", round(world.t, 3))


def _attach_executed(world: World, frames: list[Frame], frame_steps: list[int]) -> None:
    """The ego's real positions at each frame's waypoint times, in that frame's ego frame (from the world trace)."""
    tr = world.trace
    xy = np.stack([tr["x"], tr["y"]], axis=1)
    per_wp = round(fmt.WAYPOINT_DT_S / world.dt)
    for frame, n in zip(frames, frame_steps):
        idx = n + per_wp * np.arange(1, fmt.NUM_WAYPOINTS + 1)
        pose = Pose2D(tr["x"][n], tr["y"][n], tr["heading"][n])
        out = np.full((fmt.NUM_WAYPOINTS, 2), np.nan)
        ok = idx < len(xy)
        out[ok] = pose.to_ego(xy[idx[ok]])
        frame.executed = out
