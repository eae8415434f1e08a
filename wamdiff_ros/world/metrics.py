"""Closed-loop episode metrics with CARLA Leaderboard 2.0 / Bench2Drive semantics, in pure numpy.

- Route completion (RC): percentage of the route advanced; LB 2.0 discounts the part driven outside the route's lanes.
- Infraction penalty: product of LB 2.0's multipliers; Bench2Drive drops the min-speed penalty.
- Driving score (DS) = RC x penalty; success (Bench2Drive) = RC 100 % and no infraction (min speed excepted).
- Comfort: Bench2Drive's "Driving Smoothness" built on nuPlan's ``ego_is_comfortable`` bounds.

Everything the simulator records goes into one :class:`EpisodeLog`; :func:`score_episode` turns it into an
:class:`EpisodeScore` (comfort: ``wamdiff_ros.world.comfort``); ``wamdiff_ros.world.summary`` aggregates scores per
(planner, mode) with bootstrap confidence intervals.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from wamdiff_ros.world.comfort import comfort

# ---------------------------------------------------------------------------------------------------------------
# infractions


class Infraction(str, enum.Enum):
    """Infraction kinds; values are the CARLA Leaderboard 2.0 result-file keys (``infractions`` of a route record)."""

    COLLISION_PEDESTRIAN = "collisions_pedestrian"
    COLLISION_VEHICLE = "collisions_vehicle"
    COLLISION_STATIC = "collisions_layout"
    RED_LIGHT = "red_light"
    STOP_SIGN = "stop_infraction"
    SCENARIO_TIMEOUT = "scenario_timeouts"
    YIELD_EMERGENCY = "yield_emergency_vehicle_infractions"
    MIN_SPEED = "min_speed_infractions"
    ROUTE_DEVIATION = "route_dev"
    ROUTE_TIMEOUT = "route_timeout"
    AGENT_BLOCKED = "vehicle_blocked"
    OUTSIDE_LANES = "outside_route_lanes"


COLLISIONS: frozenset[Infraction] = frozenset(
    {Infraction.COLLISION_PEDESTRIAN, Infraction.COLLISION_VEHICLE, Infraction.COLLISION_STATIC})
# LB 2.0 stops the route on these; they carry no multiplier, RC simply stops growing.
ENDS_ROUTE: frozenset[Infraction] = frozenset(
    {Infraction.ROUTE_DEVIATION, Infraction.ROUTE_TIMEOUT, Infraction.AGENT_BLOCKED})

PENALTY: dict[Infraction, float] = {
    Infraction.COLLISION_PEDESTRIAN: 0.50,
    Infraction.COLLISION_VEHICLE: 0.60,
    Infraction.COLLISION_STATIC: 0.65,
    Infraction.RED_LIGHT: 0.70,
    Infraction.STOP_SIGN: 0.80,
    Infraction.SCENARIO_TIMEOUT: 0.70,
    Infraction.YIELD_EMERGENCY: 0.70,
    # LB 2.0 scales this one by the speed ratio; Bench2Drive (2024/08) removed it from the driving score.
    Infraction.MIN_SPEED: 1.0,
    Infraction.ROUTE_DEVIATION: 1.0,
    Infraction.ROUTE_TIMEOUT: 1.0,
    Infraction.AGENT_BLOCKED: 1.0,
    # LB 2.0 discounts the distance driven outside the route lanes from RC instead of multiplying.
    Infraction.OUTSIDE_LANES: 1.0,
}

END_REASONS: tuple[str, ...] = ("completed", "timeout", "route_deviation", "blocked", "stopped")  # stopped: cut
# short by the caller (e.g. a bridge's sim-time limit) before the world ended it
RC_TOLERANCE = 1e-6


@dataclass(slots=True)
class InfractionEvent:
    """One infraction at sim time ``t``; ``actor`` is the other party's id; ``at_fault`` False marks e.g. being
    rear-ended (LB 2.0 still penalises it; the report counts it apart). ``x``/``y``: world-frame location."""

    kind: Infraction
    t: float
    actor: int | None = None
    at_fault: bool = True
    x: float = 0.0
    y: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "t": self.t, "actor": self.actor, "at_fault": self.at_fault,
                "x": self.x, "y": self.y, "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> InfractionEvent:
        return cls(kind=Infraction(d["kind"]), t=float(d["t"]), actor=d.get("actor"),
                   at_fault=bool(d.get("at_fault", True)), x=float(d.get("x", 0.0)), y=float(d.get("y", 0.0)),
                   note=str(d.get("note", "")))


# ---------------------------------------------------------------------------------------------------------------
# episode log

_TRACE_FIELDS: tuple[str, ...] = ("t", "x", "y", "heading", "speed", "progress_m", "on_route_lanes")


@dataclass(slots=True)
class EpisodeLog:
    """What the simulator records for one episode. Per-step arrays share one length and use the world frame of
    ``wamdiff_ros.world.types`` (heading CCW from +x, radians); ``progress_m`` is the ego's arc length along the
    route (it may step back a little); ``on_route_lanes`` is False while off-road or outside the route's lanes."""

    scenario: str
    seed: int
    planner: str
    mode: str  # "paused" | "realtime"
    route_length_m: float
    time_limit_s: float
    dt: float
    t: np.ndarray
    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    speed: np.ndarray
    progress_m: np.ndarray
    on_route_lanes: np.ndarray
    events: list[InfractionEvent] = field(default_factory=list)
    end_reason: str = "completed"  # one of END_REASONS
    plan_latency_s: list[float] = field(default_factory=list)
    forward_calls_per_token: float | None = None
    end_phase: str = ""  # junction routes: approach | junction | exit, where the ego left its route or ended on it
    end_junction_m: float | None = None  # ... and that point's route metres from the ring's / box's start
    plans_cut: int = 0  # plans cut at a planning deadline (``wamdiff-eval --deadline-ms``) ...
    anytime_plans: int = 0  # ... of which the best-so-far plan was driven (the rest: the fallback stop)
    plan_quality: dict = field(default_factory=dict)  # ``closed_loop.PlanQuality.as_dict()``: plans stepping back, ...
    perturbation: dict = field(default_factory=dict)  # ``perturb.Perturber``: its label and what it did ({} = clean)
    start_free_s: float = 0.0  # starts at rest: when the way ahead opens (the standing car ahead pulls away), s

    def __post_init__(self) -> None:
        for name in _TRACE_FIELDS:
            dtype = bool if name == "on_route_lanes" else np.float64
            setattr(self, name, np.asarray(getattr(self, name), dtype=dtype).reshape(-1))
        lengths = {name: len(getattr(self, name)) for name in _TRACE_FIELDS}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"EpisodeLog traces differ in length: {lengths}")

    @property
    def steps(self) -> int:
        return len(self.t)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif f.name == "events":
                value = [e.to_json() for e in value]
            elif f.name == "plan_latency_s":
                value = [float(v) for v in value]
            d[f.name] = value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EpisodeLog:
        kwargs = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kwargs["events"] = [InfractionEvent.from_json(e) for e in d.get("events", [])]
        kwargs["plan_latency_s"] = [float(v) for v in d.get("plan_latency_s", [])]
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# route completion and penalty


def _route_advance(log: EpisodeLog) -> tuple[np.ndarray, np.ndarray]:
    """Per-step advance of the route (increments of the running maximum of progress from the route start, so
    driving back and forth is counted once) and whether that step was on the route's lanes."""
    best = np.maximum.accumulate(np.concatenate([[0.0], log.progress_m]))
    return np.diff(best), log.on_route_lanes


def route_completion(log: EpisodeLog) -> float:
    """LB 2.0 route completion in percent [0, 100]: route advanced while on the route's lanes over the route length.

    The route part driven off-road or in a wrong lane is discounted (LB 2.0 "outside route lanes"); route deviation,
    timeout and blocked end the episode, so RC just stops where the log stops."""
    if log.route_length_m <= 0.0:
        raise ValueError(f"route_length_m must be positive, got {log.route_length_m}")
    advance, on_lanes = _route_advance(log)
    return float(np.clip(100.0 * advance[on_lanes].sum() / log.route_length_m, 0.0, 100.0))


def offlane_distance(log: EpisodeLog) -> float:
    """Metres of route advanced while outside the route's lanes (what :func:`route_completion` discounts)."""
    advance, on_lanes = _route_advance(log)
    return float(advance[~on_lanes].sum())


def infraction_penalty(events: Iterable[InfractionEvent]) -> float:
    """LB 2.0 infraction penalty: the product of :data:`PENALTY` over every event (not-at-fault collisions
    included, as in LB 2.0); min speed (Bench2Drive), route-ending and outside-lanes events multiply by 1."""
    return float(math.prod(PENALTY[e.kind] for e in events))


# ---------------------------------------------------------------------------------------------------------------
# episode score


@dataclass(slots=True)
class EpisodeScore:
    """One episode's LB 2.0 / Bench2Drive numbers; percentages in [0, 100], latencies in seconds (None if the
    planner never ran)."""

    scenario: str
    seed: int
    planner: str
    mode: str
    route_completion: float
    infraction_penalty: float
    driving_score: float
    success: bool
    collisions: int
    at_fault_collisions: int
    rear_ended: int
    offlane_m: float
    comfort: float
    plan_latency_mean_s: float | None
    plan_latency_p50_s: float | None
    plan_latency_p90_s: float | None
    end_reason: str
    duration_s: float
    infractions: dict[str, int] = field(default_factory=dict)  # Infraction value -> count
    forward_calls_per_token: float | None = None
    end_phase: str = ""  # see EpisodeLog
    end_junction_m: float | None = None
    plan_quality: dict = field(default_factory=dict)  # see EpisodeLog
    perturbation: dict = field(default_factory=dict)  # see EpisodeLog
    start_moved_m: float | None = None  # starts at rest: route progress START_WINDOW_S after the way opened

    @property
    def start_ok(self) -> bool | None:
        """A start from rest succeeded: the ego moved START_MOVE_M along its route within START_WINDOW_S (None
        when the episode did not start at rest)."""
        return None if self.start_moved_m is None else self.start_moved_m >= START_MOVE_M

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EpisodeScore:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def is_success(route_completion_pct: float, events: Iterable[InfractionEvent]) -> bool:
    """Bench2Drive success: the route is completed and no infraction other than min speed was committed."""
    return route_completion_pct >= 100.0 - RC_TOLERANCE and all(e.kind is Infraction.MIN_SPEED for e in events)


START_SPEED = 0.1  # m/s: an episode whose ego starts slower than this starts at rest
START_WINDOW_S, START_MOVE_M = 5.0, 10.0  # a start from rest succeeds when the ego moves this far this soon


def start_moved(log: EpisodeLog) -> float | None:
    """Route progress START_WINDOW_S after the way ahead opened (``start_free_s``; at once on a clear road) in an
    episode that starts at rest (or at its end, if sooner); None when it starts moving."""
    if not log.steps or float(log.speed[0]) >= START_SPEED:
        return None
    t = np.asarray(log.t, dtype=np.float64)
    k = int(np.searchsorted(t, t[0] + log.start_free_s + START_WINDOW_S - 1e-9))
    return round(float(log.progress_m[min(k, len(t) - 1)]), 3)


def score_episode(log: EpisodeLog) -> EpisodeScore:
    """LB 2.0 driving score (RC x penalty) plus Bench2Drive success, comfort and the planner's latency."""
    rc = route_completion(log)
    penalty = infraction_penalty(log.events)
    collisions = [e for e in log.events if e.kind in COLLISIONS]
    counts: dict[str, int] = defaultdict(int)
    for e in log.events:
        counts[e.kind.value] += 1
    latency = np.asarray(log.plan_latency_s, dtype=np.float64)
    has_latency = latency.size > 0
    return EpisodeScore(
        scenario=log.scenario, seed=log.seed, planner=log.planner, mode=log.mode,
        route_completion=rc, infraction_penalty=penalty, driving_score=rc * penalty,
        success=is_success(rc, log.events),
        collisions=len(collisions), at_fault_collisions=sum(e.at_fault for e in collisions),
        rear_ended=sum(not e.at_fault for e in collisions),
        offlane_m=offlane_distance(log), comfort=comfort(log),
        plan_latency_mean_s=float(latency.mean()) if has_latency else None,
        plan_latency_p50_s=float(np.percentile(latency, 50)) if has_latency else None,
        plan_latency_p90_s=float(np.percentile(latency, 90)) if has_latency else None,
        end_reason=log.end_reason,
        duration_s=float(log.t[-1] - log.t[0]) if log.steps else 0.0,
        infractions=dict(counts), forward_calls_per_token=log.forward_calls_per_token, end_phase=log.end_phase,
        end_junction_m=None if log.end_junction_m is None else round(float(log.end_junction_m), 2),
        plan_quality=dict(log.plan_quality), perturbation=dict(log.perturbation), start_moved_m=start_moved(log))
