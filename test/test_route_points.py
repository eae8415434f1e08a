"""The optional route points of the plan prompt (``fmt.route_line``; not in the paper's prompt), end to end: the world
computes them (``World.route_points``: straight ahead on a straight road, bending to a turn's side, one per route),
``wamdiff-train data generate / recoveries --route-points`` write them into every plan prompt (a counterfactual record
its own command's route), say so in the manifest and leave the prompts alone without the flag, a checkpoint records
whether it was trained with them (``DecodeMeta.route_points``), ``Planner.plan`` checks them, and the world's drivers
(closed loop, DAgger) are always given the world's route points. Small worlds and short episodes; each test runs in a
few seconds."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.errors import CheckpointError, InputError, RouteError
from wamdiff_ros.model import META_FILE, DecodeMeta, load_checkpoint, tiny_random
from wamdiff_ros.planner import EgoState, Plan, Planner
from wamdiff_ros.world.closed_loop import LoopConfig, ModelPlanner, Observation, PlanResult, run_episode
from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.world.scenarios import load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.checkpoint import save_checkpoint
from wamdiff_training.world.dataset import main
from wamdiff_training.world.demonstrations import NoiseConfig, RolloutConfig, rollout
from wamdiff_training.world.recoveries import displace_ego

try:
    import wamdiff_training  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

SET = load_scenarios()
QUIET = RolloutConfig(noise=NoiseConfig(fraction=0.0), questions_per_frame=0)
EGO = EgoState((5.0, 0.1), (0.2, 0.0))
ROUTE = np.array([[10.0, -0.77], [29.24, -4.17]])
ROUTE_LINE = "The route passes (010.00,-00.77) and (029.24,-04.17)"


def _line(prompt: str) -> str | None:
    return next((ln for ln in prompt.split("\n") if fmt.has_route_line(ln)), None)


def _seed(exit_direction: str) -> int:
    spec = SET.get("intersection")
    return next(s for s in range(50) if World(spec, s, SET).exit_direction == exit_direction)


# --------------------------------------------------------------------------------------------------------- the world
@pytest.mark.parametrize(("offset_m", "heading_rad"), [(0.0, 0.0), (0.8, 0.0), (-0.6, 0.05), (0.3, -0.08)])
def test_on_a_straight_road_the_points_lie_ahead_along_the_lane(offset_m, heading_rad):
    """Highway: the lane centre 10 m and 30 m ahead, seen from an ego ``offset_m`` left of it and turned
    ``heading_rad`` left of the lane: exactly (d cos h - o sin h, -d sin h - o cos h)."""
    world = World(SET.get("highway"), 0, SET)
    points = world.route_points()
    assert points.shape == (2, 2) and points.dtype == np.float64
    np.testing.assert_allclose(points, [[10.0, 0.0], [30.0, 0.0]], atol=1e-9)
    displace_ego(world, world.ego.lane_index[2], 20.0, offset_m, heading_rad)
    d, o, h = np.asarray(fmt.ROUTE_AHEAD_M), offset_m, heading_rad
    expected = np.stack([d * math.cos(h) - o * math.sin(h), -d * math.sin(h) - o * math.cos(h)], axis=1)
    np.testing.assert_allclose(world.route_points(), expected, atol=1e-6)


def test_near_the_end_of_the_route_the_points_stop_at_its_last_lane_end():
    world = World(SET.get("highway"), 0, SET)
    lane = world.ego.lane
    s0 = lane.local_coordinates(world.ego.position)[0]
    displace_ego(world, world.ego.lane_index[2], lane.length - s0 - 15.0, 0.0, 0.0)  # 15 m before the lane's end
    np.testing.assert_allclose(world.route_points(), [[10.0, 0.0], [15.0, 0.0]], atol=1e-6)


def test_at_an_intersection_each_route_bends_to_its_own_side():
    """A left-exit episode on the approach: far out all three routes run straight ahead; as the box nears, the own
    (left) route's far point swings left, the right alternative's right, the straight one's stays ahead."""
    spec = SET.get("intersection")
    ep = rollout(spec, _seed("left"), replace(QUIET, max_seconds=6.0, counterfactual_commands=True,
                                              route_points=True), SET)
    approach = [f for f in ep.frames if f.counterfactuals]
    assert approach and all(f.command == fmt.Command.LEFT for f in approach)
    assert all(f.route_points.keys() == {fmt.Command.LEFT, fmt.Command.RIGHT, fmt.Command.STRAIGHT} for f in approach)
    first, last = approach[0].route_points, approach[-1].route_points
    for points in first.values():
        np.testing.assert_allclose(points, [[10.0, 0.0], [30.0, 0.0]], atol=0.05)
    left, right, straight = (last[c] for c in (fmt.Command.LEFT, fmt.Command.RIGHT, fmt.Command.STRAIGHT))
    assert left[1, 1] > 5.0 and right[1, 1] < -5.0 and abs(straight[1, 1]) < 1.0
    assert len({fmt.route_line(p) for p in last.values()}) == 3  # three routes, three prompts
    # the world's own route is the left one; each alternative is what World.route_points gives for it
    world = World(spec, _seed("left"), SET)
    assert set(world.alternative_routes()) == {fmt.Command.RIGHT, fmt.Command.STRAIGHT}
    np.testing.assert_array_equal(world.route_points(), world.route_points(world.route))


@pytest.mark.parametrize("scenario", ["highway", "intersection"])
def test_the_published_route_polyline_gives_the_worlds_route_points(scenario):
    """What the ROS bridge publishes (``World.route_centre`` in the odometry frame) read back the node's way
    (``route_points_ahead`` from the ego pose) is ``World.route_points``, along the way into a junction. Not on the
    roundabout's entries: highway-env's sine lanes count metres along their straight axis, not along the curve, so
    there the world's 30 m point lies up to ~4.5 m further on than the polyline's."""
    from wamdiff_ros.route_points import ROUTE_PATH_M, route_points_ahead

    world = World(SET.get(scenario), _seed("left") if scenario == "intersection" else 0, SET)
    for _ in range(6):
        pose = world.ego_pose
        read = route_points_ahead(world.route_centre(ROUTE_PATH_M), (pose.x, pose.y), pose.heading)
        np.testing.assert_allclose(read, world.route_points(), atol=0.3)
        for _ in range(15):
            world.step(0.0, 0.0)


def test_the_points_are_the_session_38_prototypes():
    """Pinned: the lines the prototype (a monkey patch that exported train seeds 900.. with --counterfactual-commands)
    wrote for intersection train seed 900 (exit straight); frame 5 is perturbed. Data exported with it is compared
    with exports of this code, so the lane choice and the transform must not drift."""
    ep = rollout(SET.get("intersection"), 900, RolloutConfig(questions_per_frame=0, max_seconds=4.5,
                                                             counterfactual_commands=True, route_points=True), SET)
    pinned = {
        5: {"straight": "(009.97,-00.77) and (029.94,-01.89)", "right": "(009.97,-00.77) and (029.24,-04.17)",
            "left": "(009.97,-00.77) and (029.75,-00.24)"},
        8: {"straight": "(010.01,-00.39) and (030.00,-00.13)", "right": "(010.01,-00.39) and (021.82,-12.45)",
            "left": "(010.01,-00.39) and (025.17,009.76)"},
    }
    for index, lines in pinned.items():
        frame = ep.frames[index]
        got = {c.value: fmt.route_line(p).removeprefix("The route passes ") for c, p in frame.route_points.items()}
        assert got == lines, (index, got)
    assert ep.frames[5].perturbation is not None


# ------------------------------------------------------------------------------------------------------- the export
@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[bool, tuple[list[dict], dict]]:
    """One straight-exit intersection episode cut at 4 s, with counterfactual commands, with and without the flag."""
    out = {}
    for flag in (False, True):
        folder = tmp_path_factory.mktemp("route") / "set"
        args = ["generate", "--scenarios", "intersection", "--episodes", "1", "--max-seconds", "4", "--questions", "1",
                "--noise-fraction", "0", "--counterfactual-commands", "--out", str(folder), "--preview", "0",
                "--no-progress", *(["--route-points"] if flag else [])]
        assert main(args) == 0
        out[flag] = (json.loads((folder / "train.json").read_text()),
                     json.loads((folder / "manifest.json").read_text()))
    return out


def test_an_export_with_route_points_has_the_line_in_every_plan_prompt(exports):
    samples, manifest = exports[True]
    plans = [s for s in samples if s["task"] == "plan"]
    assert plans and any(s["meta"].get("counterfactual") for s in plans)
    assert manifest["route_points"] is True and manifest["splits"]["train"]["args"]["route_points"] is True
    for s in plans:
        m, prompt = s["meta"], s["conversations"][0]["value"]
        # the prompt is rebuilt byte for byte from the meta (the raw floats), the route line after the command
        assert prompt == fmt.plan_prompt(fmt.Command(m["command"]), m["velocity"], m["acceleration"],
                                         np.asarray(m["route_points"]))
        assert f"{fmt.Command(m['command']).phrase}\n{_line(prompt)}\n" in prompt
    for s in samples:
        if s["task"] != "plan":
            assert not fmt.has_route_line(s["conversations"][0]["value"]) and "route_points" not in s["meta"]


def test_counterfactual_records_carry_their_own_routes_points(exports):
    samples, _ = exports[True]
    by_frame: dict[str, dict[str, np.ndarray]] = {}
    for s in samples:
        if s["task"] == "plan":
            by_frame.setdefault(s["image"], {})[s["meta"]["command"]] = np.asarray(s["meta"]["route_points"])
    turning = [f for f in by_frame.values() if len(f) == 3 and f["right"][1, 1] < -3.0]
    assert turning  # late on the approach the right turn's far point lies to the right
    for f in turning:
        assert f["left"][1, 1] > 3.0 and abs(f["straight"][1, 1]) < 1.0  # the own route (straight) goes ahead


def test_without_the_flag_the_prompts_are_the_papers(exports):
    plain, manifest = exports[False]
    with_route, _ = exports[True]
    assert manifest["route_points"] is False
    assert [s["id"] for s in plain] == [s["id"] for s in with_route]
    for a, b in zip(plain, with_route):
        assert a["conversations"][1] == b["conversations"][1]  # the same answers
        prompt = a["conversations"][0]["value"]
        assert not fmt.has_route_line(prompt) and "route_points" not in a["meta"]
        if a["task"] == "plan":
            m = a["meta"]
            assert prompt == fmt.plan_prompt(fmt.Command(m["command"]), m["velocity"], m["acceleration"])
            assert prompt == b["conversations"][0]["value"].replace(_line(b["conversations"][0]["value"]) + "\n", "")
            assert {k: v for k, v in b["meta"].items() if k != "route_points"} == m
        else:
            assert a == b


def test_recoveries_with_route_points(tmp_path):
    out = tmp_path / "rec"
    assert main(["recoveries", "--scenarios", "highway", "--samples", "2", "--route-points", "--out", str(out),
                 "--no-progress", "--preview", "0"]) == 0
    samples = json.loads((out / "train.json").read_text())
    assert samples and json.loads((out / "manifest.json").read_text())["route_points"] is True
    for s in samples:
        m, p = s["meta"], s["meta"]["recovery"]
        assert s["conversations"][0]["value"] == fmt.plan_prompt(
            fmt.Command(m["command"]), m["velocity"], m["acceleration"], np.asarray(m["route_points"]))
        # the ego sits offset_m left of its lane centre, turned heading_rad left: the lane lies right and turns right
        (x1, y1), _ = m["route_points"]
        h, o = p["heading_rad"], p["offset_m"]
        assert x1 == pytest.approx(10.0 * math.cos(h) - o * math.sin(h), abs=1e-6)
        assert y1 == pytest.approx(-10.0 * math.sin(h) - o * math.cos(h), abs=1e-6)


def test_a_dagger_driver_gets_the_frames_own_route_points():
    calls: list[tuple[fmt.Command, np.ndarray]] = []

    class RouteDriver:
        name, needs_camera = "route_driver", True

        def reset(self, world) -> None:
            pass

        def plan(self, obs: Observation, route=None) -> PlanResult:
            calls.append((obs.command, np.asarray(route)))
            t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
            return PlanResult(np.concatenate([float(np.hypot(*obs.ego_velocity)) * t, 0.0 * t], axis=1))

    config = replace(QUIET, max_seconds=3.0, expert_share=0.0, route_points=True)
    ep = rollout(SET.get("intersection"), _seed("right"), config, SET, driver=RouteDriver())
    assert len(calls) == len(ep.frames) > 0
    for (command, route), frame in zip(calls, ep.frames):
        assert command == frame.command and np.array_equal(route, frame.route_points[frame.command])


# ---------------------------------------------------------------------------------------------- checkpoint metadata
def test_decode_meta_round_trips_route_points(tmp_path):
    shipped = json.loads((Path(__file__).resolve().parents[1] / "wamdiff_ros/assets/wamdiff-tiny" / META_FILE)
                         .read_text())
    assert shipped["route_points"] is True  # the shipped student was trained with the route line
    for flag in (True, False):
        bundle = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8, route_points=flag), hidden=64, layers=2)
        folder = save_checkpoint(bundle, tmp_path / f"ckpt_{flag}")
        assert json.loads((folder / META_FILE).read_text())["route_points"] is flag
        assert load_checkpoint(folder).meta == bundle.meta
    with pytest.raises(CheckpointError, match="route_points"):
        DecodeMeta(route_points="yes")


# ------------------------------------------------------------------------------------------------------- the planner
@pytest.fixture(scope="module")
def planner(tiny_bundle):
    return Planner(tiny_bundle, DecodeSettings(block_size=32, steps=8, schedule="static"))


@pytest.mark.parametrize(
    ("route", "message"),
    [(np.zeros((3, 2)), "shape"), (np.zeros(4), "shape"), (np.zeros((2, 3)), "shape"), ([[1.0, 2.0], [3.0]], "got"),
     ("ahead", "got"), ([[10.0, math.nan], [30.0, 0.0]], "finite"), ([[10.0, 0.0], [math.inf, 0.0]], "finite")],
)
def test_plan_rejects_a_malformed_route(planner, road_image, route, message):
    with pytest.raises(RouteError, match=message) as info:
        planner.plan(road_image, EGO, "left", route=route)
    assert info.value.field == "route" and isinstance(info.value, InputError)


# ----------------------------------------------------------------------------------------------------- the evaluator
class FakePlanner:
    """Records each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def plan(self, image, ego, command, **kwargs):
        self.calls.append({"command": command, **kwargs})
        t = np.arange(1, fmt.NUM_WAYPOINTS + 1)[:, None] * fmt.WAYPOINT_DT_S
        return Plan(np.concatenate([8.0 * t, 0.0 * t], axis=1).astype(np.float32), np.ones(fmt.NUM_WAYPOINTS),
                    valid=True)


def _observation(world: World) -> Observation:
    frame = FrontCamera(world.geometry, CameraConfig(width=96, height=48)).render(world.ego_pose, world.others())
    return Observation(frame, world.ego_velocity(), world.ego_acceleration(), world.command, world)


def test_the_evaluator_gives_the_planner_the_worlds_route_points():
    fake = FakePlanner()
    planner = ModelPlanner(fake)
    world = World(SET.get("intersection"), _seed("left"), SET)
    planner.plan(_observation(world), route=world.route_points())
    np.testing.assert_array_equal(fake.calls[-1]["route"], world.route_points())
    planner.plan(_observation(world))
    assert fake.calls[-1]["route"] is None  # the Planner, not the evaluator, decides what a missing route means
    # in a closed-loop episode: one route per plan, the world's at that instant
    spec = replace(SET.get("intersection"), duration_s=2.0)
    fake.calls.clear()
    run_episode(spec, _seed("left"), planner, LoopConfig(plan_hz=2.0, camera=CameraConfig(width=96, height=48)), SET)
    assert len(fake.calls) >= 4 and all(c["route"].shape == (2, 2) for c in fake.calls)
    assert all(c["command"] == fmt.Command.LEFT for c in fake.calls)


@pytest.mark.parametrize("flag", [False, True])
def test_a_run_saves_the_route_flag_of_its_exports_manifest(tmp_path, monkeypatch, flag):
    """End to end: an export with or without --route-points, one AR training step, a checkpoint whose metadata says
    what the export's manifest says, and a planner whose prompt then carries the route line or not."""
    from wamdiff_training import checkpoint
    from wamdiff_training.config import from_dict
    from wamdiff_training.engine import train
    from wamdiff_training.stages import STAGES

    out = tmp_path / "set"
    assert main(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "2", "--questions", "0",
                 *(["--route-points"] if flag else []), "--out", str(out), "--preview", "0", "--no-progress"]) == 0
    raw = {"data": {"train": [str(out / "train.json")]},
           "model": {"tiny": {"hidden": 64, "layers": 2}},
           "train": {"batch_size": 2, "steps": 1, "lr": 1e-3, "warmup": 0, "seed": 0},
           "out": {"dir": str(tmp_path / "run"), "checkpoint_every": 0, "keep": 0, "tensorboard": False}}
    train(from_dict(raw), STAGES["ar"], "ar", progress=False)
    folder = checkpoint.resolve("latest", tmp_path / "run")
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["route_points"] is flag and meta["format_version"] == fmt.FORMAT_VERSION
    planner = Planner.from_pretrained(str(folder))
    seen: list[str] = []
    monkeypatch.setattr(planner, "_run", lambda text, image, constraint, deadline=None, check=None:
                        seen.append(text) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        planner.plan(np.zeros((48, 96, 3), np.uint8), EGO, "left", route=ROUTE)
    assert _line(seen[0]) == (fmt.route_line(ROUTE) if flag else None)


def test_the_plan_cli_takes_route_points(capsys):
    from wamdiff_ros.cli import plan_main

    assert plan_main(["--command", "right", "--route", "10", "0", "30", "-4.5", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["waypoints"]) == 8
    assert plan_main(["--route", "10", "0", "nan", "1"]) != 0
    assert "route" in capsys.readouterr().err
