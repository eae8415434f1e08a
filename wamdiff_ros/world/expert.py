"""The privileged expert: reads the simulator's lanes, route and traffic (no camera) and emits the planner's answer,
8 ego-frame waypoints at 2 Hz. Lane keeping and lane choice (overtaking, merging) come from a reference path along
route lanes; car following, yielding and gap acceptance come from one rule: among candidate speed profiles, take the
fastest whose 4 s rollout keeps clear of every other road user's constant-speed prediction along its own route.

Works in highway-env coordinates internally (it is the world's privileged view); its output is in the ego frame of
``wamdiff_ros.format``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from highway_env.road.lane import AbstractLane
from highway_env.vehicle.objects import Obstacle

from wamdiff_ros import format as fmt
from wamdiff_ros.world.sim import World, mirror

HORIZON = np.arange(1, 17) * 0.25  # collision-check times, s
WAYPOINT_TIMES = np.arange(1, fmt.NUM_WAYPOINTS + 1) * fmt.WAYPOINT_DT_S
ACCELS = (1.5, 0.8, 0.0, -1.0, -2.0, -3.0, -4.5, -6.0)  # candidate profiles, fastest first
PATH_STEP_M = 1.0
PATH_LENGTH_M = 160.0
LAT_ACCEL = 2.2  # m/s^2 allowed in curves
CURVE_DECEL = 2.0
SMOOTH_M = 5.0
RING_NODES = frozenset(("se", "ex", "ee", "nx", "ne", "wx", "we", "sx"))
EGO_HALF_LENGTH = 2.5
GIVE_WAY_SPEED = 4.0  # m/s at a give-way line, reached braking at most GIVE_WAY_DECEL
GIVE_WAY_DECEL = 1.0
CREEP_SPEED = 1.0  # m/s: at a stop line, slower than this and
CREEP_FROM_M = 1.0  # farther than this from the stop point: roll up to the line rather than stop where it is
STOP_MARGIN_M = 2.0  # the follower lags a stop profile by about a metre
STOPPING_TARGET = 0.05  # m/s: a car whose own target speed is this low is braking to a stop


def _along_route(net, route: list, s: float, lat: float) -> np.ndarray:
    """Position ``s`` metres along a vehicle's route (its lane id kept where the next road has it)."""
    lane_id = route[0][2]
    for i, (a, b, _) in enumerate(route):
        lanes = net.graph[a][b]
        lane = lanes[min(lane_id, len(lanes) - 1)]
        if s <= lane.length or i == len(route) - 1:
            return lane.position(s, lat)
        s -= lane.length
    raise AssertionError("unreachable")


def _braking_travel(speed: float, decel: float, times: np.ndarray) -> np.ndarray:
    """Distance covered at ``times`` from ``speed`` under a constant ``decel`` <= 0 until standstill (constant speed
    when 0): the prediction of a car that brakes, e.g. a lead stopping in stop-and-go traffic."""
    if decel >= 0.0 or speed <= 0.0:
        return speed * times
    t = np.minimum(times, speed / -decel)
    return speed * t + 0.5 * decel * t * t


@dataclass(slots=True)
class ExpertPlan:
    waypoints: np.ndarray  # (8, 2) ego frame
    lane_id: int
    accel: float
    reason: str


class Expert:
    def __init__(self, world: World) -> None:
        self.w = world
        self.target_lane: int | None = None

    # ------------------------------------------------------------------------------------------------------- paths
    def _lane_sequence(self, lane_id: int) -> list[AbstractLane]:
        """Lanes along the route from the ego's segment, starting on ``lane_id`` and continuing geometrically."""
        return self.w.route.lane_sequence(self.w._k, lane_id)

    def _path(self, lane_id: int) -> tuple[np.ndarray, float]:
        """Reference path (N, 2) in highway-env coordinates from the ego along ``lane_id`` with the lateral offset
        blended out, and the ego's lateral offset to that lane."""
        lanes, pos, speed = self._lane_sequence(lane_id), self.w.ego.position, max(self.w.ego.speed, 3.0)
        s0, lat0 = lanes[0].local_coordinates(pos)
        blend = max(8.0, (0.4 + 0.5 * abs(lat0)) * speed)  # shrinks with the offset left, so changes finish
        a, b, lane_index = self.w.ego.lane_index
        if self.w.spec.kind == "merge" and (a, b, lane_index) == ("b", "c", 2):  # finish before the ramp lane ends
            blend = min(blend, max(8.0, self.w.ego.lane.length - self.w.ego.lane.local_coordinates(pos)[0] - 10.0))
        pts, d, s, i = [], 0.0, s0, 0
        segments = self.w.route.segments[self.w._k:]
        self.junction = (math.inf, math.inf)  # path distances where the junction box starts and ends
        if self._in_junction(segments[0]):
            self.junction = (-math.inf, math.inf)
        while d <= PATH_LENGTH_M:
            while s > lanes[i].length and i + 1 < len(lanes):
                s -= lanes[i].length
                i += 1
                if self._in_junction(segments[i]) and self.junction[0] == math.inf:
                    self.junction = (d - s, math.inf)
                elif not self._in_junction(segments[i]) and self.junction[0] < math.inf and self.junction[1] == math.inf:
                    self.junction = (self.junction[0], d - s)
            x = min(d / blend, 1.0)
            pts.append(lanes[i].position(s, lat0 * (1.0 - x * x * (3.0 - 2.0 * x))))
            d += PATH_STEP_M
            s += PATH_STEP_M
        pts = np.asarray(pts)
        # lanes of highway-env's junctions do not always meet (roundabout exits start metres off the ring): a moving
        # average over SMOOTH_M turns those jumps into drivable curves; the ego's own point stays fixed
        k = int(SMOOTH_M / PATH_STEP_M) | 1
        padded = np.pad(pts, ((k // 2, k // 2), (0, 0)), mode="edge")
        smooth = np.stack([np.convolve(padded[:, i], np.ones(k) / k, mode="valid") for i in (0, 1)], axis=1)
        ramp = np.clip(np.arange(len(pts)) / (k // 2 + 1), 0.0, 1.0)[:, None]
        return pts * (1 - ramp) + smooth * ramp, float(lat0)

    def _in_junction(self, segment: tuple[str, str]) -> bool:
        a, b = segment
        if self.w.spec.kind == "intersection":
            return a.startswith("ir")
        if self.w.spec.kind == "roundabout":
            return a in RING_NODES and b in RING_NODES
        return False

    @staticmethod
    def _speed_limits(path: np.ndarray, v_max: float) -> np.ndarray:
        """Per-point speed limit from curvature, propagated backwards so the car brakes before a curve."""
        d = np.gradient(path, axis=0)
        heading = np.unwrap(np.arctan2(d[:, 1], d[:, 0]))
        kappa = np.abs(np.gradient(heading)) / PATH_STEP_M
        kappa = np.convolve(kappa, np.ones(5) / 5, mode="same")
        lim = np.minimum(v_max, np.sqrt(LAT_ACCEL / np.maximum(kappa, 1e-6)))
        for i in range(len(lim) - 2, -1, -1):
            lim[i] = min(lim[i], math.sqrt(lim[i + 1] ** 2 + 2 * CURVE_DECEL * PATH_STEP_M))
        return lim

    def _profile(self, accel: float, limits: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Arc length along the path at ``times`` for a constant-acceleration profile capped by the limits."""
        dt = 0.05
        v, s, out, t = self.w.ego.speed, 0.0, [], 0.0
        for until in times:
            while t < until - 1e-9:
                cap = limits[min(int(s / PATH_STEP_M), len(limits) - 1)]
                if accel <= 0:
                    a = accel
                else:  # accelerate up to the limit; above it, come down to it within a second
                    a = min(accel, (cap - v) / dt) if v < cap else (cap - v) / 1.0
                v = max(0.0, v + a * dt)
                s += v * dt
                t += dt
            out.append(s)
        return np.asarray(out)

    # ------------------------------------------------------------------------------------------------- prediction
    def _predictions(self) -> list[tuple[np.ndarray, float, bool]]:
        """Every other road user's positions at HORIZON (constant speed along its route), its speed, and whether
        it follows the ego in the ego's lane (its job to keep the gap)."""
        net, ego = self.w.road.network, self.w.ego
        out = []
        h = ego.heading
        fwd = np.array([math.cos(h), math.sin(h)])
        for v in [*self.w.road.vehicles[1:], *self.w.road.objects]:
            if np.linalg.norm(v.position - ego.position) > 120.0:
                continue
            stopping = getattr(v, "target_speed", 1.0) <= STOPPING_TARGET  # braking to a standstill (a timetabled
            brake = min(float((getattr(v, "action", None) or {}).get("acceleration", 0.0)), 0.0) if stopping else 0.0
            travel = _braking_travel(float(v.speed), brake, HORIZON)  # stop): predicted to stop; others keep speed
            if isinstance(v, Obstacle) or getattr(v, "route", None) is None:
                heading = np.array([math.cos(v.heading), math.sin(v.heading)])
                pos = np.repeat(v.position[None], len(HORIZON), axis=0) + np.outer(travel, heading)
                out.append((pos, float(v.speed), False))
                continue
            lane_index = getattr(v, "target_lane_index", None) or v.lane_index  # anticipates MOBIL cut-ins
            s, lat = net.get_lane(lane_index).local_coordinates(v.position)
            route = [lane_index, *[(*r[:2], None) for r in v.route if r[:2] != lane_index[:2]]]
            rel = v.position - ego.position
            behind = rel @ fwd < -2.0 and v.lane_index == ego.lane_index
            pos = np.array([_along_route(net, route, s + d, lat * math.exp(-t)) for d, t in zip(travel, HORIZON)])
            out.append((pos, float(v.speed), behind))
        return out

    def _first_conflict(self, path: np.ndarray, s_t: np.ndarray, preds, lane_change: bool) -> float:
        """Earliest HORIZON time at which the ego, driving ``s_t`` along ``path``, comes too close to anyone."""
        idx = np.clip((s_t / PATH_STEP_M).astype(int), 0, len(path) - 2)
        ego_pos = path[idx]
        tangent = path[idx + 1] - path[idx]
        tangent /= np.maximum(np.linalg.norm(tangent, axis=1, keepdims=True), 1e-9)
        v_ego = np.diff(np.concatenate([[0.0], s_t])) / 0.25
        first = math.inf
        for pos, speed, behind in preds:
            if behind and not lane_change:
                continue
            rel = pos - ego_pos
            lon = np.einsum("ij,ij->i", rel, tangent)
            lat = np.abs(rel[:, 0] * tangent[:, 1] - rel[:, 1] * tangent[:, 0])
            ahead = lon > -4.0 if not lane_change else lon > -(6.0 + 1.5 * max(0.0, speed - self.w.ego.speed))
            clash = ahead & (np.abs(lon) < 6.0 + 0.5 * v_ego) & (lat < 2.6)
            if clash.any():
                first = min(first, float(HORIZON[int(np.argmax(clash))]))
        return first

    # ------------------------------------------------------------------------------------------------------ choice
    def _candidate_lanes(self) -> list[int]:
        net, r, k = self.w.road.network, self.w.route, self.w._k
        a, b = r.segments[k]
        n = len(net.graph[a][b])
        cur = self.w.ego.lane_index[2] if self.w.ego.lane_index[:2] == (a, b) else 0
        if self.w.spec.kind == "merge" and (a, b) == ("b", "c"):
            return [1, cur] if cur == 2 else [cur]
        if self.w.spec.kind != "highway":  # keep to the nearest lane of the route's current road
            lanes = net.graph[a][b]
            return [min(range(n), key=lambda i: abs(lanes[i].local_coordinates(self.w.ego.position)[1]))]
        if self.target_lane is not None and self.target_lane != cur:
            return [self.target_lane, cur]
        return [cur] + [c for c in (cur - 1, cur + 1) if 0 <= c < n]

    def plan(self) -> ExpertPlan:
        preds = self._predictions()
        best = fallback = None
        for rank, lane_id in enumerate(self._candidate_lanes()):
            path, lat0 = self._path(lane_id)
            limits = self._speed_limits(path, self.w.spec.desired_speed)
            if self.w.spec.kind == "intersection" and 0 < self.junction[0] < math.inf:  # approach the give-way line
                d = self.junction[0] - np.arange(len(limits)) * PATH_STEP_M  # slowly enough to stop at it gently
                limits = np.minimum(limits, np.sqrt(GIVE_WAY_SPEED ** 2 + 2 * GIVE_WAY_DECEL * np.maximum(d, 0.0)))
            lane_change = abs(lat0) > 1.5 and self.w.spec.kind in ("highway", "merge")  # junctions: rejoin
            chosen = None
            accels = list(ACCELS)
            to_line = self.junction[0] - EGO_HALF_LENGTH - STOP_MARGIN_M
            must_stop = self.w.spec.stop_line and not self.w.stopped_at_line and self.junction[0] < math.inf
            if must_stop and to_line > CREEP_FROM_M and self.w.ego.speed < CREEP_SPEED:
                # slow or standing short of the line (a driver it labels stopped early): roll up to the line on a
                # gentle stopping profile, not a stop where it stands (that would hold it there for good)
                d = to_line - np.arange(len(limits)) * PATH_STEP_M
                limits = np.minimum(limits, np.sqrt(2.0 * GIVE_WAY_DECEL * np.maximum(d, 0.0)))
            elif must_stop and to_line < 60.0:  # a stop line: a full stop at it first, whatever the traffic
                stop = -min(6.0, self.w.ego.speed ** 2 / (2 * max(to_line, 0.05))) if to_line > 0.3 else -6.0
                accels = [stop] + [a for a in accels if a < stop]
            elif 0.3 < to_line < 60.0:  # a profile that stops at the junction's entry line
                accels.append(-min(6.0, self.w.ego.speed ** 2 / (2 * to_line)))
                accels.sort(reverse=True)
            for a in accels:
                s_t = self._profile(a, limits, HORIZON)
                conflict = self._first_conflict(path, s_t, preds, lane_change)
                end_speed = (s_t[-1] - s_t[-2]) / (HORIZON[-1] - HORIZON[-2])
                if self.junction[0] - EGO_HALF_LENGTH < s_t[-1] < self.junction[1] and end_speed < 2.0 \
                        and self.junction[0] > 0:
                    conflict = min(conflict, HORIZON[-1])  # never plan to come to rest inside the junction
                if conflict == math.inf:
                    chosen = (a, s_t[-1], conflict)
                    break
                if chosen is None or conflict >= chosen[2]:  # ties: the gentler-on-others (slower) one
                    chosen = (a, s_t[-1], conflict)
            a, reach, conflict = chosen
            feasible = conflict == math.inf
            must = self.w.spec.kind == "merge"  # the ramp lane ends: accept a gap that needs braking
            if lane_change and (not feasible or a < (-3.0 if must else -1.0)):  # take another lane only into a gap
                fallback = fallback or (-abs(lat0), lane_id, a, path, limits, lane_change, "no gap")
                continue
            bonus = 6.0 if rank == 0 else 0.0
            if self.w.spec.kind == "merge" and lane_change:
                bonus += 100.0  # leave the ending ramp lane whenever a gap allows
            score = reach + bonus
            if best is None or score > best[0]:
                best = (score, lane_id, a, path, limits, lane_change, "free" if feasible else "yield")
        _, lane_id, a, path, limits, lane_change, why = best or fallback
        if self.w.spec.kind == "highway":
            self.target_lane = lane_id
        s_wp = self._profile(a, limits, WAYPOINT_TIMES)
        idx = np.minimum(s_wp / PATH_STEP_M, len(path) - 1.001)
        i0 = idx.astype(int)
        pts = path[i0] + (path[i0 + 1] - path[i0]) * (idx - i0)[:, None]
        wp = self.w.ego_pose.to_ego(mirror(pts))
        return ExpertPlan(wp.astype(np.float32), lane_id, a, ("lane change " if lane_change else "") + why)
