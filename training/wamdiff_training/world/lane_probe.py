"""Does a planner see where it is in its lane? ``wamdiff-train probe lane``.

The ego is placed on the empty straight motorway of the ``highway`` scenario at a chosen offset from its lane centre
and a chosen heading error, the front camera renders the scene, and the planner and the privileged expert each plan
from it. The expert steers back to the lane centre, so its sideways waypoint ``y`` at 2 s spans metres across the
cases; a planner that reads the lane from the image does the same. The summary is the least-squares **gain** of the
planner's ``y`` on the expert's (1: it corrects as the expert does, 0: blind to its pose in the lane), their
correlation, the mean absolute gap, and the share of clear cases (the expert's ``|y| >= 0.5 m``) whose side agrees.

``vision_probe`` asks the complementary question of the vision tower alone: a ridge regression from its image
features (all merged tokens, flattened) to the offset and heading error, R² on held-out frames. Features that encode
the pose while the plans ignore it locate the loss in the language side, not the camera.

Signs follow the ego frame of ``wamdiff_ros.format``: a positive offset is left of the lane centre, a positive
heading error points left of the lane direction. The road is emptied so that only lane keeping is asked: the
expert's own choices (overtaking, yielding) never enter the reference.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.world.closed_loop import ClosedLoopPlanner, Observation
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.scenarios import ScenarioSet, load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.world.recoveries import displace_ego

OFFSETS_M = (-1.0, -0.5, 0.0, 0.5, 1.0)  # lane keeping: the expert changes lanes from about 1.5 m
HEADINGS_RAD = (-0.05, 0.0, 0.05)
LANES = (0, 1, 2)  # highway-env lane ids of the 3-lane motorway
ALONG_M = (0.0, 6.0)  # shifts along the road: dashed markings at two phases
WAYPOINT = 4  # 1-based: the waypoint at 2 s
CLEAR_M = 0.5


class LaneProbeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ProbeCase:
    lane: int
    along_m: float
    offset_m: float
    heading_rad: float


@dataclass(frozen=True, slots=True)
class ProbeRow:
    case: ProbeCase
    expert_y: float  # sideways position of the expert's waypoint WAYPOINT (ego frame, m)
    planner_y: float | None  # None: the planner's answer was invalid

    def to_json(self) -> dict:
        return {**asdict(self.case), "expert_y": round(self.expert_y, 3),
                "planner_y": None if self.planner_y is None else round(self.planner_y, 3)}


def cases(offsets=OFFSETS_M, headings=HEADINGS_RAD, lanes=LANES, along=ALONG_M) -> list[ProbeCase]:
    out = [ProbeCase(int(lane), float(s), float(o), float(h))
           for lane, s, o, h in itertools.product(lanes, along, offsets, headings)]
    if not out:
        raise LaneProbeError("no probe cases: give at least one lane, shift, offset and heading")
    return out


def place(case: ProbeCase, scenarios: ScenarioSet | None = None) -> World:
    """A fresh ``highway`` world with only the ego, placed as ``case`` asks (its speed is the scenario's)."""
    scenarios = scenarios or load_scenarios()
    spec = scenarios.get("highway")
    world = World(spec, 0, scenarios)
    if not 0 <= case.lane < spec.lanes:
        raise LaneProbeError(f"lane {case.lane}: the highway scenario has lanes 0..{spec.lanes - 1}")
    if abs(case.offset_m) > 2.0 or abs(case.heading_rad) > 0.3:
        raise LaneProbeError(f"offset {case.offset_m} m / heading {case.heading_rad} rad: keep |offset| <= 2 m "
                             "(inside the lane) and |heading| <= 0.3 rad")
    displace_ego(world, case.lane, case.along_m, case.offset_m, case.heading_rad)
    world.road.vehicles = [world.ego]
    world.road.objects = []
    return world


def plan_both(planner: ClosedLoopPlanner, world: World, camera: CameraConfig,
              command: fmt.Command = fmt.Command.FOLLOW):
    """The expert's waypoints and the planner's ``PlanResult`` from one placed world (its camera frame rendered)."""
    frame = FrontCamera(world.geometry, camera).render(world.ego_pose, world.others())
    expert = np.asarray(Expert(world).plan().waypoints)
    planner.reset(world)
    obs = Observation(frame, world.ego_velocity(), world.ego_acceleration(), command, world)
    return expert, planner.plan(obs, route=world.route_points())


def gain_and_correlation(expert: np.ndarray, planner: np.ndarray) -> tuple[float | None, float | None]:
    """Least-squares slope of centred ``planner`` values on centred ``expert`` ones, and their correlation (0 when
    the planner's do not vary); (None, None) when the expert's do not vary."""
    de, dp = np.asarray(expert, np.float64), np.asarray(planner, np.float64)
    if not float(de @ de) > 0:
        return None, None
    correlation = float(de @ dp / math.sqrt(de @ de * (dp @ dp))) if dp @ dp > 0 else 0.0
    return round(float(de @ dp / (de @ de)), 3), round(correlation, 3)


def probe(planner: ClosedLoopPlanner, probe_cases: list[ProbeCase], scenarios: ScenarioSet | None = None,
          camera: CameraConfig | None = None, progress=None) -> list[ProbeRow]:
    """Each case once: the expert's and the planner's sideways waypoint ``WAYPOINT`` from the same state."""
    scenarios = scenarios or load_scenarios()
    camera = camera or CameraConfig()
    rows = []
    for case in probe_cases:
        expert, result = plan_both(planner, place(case, scenarios), camera)
        rows.append(ProbeRow(case, float(expert[WAYPOINT - 1, 1]),
                             float(result.waypoints[WAYPOINT - 1, 1]) if result.valid else None))
        if progress is not None:
            progress()
    return rows


def summarize(rows: list[ProbeRow]) -> dict:
    """Gain (least-squares slope of planner y on expert y), correlation, mean |gap|, side agreement on clear cases."""
    valid = [r for r in rows if r.planner_y is not None]
    out = {"cases": len(rows), "valid": len(valid), "gain": None, "correlation": None, "mean_abs_gap_m": None,
           "side_agreement": None, "clear_cases": 0}
    if not valid:
        return out
    e = np.array([r.expert_y for r in valid])
    p = np.array([r.planner_y for r in valid])
    out["gain"], out["correlation"] = gain_and_correlation(e - e.mean(), p - p.mean())
    out["mean_abs_gap_m"] = round(float(np.abs(e - p).mean()), 3)
    clear = np.abs(e) >= CLEAR_M
    out["clear_cases"] = int(clear.sum())
    if clear.any():
        out["side_agreement"] = round(float((np.sign(p[clear]) == np.sign(e[clear])).mean()), 3)
    return out


def image_features(bundle, image: np.ndarray) -> np.ndarray:
    """The vision tower's features of one camera image: all merged tokens, flattened (float64)."""
    import torch

    processed = bundle.image_processor(images=[image], return_tensors="pt")
    model = bundle.model
    with torch.no_grad():
        out = model.model.get_image_features(processed["pixel_values"].to(model.device, model.dtype),
                                             processed["image_grid_thw"].to(model.device), return_dict=True)
    return out.pooler_output[0].float().flatten().cpu().numpy().astype(np.float64)


def ridge_r2(features: np.ndarray, targets: np.ndarray, ridge: float = 10.0, held_out: float = 0.3,
             seed: int = 0) -> tuple[np.ndarray, int]:
    """Held-out R² per target column of a ridge regression (standardised features) fitted on the other frames, and
    how many frames were held out."""
    x, y = np.asarray(features, np.float64), np.asarray(targets, np.float64).reshape(len(features), -1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(round(len(x) * (1.0 - held_out)))
    fit, test = order[:cut], order[cut:]
    mean, std = x[fit].mean(0), x[fit].std(0) + 1e-6
    x = (x - mean) / std
    a = x[fit]
    weights = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ (y[fit] - y[fit].mean(0)))
    pred = x[test] @ weights + y[fit].mean(0)
    r2 = 1.0 - ((pred - y[test]) ** 2).sum(0) / np.maximum(((y[test] - y[test].mean(0)) ** 2).sum(0), 1e-12)
    return r2, len(test)


def vision_r2(bundle, worlds, targets, camera: CameraConfig, ridge: float = 10.0, held_out: float = 0.3,
              seed: int = 0) -> tuple[list[float], int, int]:
    """``ridge_r2`` from the vision features of each placed world's camera frame to its row of ``targets``: the R²
    per target (3 decimals), the frame count and the held-out count."""
    feats = [image_features(bundle, FrontCamera(w.geometry, camera).render(w.ego_pose, w.others()).image)
             for w in worlds]
    r2, test = ridge_r2(np.asarray(feats), np.asarray(targets), ridge, held_out, seed)
    return [round(float(v), 3) for v in r2], len(feats), test


def vision_probe(bundle, probe_cases: list[ProbeCase], scenarios: ScenarioSet | None = None,
                 camera: CameraConfig | None = None, ridge: float = 10.0, held_out: float = 0.3,
                 seed: int = 0) -> dict:
    """Held-out R² of a ridge regression from the vision tower's features (merged tokens, flattened) to the ego's
    offset and heading error, over ``probe_cases`` (give many: a few hundred)."""
    scenarios = scenarios or load_scenarios()
    if len(probe_cases) < 20:
        raise LaneProbeError(f"vision probe: {len(probe_cases)} cases is too few to fit and hold out (>= 20)")
    (offset, heading), frames, test = vision_r2(
        bundle, (place(c, scenarios) for c in probe_cases), [(c.offset_m, c.heading_rad) for c in probe_cases],
        camera or CameraConfig(), ridge, held_out, seed)
    return {"frames": frames, "held_out": test, "offset_r2": offset, "heading_r2": heading}


def random_cases(count: int, seed: int = 0, max_offset_m: float = 1.8, max_heading_rad: float = 0.08,
                 lanes=LANES, max_along_m: float = 30.0) -> list[ProbeCase]:
    """``count`` cases drawn uniformly (for the vision probe)."""
    rng = np.random.default_rng(seed)
    return [ProbeCase(int(rng.choice(lanes)), float(rng.uniform(0.0, max_along_m)),
                      float(rng.uniform(-max_offset_m, max_offset_m)),
                      float(rng.uniform(-max_heading_rad, max_heading_rad))) for _ in range(count)]
