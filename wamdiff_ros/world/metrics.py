"""Closed-loop episode metrics with CARLA Leaderboard 2.0 / Bench2Drive semantics, in pure numpy.

- Route completion (RC): percentage of the route advanced; LB 2.0 discounts the part driven outside the route's lanes.
- Infraction penalty: product of LB 2.0's multipliers; Bench2Drive drops the min-speed penalty.
- Driving score (DS) = RC x penalty; success (Bench2Drive) = RC 100 % and no infraction (min speed excepted).
- Comfort: Bench2Drive's "Driving Smoothness" built on nuPlan's ``ego_is_comfortable`` bounds.

Everything the simulator records goes into one :class:`EpisodeLog`; :func:`score_episode` turns it into an
:class:`EpisodeScore`, and :func:`summarize` aggregates scores per (planner, mode) with bootstrap confidence intervals.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

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

END_REASONS: tuple[str, ...] = ("completed", "timeout", "route_deviation", "blocked")
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
# comfort (nuPlan ego_is_comfortable bounds, Bench2Drive "Driving Smoothness" segmentation)

MAX_ABS_MAG_JERK = 8.37  # m/s^3
MAX_ABS_LAT_ACCEL = 4.89  # m/s^2
MIN_LON_ACCEL, MAX_LON_ACCEL = -4.05, 2.40  # m/s^2
MAX_ABS_YAW_ACCEL = 1.93  # rad/s^2
MAX_ABS_LON_JERK = 4.13  # m/s^3
MAX_ABS_YAW_RATE = 0.95  # rad/s

COMFORT_DT = 0.1  # nuPlan and Bench2Drive evaluate at 10 Hz
SAVGOL_WINDOW = 8  # samples at COMFORT_DT (nuPlan)
SAVGOL_ORDER = 2
COMFORT_SEGMENT = 20  # samples at COMFORT_DT: Bench2Drive's 2 s segments


@dataclass(frozen=True, slots=True)
class ComfortSignals:
    """The six nuPlan comfort signals on the uniform :data:`COMFORT_DT` grid ``t``."""

    t: np.ndarray
    lon_accel: np.ndarray
    lat_accel: np.ndarray
    jerk: np.ndarray  # derivative of the acceleration magnitude, as nuPlan's ego_jerk
    lon_jerk: np.ndarray
    yaw_rate: np.ndarray
    yaw_accel: np.ndarray

    def within_bounds(self) -> np.ndarray:
        """Per sample: all six signals strictly within nuPlan's bounds."""
        return ((self.lon_accel > MIN_LON_ACCEL) & (self.lon_accel < MAX_LON_ACCEL)
                & (np.abs(self.lat_accel) < MAX_ABS_LAT_ACCEL) & (np.abs(self.jerk) < MAX_ABS_MAG_JERK)
                & (np.abs(self.lon_jerk) < MAX_ABS_LON_JERK) & (np.abs(self.yaw_rate) < MAX_ABS_YAW_RATE)
                & (np.abs(self.yaw_accel) < MAX_ABS_YAW_ACCEL))


def savgol(y: np.ndarray, window: int, order: int, dt: float, deriv: int = 0) -> np.ndarray:
    """Savitzky-Golay smoothing / derivative of a uniformly sampled signal, like ``scipy.signal.savgol_filter`` with
    ``mode="interp"``: a least-squares polynomial over each window, evaluated at the sample itself (an even window
    spans ``window // 2`` samples before it; scipy would evaluate it half a sample off), with the first/last window's
    fit evaluated at the edges."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    window = min(window, n)
    if order >= window:
        raise ValueError(f"polynomial order {order} needs more than {window} samples")
    # One least-squares operator per position k of the evaluated sample inside its window.
    powers = np.arange(order + 1)
    scale = math.factorial(deriv) / dt**deriv
    operators = np.empty((window, window))
    for k in range(window):
        vandermonde = (np.arange(window, dtype=np.float64) - k)[:, None] ** powers
        operators[k] = np.linalg.pinv(vandermonde)[deriv] * scale if deriv <= order else 0.0
    idx = np.arange(n)
    start = np.clip(idx - window // 2, 0, n - window)
    windows = np.lib.stride_tricks.sliding_window_view(y, window)[start]
    return np.einsum("nw,nw->n", operators[idx - start], windows)


def comfort_signals(log: EpisodeLog) -> ComfortSignals:
    """nuPlan's comfort signals from the logged pose/speed trace, resampled to 10 Hz so the 8-sample smoothing
    window keeps nuPlan's 0.8 s span whatever the sim step. Each derivative is a Savitzky-Golay derivative of the
    previous smoothed signal; lateral acceleration is speed x yaw rate (rear-axle kinematics, as nuPlan's
    kinematic bicycle model)."""
    t = log.t
    if len(t) < 2 or t[-1] <= t[0]:
        empty = np.zeros(len(t))
        return ComfortSignals(t, empty, empty, empty, empty, empty, empty)
    grid = t[0] + COMFORT_DT * np.arange(int(math.floor((t[-1] - t[0]) / COMFORT_DT + 1e-9)) + 1)
    heading = np.interp(grid, t, np.unwrap(log.heading))
    speed = np.interp(grid, t, log.speed)
    if len(grid) <= SAVGOL_ORDER:
        empty = np.zeros(len(grid))
        return ComfortSignals(grid, empty, empty, empty, empty, empty, empty)

    def d(signal: np.ndarray) -> np.ndarray:
        return savgol(signal, SAVGOL_WINDOW, SAVGOL_ORDER, COMFORT_DT, deriv=1)

    yaw_rate = d(heading)
    lon_accel = d(speed)
    lat_accel = savgol(speed, SAVGOL_WINDOW, SAVGOL_ORDER, COMFORT_DT) * yaw_rate
    return ComfortSignals(
        t=grid, lon_accel=lon_accel, lat_accel=lat_accel, jerk=d(np.hypot(lon_accel, lat_accel)),
        lon_jerk=d(lon_accel), yaw_rate=yaw_rate, yaw_accel=d(yaw_rate))


def comfort(log: EpisodeLog) -> float:
    """Bench2Drive "Driving Smoothness" in percent: the share of consecutive 2 s segments (20 samples at 10 Hz; a
    trailing partial segment is dropped, an episode of at most one segment is judged whole) in which all six nuPlan
    ``ego_is_comfortable`` signals stay within bounds. Unlike Bench2Drive, which filters each segment on its own,
    the signals are smoothed over the whole episode so segment edges add no filter artefacts. Traces too short to
    differentiate (< 3 samples at 10 Hz) score 100."""
    ok = comfort_signals(log).within_bounds()
    if len(ok) <= SAVGOL_ORDER:
        return 100.0
    if len(ok) <= COMFORT_SEGMENT:
        return 100.0 * float(ok.all())
    segments = ok[: len(ok) // COMFORT_SEGMENT * COMFORT_SEGMENT].reshape(-1, COMFORT_SEGMENT)
    return 100.0 * float(segments.all(axis=1).mean())


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EpisodeScore:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def is_success(route_completion_pct: float, events: Iterable[InfractionEvent]) -> bool:
    """Bench2Drive success: the route is completed and no infraction other than min speed was committed."""
    return route_completion_pct >= 100.0 - RC_TOLERANCE and all(e.kind is Infraction.MIN_SPEED for e in events)


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
        infractions=dict(counts), forward_calls_per_token=log.forward_calls_per_token)


# ---------------------------------------------------------------------------------------------------------------
# statistics


def bootstrap_ci(values: Sequence[float] | np.ndarray, level: float = 0.9, n: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap of the mean at confidence ``level``; NaNs for no values."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    means = v[np.random.default_rng(seed).integers(0, v.size, size=(n, v.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    mean = float(v.mean())
    # Clamp so a degenerate resample distribution never reports an interval that excludes the point estimate.
    return mean, float(min(lo, mean)), float(max(hi, mean))


def paired_difference_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = 0.9,
                         n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean of a - b, lo, hi) over matched episodes (same scenario and seed, same order): bootstrap of the paired
    differences, which removes the between-scenario variance both planners share."""
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_.shape != b_.shape:
        raise ValueError(f"paired samples differ in shape: {a_.shape} vs {b_.shape}")
    return bootstrap_ci(a_ - b_, level=level, n=n, seed=seed)


def _mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def _median(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _totals(group: list[EpisodeScore], level: float, n: int, seed: int) -> dict[str, Any]:
    ds, ds_lo, ds_hi = bootstrap_ci([s.driving_score for s in group], level=level, n=n, seed=seed)
    count = len(group)
    return {
        "episodes": count,
        "ds": ds, "ds_lo": ds_lo, "ds_hi": ds_hi,
        "sr": 100.0 * sum(s.success for s in group) / count,
        "rc": float(np.mean([s.route_completion for s in group])),
        "penalty": float(np.mean([s.infraction_penalty for s in group])),
        "collisions_per_ep": sum(s.collisions for s in group) / count,
        "at_fault_per_ep": sum(s.at_fault_collisions for s in group) / count,
        "rear_ended_per_ep": sum(s.rear_ended for s in group) / count,
        "offlane_m": float(np.mean([s.offlane_m for s in group])),
        "comfort": float(np.mean([s.comfort for s in group])),
        # Episodes keep only their own latency statistics: report their mean / median across episodes.
        "latency_mean_ms": _ms(_mean(s.plan_latency_mean_s for s in group)),
        "latency_p50_ms": _ms(_median(s.plan_latency_p50_s for s in group)),
        "latency_p90_ms": _ms(_median(s.plan_latency_p90_s for s in group)),
        "forward_calls_per_token": _mean(s.forward_calls_per_token for s in group),
        "end_reasons": dict(sorted(_count(s.end_reason for s in group).items())),
    }


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for item in items:
        out[item] += 1
    return dict(out)


def summarize(scores: Sequence[EpisodeScore], level: float = 0.9, n: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Bench2Drive-style totals, JSON-ready.

    ``groups``: per (planner, mode) -- episodes, DS mean with its bootstrap CI, SR %, RC, penalty, collisions /
    at-fault / rear-ended per episode, comfort, latency (ms) and ``per_scenario_ds``. ``per_scenario``: the same
    totals per (scenario, planner, mode). ``paired``: for every two planners in one mode, the DS difference over the
    episodes both ran (matched by scenario and seed) with its paired bootstrap CI."""
    by_group: dict[tuple[str, str], list[EpisodeScore]] = defaultdict(list)
    by_scenario: dict[tuple[str, str, str], list[EpisodeScore]] = defaultdict(list)
    for s in scores:
        by_group[(s.planner, s.mode)].append(s)
        by_scenario[(s.scenario, s.planner, s.mode)].append(s)
    groups = []
    for (planner, mode), group in sorted(by_group.items()):
        per_scenario: dict[str, list[float]] = defaultdict(list)
        for s in group:
            per_scenario[s.scenario].append(s.driving_score)
        groups.append({"planner": planner, "mode": mode, **_totals(group, level, n, seed),
                       "per_scenario_ds": {k: float(np.mean(v)) for k, v in sorted(per_scenario.items())}})
    scenarios = [{"scenario": scenario, "planner": planner, "mode": mode, **_totals(group, level, n, seed)}
                 for (scenario, planner, mode), group in sorted(by_scenario.items())]
    paired = []
    modes = sorted({mode for _, mode in by_group})
    for mode in modes:
        planners = sorted(p for p, m in by_group if m == mode)
        for i, a in enumerate(planners):
            for b in planners[i + 1:]:
                ds_a = {(s.scenario, s.seed): s.driving_score for s in by_group[(a, mode)]}
                ds_b = {(s.scenario, s.seed): s.driving_score for s in by_group[(b, mode)]}
                keys = sorted(ds_a.keys() & ds_b.keys())
                if not keys:
                    continue
                diff, lo, hi = paired_difference_ci([ds_a[k] for k in keys], [ds_b[k] for k in keys],
                                                    level=level, n=n, seed=seed)
                paired.append({"mode": mode, "a": a, "b": b, "episodes": len(keys),
                               "ds_diff": diff, "ds_diff_lo": lo, "ds_diff_hi": hi})
    return {"level": level, "groups": groups, "per_scenario": scenarios, "paired": paired}
