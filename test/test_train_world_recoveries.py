"""Tests for wamdiff_training.world.recoveries and ``wamdiff-train data recoveries``: the ego lands off-centre clear of
traffic,
the expert's label steers back to the lane centre, the export is deterministic and carries its placement, bad
settings are refused, and the training mix files these frames under ``plan/recovery``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.world.expert import Expert
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_training.world import recoveries as rc
from wamdiff_training.world.dataset import main
from wamdiff_training.world.demonstrations import DatasetError

SCENARIOS = load_scenarios()


@pytest.mark.parametrize("offset,heading", [(0.9, 0.0), (-0.7, 0.05), (0.3, -0.06)])
def test_displace_ego_puts_the_ego_off_centre_and_off_the_lane_direction(offset, heading):
    world = World(SCENARIOS.get("highway"), 3, SCENARIOS)
    start = world.progress_m
    rc.displace_ego(world, 1, 12.0, offset, heading)
    lane = world.ego.lane
    s, lat = lane.local_coordinates(world.ego.position)
    assert world.ego.lane_index[2] == 1
    assert lat == pytest.approx(-offset)  # highway-env: positive lateral is right
    assert world.ego_pose.heading - (-lane.heading_at(s)) == pytest.approx(heading)  # world frame is mirrored
    assert world.progress_m == pytest.approx(start + 12.0, abs=0.5)  # the route bookkeeping moved with it


def test_the_expert_label_steers_back_to_the_lane_centre():
    for offset in (-1.0, 0.8):
        world = World(SCENARIOS.get("highway"), 0, SCENARIOS)
        rc.displace_ego(world, 1, 0.0, offset, 0.0)
        world.road.vehicles = [world.ego]  # lane keeping only
        y = Expert(world).plan().waypoints[:, 1]
        assert y[-1] == pytest.approx(-offset, abs=0.1)  # back on the centre line
        assert np.all(np.diff(y) * np.sign(-offset) >= -1e-6)  # monotonically towards it


@pytest.mark.parametrize("scenario", ["highway", "merge", "roundabout", "intersection"])
def test_placements_stay_in_bounds_clear_of_traffic_and_repeat_per_seed(scenario):
    config = rc.RecoveryConfig()
    spec = SCENARIOS.get(scenario)
    made = [rc.recovery_frame(spec, 400_000 + k, SCENARIOS, config) for k in range(4)]
    assert sum(m is not None for m in made) >= 3
    for frame, p in filter(None, made):
        assert abs(p.offset_m) <= config.max_offset_m and abs(p.heading_rad) <= config.max_heading_rad
        assert 0.0 <= p.along_m <= config.ahead_m
        assert frame.image.ndim == 3 and frame.image.dtype == np.uint8 and frame.index == 0
        assert fmt.parse_waypoints(fmt.format_waypoints(frame.waypoints)).valid
    world = World(spec, 400_001, SCENARIOS)
    p = rc.place(world, np.random.default_rng(0), config)
    assert p is not None
    others = [v for v in world.road.vehicles if v is not world.ego]
    assert all(np.linalg.norm(np.asarray(v.position) - world.ego.position) >= config.clearance_m for v in others)
    again = rc.recovery_frame(spec, 400_001, SCENARIOS, config)
    first = rc.recovery_frame(spec, 400_001, SCENARIOS, config)
    assert again[1] == first[1] and np.array_equal(again[0].waypoints, first[0].waypoints)


def test_a_placement_that_never_clears_traffic_gives_up():
    world = World(SCENARIOS.get("highway"), 0, SCENARIOS)
    before = world.ego.position.copy()
    crowded = rc.RecoveryConfig(clearance_m=1e6, attempts=3)
    assert rc.place(world, np.random.default_rng(0), crowded) is None
    assert np.array_equal(world.ego.position, before)  # left where it was


def test_bad_settings_and_seed_ranges_are_refused():
    with pytest.raises(DatasetError, match="out of range"):
        rc.RecoveryConfig(max_offset_m=2.5)
    with pytest.raises(DatasetError, match="out of range"):
        rc.RecoveryConfig(attempts=0)
    assert rc.recovery_seed("val", 5, 2) == SPLIT_SEED_BASE["val"] + rc.RECOVERY_SEED_BASE + 7
    with pytest.raises(DatasetError, match="seed range"):
        rc.recovery_seed("train", 99_999, 1)
    with pytest.raises(DatasetError, match="unknown split"):
        rc.recovery_seed("dev", 0, 0)


def test_cli_exports_plan_frames_with_their_placement_deterministically(tmp_path, capsys):
    out = tmp_path / "rec"
    args = ["recoveries", "--scenarios", "highway,merge", "--samples", "3", "--out", str(out), "--no-progress",
            "--preview", "2"]
    assert main(args) == 0
    assert "recovery samples" in capsys.readouterr().out
    records = json.loads((out / "train.json").read_text())
    assert 5 <= len(records) <= 6 and {r["meta"]["scenario"] for r in records} == {"highway", "merge"}
    for r in records:
        assert r["task"] == "plan" and (out / r["image"]).is_file()
        p = r["meta"]["recovery"]
        assert abs(p["offset_m"]) <= rc.MAX_OFFSET_M and abs(p["heading_rad"]) <= rc.MAX_HEADING_RAD
        assert fmt.parse_waypoints(r["conversations"][1]["value"]).valid
        assert r["conversations"][0]["value"] == fmt.plan_prompt(fmt.Command(r["meta"]["command"]),
                                                                  r["meta"]["velocity"], r["meta"]["acceleration"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["seeds"] == [rc.RECOVERY_SEED_BASE, rc.RECOVERY_SEED_BASE + 2]
    assert manifest["recovery"]["max_offset_m"] == rc.MAX_OFFSET_M
    assert (out / "preview.png").stat().st_size > 0

    assert main(args) == 2  # a non-empty --out is not overwritten silently
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--workers", "2"]) == 0  # the same frames whatever the worker count
    assert json.loads((out / "train.json").read_text()) == records


@pytest.mark.parametrize("extra,message", [(["--samples", "0"], "--samples"), (["--split", "dev"], "--split"),
                                           (["--max-offset", "3"], "out of range"),
                                           (["--seed-offset", "99999"], "seed range")])
def test_cli_refuses_bad_settings_before_writing(tmp_path, capsys, extra, message):
    out = tmp_path / "rec"
    argv = ["recoveries", "--samples", "2", "--out", str(out), "--no-progress", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
