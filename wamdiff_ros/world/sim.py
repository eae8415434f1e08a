"""The closed-loop world on highway-env: builds a frozen scenario's road, traffic and route, steps it at ``sim_hz``
with the ego driven by (acceleration, steering angle), and keeps Leaderboard-style bookkeeping (route progress,
collisions, route deviation, blocked, timeout).

This is the only module that sees highway-env coordinates: its frame is a screen frame (y down); everything leaving
here is mirrored into the right-handed world frame of ``wamdiff_ros.world.types`` (y -> -y, heading -> -heading,
steering -> -steering). highway-env is used as a library: its road networks, kinematics and IDM/MOBIL traffic; the
ego and the traffic are placed here from the scenario file with a seeded generator.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from highway_env import utils as hw_utils
from highway_env.envs.intersection_env import IntersectionEnv
from highway_env.envs.merge_env import MergeEnv
from highway_env.envs.roundabout_env import RoundaboutEnv
from highway_env.road.lane import LineType, StraightLane
from highway_env.road.regulation import RegulatedRoad
from highway_env.road.road import Road, RoadNetwork
from highway_env.vehicle.behavior import IDMVehicle
from highway_env.vehicle.kinematics import Vehicle
from highway_env.vehicle.objects import Obstacle

from wamdiff_ros import format as fmt
from wamdiff_ros.world.metrics import EpisodeLog, Infraction, InfractionEvent
from wamdiff_ros.world.route import Route
from wamdiff_ros.world.scenarios import ScenarioSet, ScenarioSpec, load_scenarios
from wamdiff_ros.geometry import Pose2D, rotate_to_ego
from wamdiff_ros.world.types import LINE_DASHED, LINE_NONE, LINE_SOLID, LaneStrip, RoadGeometry, VehicleBox

LaneIndex = tuple[str, str, int]
STUCK_TRAFFIC_S = 5.0
COLLISION_REPEAT_S = 5.0  # the same actor is not counted twice within this (Leaderboard's CollisionTest)
MAX_STEER_RAD = math.pi / 4
_PALETTE = ((200, 40, 40), (40, 90, 200), (230, 200, 40), (230, 230, 230), (40, 160, 70), (120, 120, 130),
            (160, 60, 170), (240, 130, 30))


PULL_AWAY_SPEED = 0.5  # m/s: a standing car ahead is pulling away (the ego's start from rest may begin)
STOP_ZONE_M = 10.0  # a stop counts with the ego's centre this far before the junction entry, or closer
STOP_SPEED = 0.1  # m/s: a full stop (Leaderboard's RunningStopTest SPEED_THRESHOLD)


class ScriptedVehicle(IDMVehicle):
    """An IDM car on a timetable: ``phases`` [(from_s, target_speed, decel)] in sim time; a phase with target 0
    brakes at ``decel`` (or harder if IDM asks) to a stop and stands; a phase with a speed drives IDM to it. A queue
    that pulls away and a lead that stops and goes are such cars. Keeps its lane."""

    phases: list[tuple[float, float, float]]
    clock: float = 0.0

    def _phase(self) -> tuple[float, float, float]:
        current = self.phases[0]
        for phase in self.phases:
            if phase[0] <= self.clock + 1e-9:
                current = phase
        return current

    def act(self, action: dict | str | None = None) -> None:
        _, target, decel = self._phase()
        self.target_speed = max(target, 0.01)
        super().act()
        if target <= 0.0 and not self.crashed:
            self.action["acceleration"] = min(self.action["acceleration"], -decel)

    @property
    def standing(self) -> bool:
        """Stopped on purpose (its timetable says stand), not stuck."""
        return self._phase()[1] <= 0.0


def _line_kind(t: int) -> str:
    if t == LineType.STRIPED:
        return LINE_DASHED
    if t in (LineType.CONTINUOUS, LineType.CONTINUOUS_LINE):
        return LINE_SOLID
    return LINE_NONE


def mirror(points: np.ndarray) -> np.ndarray:
    """highway-env <-> world frame (its own inverse)."""
    p = np.array(points, dtype=np.float64)
    p[..., 1] *= -1.0
    return p


def _direction(delta_heading_world: float) -> str:
    d = math.degrees((delta_heading_world + math.pi) % (2 * math.pi) - math.pi)
    return "left" if d > 45 else "right" if d < -45 else "straight"


class World:
    """One episode of one frozen scenario. ``step(acceleration, steer)`` advances 1 / sim_hz seconds."""

    def __init__(self, spec: ScenarioSpec, seed: int, scenarios: ScenarioSet | None = None) -> None:
        self.spec, self.seed = spec, int(seed)
        self.set = scenarios or load_scenarios()
        self.dt = 1.0 / self.set.sim_hz
        self.rng = np.random.default_rng([self.seed, ("highway", "merge", "roundabout", "intersection").index(spec.kind)])
        env_cls = {"merge": MergeEnv, "roundabout": RoundaboutEnv, "intersection": IntersectionEnv}.get(spec.kind)
        if env_cls is not None:  # only the env's road builder is used, not the gym env around it
            env = env_cls.__new__(env_cls)
            env.config, env.np_random = env_cls.default_config(), np.random.RandomState(self.seed)
            env._make_road()
            self.road: Road = env.road
        else:
            self.road = Road(network=RoadNetwork.straight_road_network(spec.lanes, speed_limit=30),
                             np_random=np.random.RandomState(self.seed))
        self.road.np_random = np.random.RandomState(self.seed)
        self.t = 0.0
        self._actors: dict[int, tuple[object, int]] = {}  # id(obj) -> (obj, actor id); holding obj keeps id() unique
        self._next_actor = itertools.count(1)
        self._last_hit: dict[int, float] = {}
        self._traffic_still: dict[int, float] = {}
        self._next_spawn = 0.0
        self._alternatives: dict[fmt.Command, Route] = {}  # junction scenarios: the routes to the other exits
        self.scripted: list[ScriptedVehicle] = []  # queue / stop-and-go cars (their timetable runs on self.t)
        self.start_free_s = 0.0  # see EpisodeLog
        self._pulls_away: ScriptedVehicle | None = None  # the standing car the ego's start waits for
        self.stopped_at_line = False  # stop_line scenarios: the ego has made its full stop before the junction
        self._ran_stop = False
        self._stop_lines: list[np.ndarray] = []  # (2, 2) world frame, for the camera
        getattr(self, f"_build_{spec.kind}")()
        self.ego.check_collisions = True
        self.road.vehicles.insert(0, self.ego)
        self.geometry = self._geometry()
        self._k = 0
        self.progress_m, self.on_route = self.route.start_m, True
        self._still_s = self._wrong_s = 0.0
        self._prev_velocity = self._velocity_world()
        self.acceleration_world = np.zeros(2)
        self.events: list[InfractionEvent] = []
        self.end_reason = ""
        self.trace: dict[str, list[float]] = {k: [] for k in ("t", "x", "y", "heading", "speed", "progress_m")}
        self.trace_on_route: list[bool] = []
        self._record()

    # ------------------------------------------------------------------------------------------------ scenario set-up
    def _idm(self, lane_index: LaneIndex, s: float, speed: float, destination: str | None = None) -> IDMVehicle:
        v = IDMVehicle.make_on_lane(self.road, lane_index, longitudinal=s, speed=speed)
        v.target_speed = speed
        if destination is not None:
            v.plan_route_to(destination)
        v.randomize_behavior()
        return v

    def _scripted(self, lane_index: LaneIndex, s: float, speed: float,
                  phases: list[tuple[float, float, float]]) -> ScriptedVehicle:
        v = ScriptedVehicle.make_on_lane(self.road, lane_index, longitudinal=s, speed=speed)
        v.randomize_behavior()
        v.phases, v.enable_lane_change = phases, False
        self.road.vehicles.append(v)
        self.scripted.append(v)
        return v

    def _place_traffic(self, candidates: list[tuple[LaneIndex, float]], count: int, min_gap: float, speeds,
                       destinations: list[str] | None = None, keep_clear_m: float = 25.0) -> None:
        placed: list[np.ndarray] = []
        for i in self.rng.permutation(len(candidates)):
            if len(placed) >= count:
                break
            lane_index, s = candidates[i]
            p = self.road.network.get_lane(lane_index).position(s, 0.0)
            gap = min((float(np.linalg.norm(p - q)) for q in placed), default=math.inf)
            if np.linalg.norm(p - self.ego.position) < keep_clear_m or gap < min_gap:
                continue
            dest = str(self.rng.choice(destinations)) if destinations else None
            self.road.vehicles.append(self._idm(lane_index, s, float(self.rng.uniform(*speeds)), dest))
            placed.append(p)

    def _build_highway(self) -> None:
        spec, lane_w = self.spec, StraightLane.DEFAULT_WIDTH
        x0 = 200.0
        self.ego = Vehicle(self.road, np.array([x0, spec.ego_lane * lane_w]), 0.0, spec.ego_speed)
        tr = spec.traffic
        ego_lane = ("0", "1", spec.ego_lane)
        taken: list[float] = []  # ego-lane positions of the lead, the queue and the stop-and-go car
        if "lead_gap_m" in tr:  # a slower car ahead in the ego's lane: overtake it
            taken.append(x0 + float(self.rng.uniform(*tr["lead_gap_m"])))
            self.road.vehicles.append(self._idm(ego_lane, taken[-1], float(self.rng.uniform(*tr["lead_speed"]))))
        if "queue" in tr:  # standing cars ahead that pull away one after the other
            q = tr["queue"]
            s, go = x0 + float(self.rng.uniform(*q["first_gap_m"])), float(self.rng.uniform(*q["release_s"]))
            n = int(q["vehicles"])
            starts = go + np.concatenate([np.cumsum(self.rng.uniform(*q["stagger_s"], size=n - 1))[::-1], [0.0]])
            self.start_free_s = float(starts[0])  # the way opens when the car before the ego pulls away: its
            # timetable's release until step() sees it moving (it waits for a gap to its own car ahead)
            for i in range(n):  # the front car goes first, the one before the ego last
                go = float(starts[i])
                car = self._scripted(ego_lane, s, 0.0, [(0.0, 0.0, 3.0), (go, float(self.rng.uniform(*q["speed"])), 0.0)])
                self._pulls_away = self._pulls_away or car
                taken.append(s)
                s += IDMVehicle.LENGTH + float(self.rng.uniform(*q["gap_m"]))
        if "stop_and_go" in tr:  # a lead that brakes to a stop, stands, pulls away, and again
            g = tr["stop_and_go"]
            speed, t, phases = float(self.rng.uniform(*g["speed"])), 0.0, []
            for _ in range(int(g["cycles"])):
                t += float(self.rng.uniform(*g["brake_after_s"]))
                decel = float(self.rng.uniform(*g["decel"]))
                phases += [(t, 0.0, decel)]
                t += speed / decel + float(self.rng.uniform(*g["stand_s"]))
                phases += [(t, speed, 0.0)]
            taken.append(x0 + float(self.rng.uniform(*g["gap_m"])))
            self._scripted(ego_lane, taken[-1], speed, [(0.0, speed, 0.0), *phases])
        if int(tr.get("vehicles", 0)) > 0:
            cands = [(("0", "1", int(l)), float(s)) for l in range(spec.lanes) for s in np.arange(*tr["start_m"], 4.0)]
            cands = [(i, x0 + s) for i, s in cands
                     if i[2] != spec.ego_lane or all(abs(x0 + s - p) > tr["min_gap_m"] for p in taken)]
            self._place_traffic(cands, int(tr["vehicles"]), tr["min_gap_m"], tr["speed"])
        self.route = Route([("0", "1")], self.road.network, start_m=x0, target_m=x0 + spec.target_distance_m)
        self._view = (x0 - 150.0, x0 + spec.target_distance_m + 250.0)

    def _build_merge(self) -> None:
        spec, tr = self.spec, self.spec.traffic
        ramp = self.road.network.get_lane(("j", "k", 0))
        self.ego = Vehicle(self.road, ramp.position(spec.ego_start_m, 0.0), ramp.heading_at(spec.ego_start_m),
                           spec.ego_speed)
        cands = [(("a", "b", int(l)), float(s)) for l in (0, 1) for s in np.arange(*tr["start_m"], 4.0)]
        self._place_traffic(cands, int(tr["vehicles"]), 22.0, tr["speed"], keep_clear_m=0.0)
        self.route = Route([("j", "k"), ("k", "b"), ("b", "c"), ("c", "d")], self.road.network)
        self.route.start_m = self.route.segment_progress(0, self.ego.position)[0]
        self.route.target_m = min(self.route.start_m + spec.target_distance_m, self.route.offsets[-1] + 140.0)
        self._view = (-math.inf, math.inf)

    def _junction_route(self, start: LaneIndex, exits: dict[str, str], junction_node: str,
                        exit_segments: int) -> None:
        """The route from ``start`` through the junction to the exit of a random direction of ``spec.exits``; it
        leaves the junction where its last ``exit_segments`` segments begin. The routes to the other exits are
        kept for ``alternative_routes``."""
        spec, net = self.spec, self.road.network
        direction = str(self.rng.choice(list(spec.exits)))
        lane = net.get_lane(start)
        self.ego = Vehicle(self.road, lane.position(spec.ego_start_m, 0.0), lane.heading_at(spec.ego_start_m),
                           spec.ego_speed)

        def route_to(d: str) -> Route:
            path = net.shortest_path(start[0], exits[d])
            segments = list(zip(path[:-1], path[1:]))
            route = Route(segments, net, command=fmt.Command(d))
            last = len(segments) - 1
            route.target_m = route.offsets[last] + min(spec.exit_distance_m, net.graph[path[-2]][path[-1]][0].length)
            junction = [i for i, (a, _) in enumerate(segments) if a == junction_node][0]
            route.junction_m, route.exit_m = route.offsets[junction], route.offsets[-exit_segments]
            route.command_from_m = route.junction_m - 60.0
            route.command_to_m = route.offsets[last] + 10.0
            return route

        routes = {fmt.Command(d): route_to(d) for d in spec.exits if d in exits}
        start_m = routes[fmt.Command(direction)].segment_progress(0, self.ego.position)[0]
        for route in routes.values():  # the approach is the same road for every exit
            route.start_m = start_m
        self.route = routes.pop(fmt.Command(direction))
        self._alternatives = routes
        self.exit_direction = direction
        self._view = (-math.inf, math.inf)

    def alternative_routes(self) -> dict[fmt.Command, Route]:
        """Junction scenarios: the routes to the scenario's other exits from the same start (what the expert would
        do here under another command), while the ego is still on the approach they share with its own route, in
        the command window; empty otherwise (and on the highway and the merge, which have one route)."""
        r = self.route
        return dict(self._alternatives) if r.command_from_m <= self.progress_m < r.junction_m else {}

    def _exit_directions(self, entry: LaneIndex, candidates: list[tuple[str, str]]) -> dict[str, str]:
        """Classify each exit (its first straight segment) as right / straight / left from the world headings."""
        net = self.road.network
        h_in = -net.get_lane(entry).heading_at(0.0)
        out = {}
        for a, b in candidates:
            lane = net.get_lane((a, b, 0))
            out.setdefault(_direction(-lane.heading_at(lane.length) - h_in), b)
        return out

    def _build_roundabout(self) -> None:
        tr = self.spec.traffic
        exits = self._exit_directions(("ser", "ses", 0), [("exs", "exr"), ("nxs", "nxr"), ("wxs", "wxr")])
        self._junction_route(("ser", "ses", 0), exits, "se", 2)  # the exit: its curve off the ring, its road
        ring = [("se", "ex"), ("ex", "ee"), ("ee", "nx"), ("nx", "ne"), ("ne", "wx"), ("wx", "we"), ("we", "sx"),
                ("sx", "se")]
        cands = [((a, b, 1), float(s)) for a, b in ring for s in (4.0, 10.0)]
        cands += [((a, b, 0), float(s)) for a, b in (("eer", "ees"), ("ner", "nes"), ("wer", "wes"))
                  for s in (20.0, 45.0, 70.0)]
        self._place_traffic(cands, int(tr["vehicles"]), 12.0, tr["speed"], ["exr", "sxr", "nxr", "wxr"], 22.0)
        for v in self.road.vehicles:  # one-lane circulation: highway-env's ring lane changes cut across exits
            v.enable_lane_change = False

    def _build_intersection(self) -> None:
        exits = self._exit_directions(("o0", "ir0", 0), [("il1", "o1"), ("il2", "o2"), ("il3", "o3")])
        self._junction_route(("o0", "ir0", 0), exits, "ir0", 1)  # the exit road after the turn
        tr = self.spec.traffic
        cands = [((f"o{c}", f"ir{c}", 0), float(s)) for c in (1, 2, 3) for s in np.arange(20.0, 95.0, 5.0)]
        self._place_traffic(cands, int(tr["vehicles"]), 15.0, tr["speed"], ["o0", "o1", "o2", "o3"])
        self._next_spawn = float(tr.get("spawn_period_s", 1.0))
        ego, rule = self.ego, RegulatedRoad.respect_priorities

        def priorities(v1, v2):
            """The ego comes from the minor road and gives way itself: traffic yields to it only once it is in the
            box (an IDM car that stops in the box for an ego still waiting at its line deadlocks both)."""
            if ego not in (v1, v2):
                return rule(v1, v2)
            return (v2 if v1 is ego else v1) if ego.lane_index[0].startswith("ir") else None

        self.road.respect_priorities = priorities
        if self.spec.stop_line:  # across the approach lane where it enters the box
            lane = self.road.network.get_lane(("o0", "ir0", 0))
            end, h, half = lane.position(lane.length, 0.0), lane.heading_at(lane.length), lane.width_at(lane.length) / 2
            across = np.array([-math.sin(h), math.cos(h)]) * half
            self._stop_lines.append(mirror(np.stack([end - across, end + across])))

    def _spawn_intersection(self) -> None:
        tr = self.spec.traffic
        if self.rng.uniform() > float(tr.get("spawn_probability", 0.5)):
            return
        corner = int(self.rng.integers(1, 4))
        lane = (f"o{corner}", f"ir{corner}", 0)
        p = self.road.network.get_lane(lane).position(5.0, 0.0)
        if any(np.linalg.norm(v.position - p) < 15.0 for v in self.road.vehicles):
            return
        dest = f"o{int(self.rng.choice([c for c in range(4) if c != corner]))}"
        self.road.vehicles.append(self._idm(lane, 5.0, float(self.rng.uniform(*tr["speed"])), dest))

    def _geometry(self) -> RoadGeometry:
        strips = []
        for lane in self.road.network.lanes_list():
            lo, hi = 0.0, lane.length
            if isinstance(lane, StraightLane) and lane.length > 2000:
                lo, hi = max(lo, self._view[0]), min(hi, self._view[1])
            step = 10.0 if isinstance(lane, StraightLane) else 1.5
            s = np.append(np.arange(lo, hi, step), hi)
            centre = mirror(np.array([lane.position(v, 0.0) for v in s]))
            width = np.array([lane.width_at(v) for v in s])
            strips.append(LaneStrip(centre, width, _line_kind(lane.line_types[0]), _line_kind(lane.line_types[1])))
        return RoadGeometry(tuple(strips), tuple(self._stop_lines))

    # -------------------------------------------------------------------------------------------------------- state
    def _velocity_world(self) -> np.ndarray:
        return mirror(self.ego.velocity)

    @property
    def ego_pose(self) -> Pose2D:
        x, y = mirror(self.ego.position)
        return Pose2D(float(x), float(y), float(-self.ego.heading))

    @property
    def ego_speed(self) -> float:
        return float(self.ego.speed)

    def ego_velocity(self) -> tuple[float, float]:
        """Velocity in the ego frame (x forward, y left), m/s."""
        fwd, left = rotate_to_ego(*self._velocity_world(), self.ego_pose.heading)
        return float(fwd), float(left)

    def ego_acceleration(self) -> tuple[float, float]:
        fwd, left = rotate_to_ego(*self.acceleration_world, self.ego_pose.heading)
        return float(fwd), float(left)

    @property
    def command(self) -> fmt.Command:
        r = self.route
        return r.command if r.command_from_m <= self.progress_m <= r.command_to_m else fmt.Command.FOLLOW

    def route_points(self, route: Route | None = None) -> np.ndarray:
        """The plan prompt's optional route points (``fmt.route_line``): the centre of the route lane nearest the
        ego, ``fmt.ROUTE_AHEAD_M`` metres ahead of it along the route, in the ego frame (x forward, y left, m),
        shape (len(ROUTE_AHEAD_M), 2). ``route``: the world's own (default) or one of ``alternative_routes()`` (read
        from the ego's segment of the world's route, which they share while offered). Near the route's end the points
        stay at the end of its last lane."""
        return self.ego_pose.to_ego(self.route_centre(fmt.ROUTE_AHEAD_M, route))

    def route_centre(self, distances, route: Route | None = None) -> np.ndarray:
        """The centre of the route lane nearest the ego, ``distances`` metres ahead of it along ``route`` (default the
        world's own), (N, 2) in the world frame (``ego_pose``'s): also the polyline a route source publishes (the ROS
        bridge's ``route/path``), from which ``route_points_ahead`` reads what ``route_points`` gives directly."""
        return mirror((self.route if route is None else route).centre_ahead(self._k, self.ego.position, distances))

    def _id(self, obj: object) -> int:
        """A stable actor id, never reused (Python recycles id() of freed objects, so the object is kept)."""
        if id(obj) not in self._actors:
            self._actors[id(obj)] = (obj, next(self._next_actor))
        return self._actors[id(obj)][1]

    def others(self) -> list[VehicleBox]:
        """Every other vehicle and static obstacle, in the world frame."""
        out = []
        for obj in [*self.road.vehicles[1:], *self.road.objects]:
            i = self._id(obj)
            (x, y), = mirror(obj.position[None])
            static = isinstance(obj, Obstacle)
            rgb = (150, 150, 150) if static else _PALETTE[i % len(_PALETTE)]
            out.append(VehicleBox(i, Pose2D(float(x), float(y), float(-obj.heading)), float(obj.LENGTH),
                                  float(obj.WIDTH), 1.0 if static else 1.5, float(obj.speed), rgb, static))
        return out

    @property
    def route_length_m(self) -> float:
        return self.route.target_m - self.route.start_m

    def episode_log(self, planner: str, mode: str, plan_latency_s: list[float] | None = None,
                    forward_calls_per_token: float | None = None, end_reason: str = "") -> EpisodeLog:
        """Everything the metrics need about this episode so far (``end_reason`` when it was cut short)."""
        tr = self.trace
        return EpisodeLog(
            scenario=self.spec.name, seed=self.seed, planner=planner, mode=mode, route_length_m=self.route_length_m,
            time_limit_s=self.spec.duration_s, dt=self.dt, t=tr["t"], x=tr["x"], y=tr["y"], heading=tr["heading"],
            speed=tr["speed"], progress_m=tr["progress_m"], on_route_lanes=self.trace_on_route, events=self.events,
            end_reason=self.end_reason or end_reason, plan_latency_s=list(plan_latency_s or []),
            forward_calls_per_token=forward_calls_per_token, end_phase=self.route.phase(self.last_on_route_m),
            end_junction_m=None if math.isinf(self.route.junction_m) else self.last_on_route_m - self.route.junction_m,
            start_free_s=self.start_free_s,
        )

    @property
    def last_on_route_m(self) -> float:
        """Route progress at the last step the ego was on its route's lanes: where it left them, if it did (its
        progress after that is only the nearest route point)."""
        on = self.trace_on_route
        k = next((i for i in range(len(on) - 1, -1, -1) if on[i]), 0)
        return self.route.start_m + self.trace["progress_m"][k] if on else self.progress_m

    @property
    def done(self) -> bool:
        return bool(self.end_reason)

    # --------------------------------------------------------------------------------------------------------- step
    def step(self, acceleration: float, steer: float) -> list[InfractionEvent]:
        """Advance one sim step with the ego's (acceleration m/s^2, front-wheel angle rad, + left); returns the
        infractions of this step."""
        if self.done:
            raise RuntimeError(f"episode already ended ({self.end_reason})")
        self.ego.action = {"acceleration": float(acceleration),
                           "steering": -float(np.clip(steer, -MAX_STEER_RAD, MAX_STEER_RAD))}
        for v in self.scripted:
            v.clock = self.t
        self.road.act()  # the ego is a plain Vehicle: act(None) keeps the action set above
        self.road.step(self.dt)
        keep = [self.ego]
        for v in self.road.vehicles[1:]:
            v.speed = max(v.speed, 0.0)  # highway-env's IDM can brake into reverse; traffic never reverses
            still = self._traffic_still.get(self._id(v), 0.0) + self.dt if v.speed < 0.1 else 0.0
            self._traffic_still[self._id(v)] = still
            if still < STUCK_TRAFFIC_S or isinstance(v, ScriptedVehicle):  # IDM cars can deadlock in a junction; like CARLA's
                keep.append(v)  # traffic manager, the world removes a car that has not moved for this long (not
                # one that stands on its timetable)
        self.road.vehicles = keep
        self.t += self.dt
        if self._pulls_away is not None and self._pulls_away.speed > PULL_AWAY_SPEED:
            self.start_free_s, self._pulls_away = round(self.t, 6), None
        new = self._collisions()
        if self.spec.kind == "intersection" and self.t >= self._next_spawn:
            self._next_spawn += float(self.spec.traffic.get("spawn_period_s", 1.0))
            self._spawn_intersection()
            self._clear_left_traffic()
        v = self._velocity_world()
        self.acceleration_world = (v - self._prev_velocity) / self.dt
        self._prev_velocity = v
        self._update_route()
        self.events.extend(new)
        self._record()
        return new

    def _clear_left_traffic(self) -> None:
        keep = [self.ego]
        for v in self.road.vehicles[1:]:
            a, b, _ = v.lane_index
            leaving = a.startswith("il") and b.startswith("o") and v.lane.local_coordinates(v.position)[0] > 60.0
            if not leaving:
                keep.append(v)
        self.road.vehicles = keep

    def _collisions(self) -> list[InfractionEvent]:
        ego, out = self.ego, []
        if not ego.crashed:
            return out
        for other in [*self.road.vehicles[1:], *self.road.objects]:
            if np.linalg.norm(other.position - ego.position) > (ego.diagonal + other.diagonal) / 2 + 0.5:
                continue
            if not hw_utils.are_polygons_intersecting(ego.polygon(), other.polygon(), np.zeros(2), np.zeros(2))[0] \
                    and not other.crashed:
                continue
            i = self._id(other)
            other.crashed = False
            if self.t - self._last_hit.get(i, -math.inf) < COLLISION_REPEAT_S:  # measured from the counted hit
                continue
            self._last_hit[i] = self.t
            static = isinstance(other, Obstacle)
            rel = self.ego_pose.to_ego(mirror(other.position[None]))[0]
            rear_ended = not static and rel[0] < -ego.LENGTH / 2 and other.speed > ego.speed + 0.5
            x, y = mirror(ego.position)
            out.append(InfractionEvent(Infraction.COLLISION_STATIC if static else Infraction.COLLISION_VEHICLE,
                                       round(self.t, 3), i, not rear_ended, float(x), float(y),
                                       "rear-ended" if rear_ended else ""))
        ego.crashed = False  # the episode goes on after a collision, as in the Leaderboard
        return out

    def _update_route(self) -> None:
        r, pos = self.route, self.ego.position
        self._k, self.progress_m, distance = r.locate(self._k, pos)
        self.on_route = distance <= 0.0
        on_other = not self.on_route and any(
            lane.on_lane(pos) for lane in self.road.network.lanes_list() if lane not in r.lanes)
        self._wrong_s = self._wrong_s + self.dt if on_other else 0.0
        self._still_s = self._still_s + self.dt if self.ego.speed < 0.1 else 0.0
        x, y = mirror(pos)
        if self.spec.stop_line and not self.stopped_at_line:
            if r.junction_m - STOP_ZONE_M <= self.progress_m <= r.junction_m and self.ego.speed < STOP_SPEED:
                self.stopped_at_line = True
            elif self.progress_m > r.junction_m and not self._ran_stop:
                self._ran_stop = True  # entered the box without the full stop (counted once)
                self.events.append(InfractionEvent(Infraction.STOP_SIGN, round(self.t, 3), None, True, float(x), float(y)))
        if self.progress_m >= r.target_m:
            self.end_reason = "completed"
        elif self._wrong_s >= self.set.wrong_lane_s or r.distance(pos) > self.set.deviation_m:
            self.end_reason = "route_deviation"
            self.events.append(InfractionEvent(Infraction.ROUTE_DEVIATION, round(self.t, 3), None, True, float(x), float(y)))
        elif self._still_s >= self.set.blocked_s:
            self.end_reason = "blocked"
            self.events.append(InfractionEvent(Infraction.AGENT_BLOCKED, round(self.t, 3), None, True, float(x), float(y)))
        elif self.t >= self.spec.duration_s - 1e-9:
            self.end_reason = "timeout"
            self.events.append(InfractionEvent(Infraction.ROUTE_TIMEOUT, round(self.t, 3), None, True, float(x), float(y)))

    def _record(self) -> None:
        p = self.ego_pose
        for k, v in (("t", self.t), ("x", p.x), ("y", p.y), ("heading", p.heading), ("speed", self.ego_speed),
                     ("progress_m", self.progress_m - self.route.start_m)):
            self.trace[k].append(float(v))
        self.trace_on_route.append(bool(self.on_route))
