"""Does a planner slow down for the traffic ahead? ``wamdiff-train probe lead``.

The ego is placed on the straight motorway of the ``highway`` scenario, in a chosen lane at a chosen speed, and a
row of slower cars is placed a chosen gap ahead: one car in every lane, so that no lane change gets round it and the
only answer is to brake. A case without a row (``gap_m`` None) is the control. The front camera renders the scene and
the planner and the privileged expert each plan from it, with the command ``follow``.

What is compared is the **slow-down**: how far the plan's waypoint at 2 s (``WAYPOINT``) falls short of where the
current speed, held, would take the ego (``speed x 2 s - x4``, metres; 0 for a plan that keeps its speed). The 2 s
point is what the follower acts on (a new plan comes every 0.2-0.5 s), and at motorway speed it stays clear of the
4 s point's 100 m, where a number written digit by digit can slip by tens of metres. The expert brakes hard for a
near row, a little for a far one and not at all on an empty road; a planner that sees the row from the camera does
the same, and one that copies its speed from the telemetry does not (the copycat failure of imitation learning). The
expert also brakes harder from a higher speed, so the slow-downs are compared **within** each lane and speed (each
centred on its group's mean over the gaps): what is left varies with the row alone, which only the camera shows.
The summary is the least-squares **gain** of the planner's centred slow-down on the expert's (1: it brakes for the
row as the expert does, 0: blind to it), their correlation, the mean absolute gap, the **brake recall** (of the cases where the expert
slows by at least ``BRAKE_M``, the share where the planner does too) and the **false brakes** (the same share on the
other cases).

``vision_probe`` asks the vision tower alone: a ridge regression from its image features to the row's distance,
R² on held-out frames. A tower that encodes the distance while the plans ignore it locates the loss in the language
side, not the camera.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.world.camera import CameraConfig
from wamdiff_ros.world.closed_loop import ClosedLoopPlanner
from wamdiff_ros.world.scenarios import ScenarioSet, load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.world.lane_probe import gain_and_correlation, plan_both, vision_r2
from wamdiff_training.world.recoveries import displace_ego

LANES = (0, 1, 2)  # highway-env lane ids of the 3-lane motorway
GAPS_M = (10.0, 20.0, 35.0, 50.0, None)  # centre to centre, along the lane; None: no row (the control)
EGO_SPEEDS = (20.0, 26.0)  # m/s: the highway scenario starts at 24 and wants 28
ROW_SPEED = 14.0  # m/s: the scenario's slow lead (14-17 m/s)
ROW_STAGGER_M = 3.0  # the cars beside the ego's lane stand this much further ahead (a row, not a wall)
WAYPOINT = 4  # 1-based: the waypoint at 2 s
HORIZON_S = WAYPOINT * fmt.WAYPOINT_DT_S
BRAKE_M = 2.0  # a slow-down of at least this (a constant 1 m/s^2 over the 2 s) counts as braking


class LeadProbeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class LeadCase:
    lane: int
    gap_m: float | None
    ego_speed: float
    row_speed: float = ROW_SPEED


@dataclass(frozen=True, slots=True)
class LeadRow:
    case: LeadCase
    expert_slowdown: float  # m: the case's speed x 2 s minus the expert's x at waypoint WAYPOINT
    planner_slowdown: float | None  # None: the planner's answer was invalid

    def to_json(self) -> dict:
        return {**asdict(self.case), "expert_slowdown_m": round(self.expert_slowdown, 3),
                "planner_slowdown_m": None if self.planner_slowdown is None else round(self.planner_slowdown, 3)}


def cases(lanes=LANES, gaps=GAPS_M, speeds=EGO_SPEEDS, row_speed: float = ROW_SPEED) -> list[LeadCase]:
    out = [LeadCase(int(lane), None if gap is None else float(gap), float(v), float(row_speed))
           for lane, gap, v in itertools.product(lanes, gaps, speeds)]
    if not out:
        raise LeadProbeError("no probe cases: give at least one lane, gap and ego speed")
    return out


def place(case: LeadCase, scenarios: ScenarioSet | None = None) -> World:
    """A fresh ``highway`` world with the ego in ``case.lane`` at ``case.ego_speed`` and, unless ``gap_m`` is None, a
    row of cars at ``row_speed`` ``gap_m`` ahead (the ego's lane) and ``gap_m + ROW_STAGGER_M`` (the others)."""
    scenarios = scenarios or load_scenarios()
    spec = scenarios.get("highway")
    if not 0 <= case.lane < spec.lanes:
        raise LeadProbeError(f"lane {case.lane}: the highway scenario has lanes 0..{spec.lanes - 1}")
    if case.gap_m is not None and not 8.0 <= case.gap_m <= 120.0:
        raise LeadProbeError(f"gap {case.gap_m} m: keep it within 8..120 m (a car length apart, inside the camera's "
                             "useful range), or None for no row")
    if not 0.0 < case.ego_speed <= 40.0 or not 0.0 <= case.row_speed <= 40.0:
        raise LeadProbeError(f"speeds {case.ego_speed} / {case.row_speed} m/s: the ego's within (0, 40], the row's "
                             "within [0, 40]")
    world = World(spec, 0, scenarios)
    displace_ego(world, case.lane, 0.0, 0.0, 0.0)
    world.ego.speed = case.ego_speed
    world.road.vehicles = [world.ego]
    world.road.objects = []
    if case.gap_m is not None:
        a, b, _ = world.ego.lane_index
        s0 = world.road.network.get_lane((a, b, case.lane)).local_coordinates(world.ego.position)[0]
        for lane in range(spec.lanes):
            ahead = case.gap_m + (0.0 if lane == case.lane else ROW_STAGGER_M)
            world.road.vehicles.append(world._idm((a, b, lane), s0 + ahead, case.row_speed))
    return world


def slowdown(waypoints: np.ndarray, speed: float) -> float:
    """How far waypoint ``WAYPOINT`` falls short of ``speed`` held until then (m; negative: the plan speeds up)."""
    return float(speed * HORIZON_S - float(np.asarray(waypoints)[WAYPOINT - 1, 0]))


def probe(planner: ClosedLoopPlanner, probe_cases: list[LeadCase], scenarios: ScenarioSet | None = None,
          camera: CameraConfig | None = None, progress=None) -> list[LeadRow]:
    """Each case once: the expert's and the planner's slow-down from the same state."""
    scenarios = scenarios or load_scenarios()
    camera = camera or CameraConfig()
    rows = []
    for case in probe_cases:
        expert, result = plan_both(planner, place(case, scenarios), camera)
        rows.append(LeadRow(case, slowdown(expert, case.ego_speed),
                            slowdown(result.waypoints, case.ego_speed) if result.valid else None))
        if progress is not None:
            progress()
    return rows


def _centred(values: np.ndarray, groups: list) -> np.ndarray:
    out = np.asarray(values, np.float64).copy()
    for g in set(groups):
        members = [k for k, h in enumerate(groups) if h == g]
        out[members] -= out[members].mean()
    return out


def summarize(rows: list[LeadRow]) -> dict:
    """Gain (least-squares slope of the planner's slow-down on the expert's, both centred within each lane, ego speed
    and row speed), correlation, mean |gap|, brake recall and false brakes (``BRAKE_M``; uncentred)."""
    valid = [r for r in rows if r.planner_slowdown is not None]
    out = {"cases": len(rows), "valid": len(valid), "gain": None, "correlation": None, "mean_abs_gap_m": None,
           "braking_cases": 0, "brake_recall": None, "false_brakes": None}
    if not valid:
        return out
    e = np.array([r.expert_slowdown for r in valid])
    p = np.array([r.planner_slowdown for r in valid])
    groups = [(r.case.lane, r.case.ego_speed, r.case.row_speed) for r in valid]
    out["gain"], out["correlation"] = gain_and_correlation(_centred(e, groups), _centred(p, groups))
    out["mean_abs_gap_m"] = round(float(np.abs(e - p).mean()), 3)
    brakes, planner_brakes = e >= BRAKE_M, p >= BRAKE_M
    out["braking_cases"] = int(brakes.sum())
    if brakes.any():
        out["brake_recall"] = round(float(planner_brakes[brakes].mean()), 3)
    if (~brakes).any():
        out["false_brakes"] = round(float(planner_brakes[~brakes].mean()), 3)
    return out


def random_cases(count: int, seed: int = 0, gaps_m: tuple[float, float] = (8.0, 80.0), lanes=LANES) -> list[LeadCase]:
    """``count`` cases with a row at a uniform gap (for the vision probe; the speed does not enter the image)."""
    rng = np.random.default_rng(seed)
    return [LeadCase(int(rng.choice(lanes)), float(rng.uniform(*gaps_m)), EGO_SPEEDS[0]) for _ in range(count)]


def vision_probe(bundle, probe_cases: list[LeadCase], scenarios: ScenarioSet | None = None,
                 camera: CameraConfig | None = None, ridge: float = 10.0, held_out: float = 0.3,
                 seed: int = 0) -> dict:
    """Held-out R² of a ridge regression from the vision tower's features to the row's gap and to its inverse (the
    closeness, which braking follows), over ``probe_cases`` with a row (give many: a few hundred)."""
    scenarios = scenarios or load_scenarios()
    with_row = [c for c in probe_cases if c.gap_m is not None]
    if len(with_row) < 20:
        raise LeadProbeError(f"vision probe: {len(with_row)} cases with a row is too few to fit and hold out (>= 20)")
    (gap, inverse), frames, test = vision_r2(bundle, (place(c, scenarios) for c in with_row),
                                             [(c.gap_m, 1.0 / c.gap_m) for c in with_row], camera or CameraConfig(),
                                             ridge, held_out, seed)
    return {"frames": frames, "held_out": test, "gap_r2": gap, "inverse_gap_r2": inverse}
