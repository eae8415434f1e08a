"""The shipped model's plans on fixed inputs stay byte-identical (a refactor must not change what the car does).

The inputs are frames of the bundled sample drive with their ego state, a command and the route (the drive's own
path ahead); the expected plans were recorded with ``python test/test_plan_regression.py --write``. Timings are
left out; everything else the plan carries (waypoints, confidences, text, validity, decode statistics) is compared.

The fixture holds the plans as the block decoder drafts them (recorded before reflection existed). With reflection
off they come out byte-identical; with it on (the default) every plan that passes the plan checker is untouched, in
tokens and forward calls, and the others are the ones reflection repairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BAG = ROOT / "wamdiff_ros" / "assets" / "sample_drive.mcap"
FIXTURE = Path(__file__).resolve().parent / "data" / "plan_regression.json"
IMAGE_TOPIC, ODOM_TOPIC = "/wamdiff_planner/input/image", "/wamdiff_planner/input/odometry"
FRAMES = tuple(range(0, 100, 4))  # 25 of the drive's 100 frames
COMMANDS = ("follow", "follow", "left", "follow", "right", "straight")
NO_ROUTE_EVERY = 5  # every fifth input plans without a route
VOLATILE_KEYS = ("vision_s", "prefill_s", "decode_s", "route")  # timings; the route state is checked on its own
REFLECTION_KEYS = ("edited_waypoints", "implausible")  # newer than the fixture: checked on their own
REFLECTION_STATS = ("reflect_rounds", "reflect_forwards")


def _frames() -> dict[int, np.ndarray]:
    from wamdiff_ros.ros.bags import read_messages, typestore

    store, images = typestore(), {}
    for k, (_, _, raw) in enumerate(read_messages(BAG, [IMAGE_TOPIC])):
        if k in FRAMES:
            msg = store.deserialize_cdr(raw, "sensor_msgs/msg/Image")
            images[k] = np.asarray(msg.data, dtype=np.uint8).reshape(msg.height, msg.width, 3)
    return images


def make_inputs() -> list[dict]:
    """Ego state and route of each frame from the bag's odometry: the velocity at the frame, the acceleration over
    the 0.5 s before it, and the route as the path the drive took from there (the route points 10 m / 30 m ahead)."""
    from wamdiff_ros.ros.bags import read_messages, typestore
    from wamdiff_ros.route_points import route_points_ahead

    store = typestore()
    odom = [store.deserialize_cdr(raw, "nav_msgs/msg/Odometry") for _, _, raw in read_messages(BAG, [ODOM_TOPIC])]
    xy = np.array([[o.pose.pose.position.x, o.pose.pose.position.y] for o in odom])
    yaw = np.array([2.0 * math.atan2(o.pose.pose.orientation.z, o.pose.pose.orientation.w) for o in odom])
    vel = np.array([[o.twist.twist.linear.x, o.twist.twist.linear.y] for o in odom])
    inputs = []
    for n, k in enumerate(FRAMES):
        i = 2 * k  # odometry at 20 Hz, frames at 10 Hz
        acc = (vel[i] - vel[max(i - 10, 0)]) / 0.5
        route = None
        if n % NO_ROUTE_EVERY != NO_ROUTE_EVERY - 1:
            ahead = np.vstack([xy[i:], xy[-1] + 60.0 * np.array([math.cos(yaw[-1]), math.sin(yaw[-1])])])
            route = np.round(route_points_ahead(ahead, xy[i], yaw[i]), 3).tolist()
        inputs.append({"frame": k, "velocity": np.round(vel[i], 3).tolist(), "acceleration": np.round(acc, 3).tolist(),
                       "command": COMMANDS[n % len(COMMANDS)], "route": route})
    return inputs


def plan_record(planner, image: np.ndarray, item: dict) -> dict:
    from wamdiff_ros.cli import plan_to_dict
    from wamdiff_ros.planner import EgoState

    ego = EgoState(tuple(item["velocity"]), tuple(item["acceleration"]))
    route = None if item["route"] is None else np.asarray(item["route"])
    record = plan_to_dict(planner.plan(image, ego, item["command"], route=route))
    assert record["stats"].get("route", "used" if route is not None else "missing") == ("missing" if route is None
                                                                                        else "used")
    for key in VOLATILE_KEYS:
        record["stats"].pop(key, None)
    return record


def draft_record(record: dict) -> tuple[dict, dict]:
    """``record`` without what reflection added, and what it added."""
    record = json.loads(json.dumps(record))
    added = {key: record.pop(key) for key in REFLECTION_KEYS}
    added.update({key: record["stats"].pop(key) for key in REFLECTION_STATS})
    return record, added


@pytest.fixture(scope="module")
def shipped_planner():
    from wamdiff_ros.planner import Planner

    return Planner.from_pretrained()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_shipped_plans_are_unchanged(shipped_planner):
    """Reflection off: every plan byte-identical to the fixture."""
    from wamdiff_ros.planner import Planner

    fixture = json.loads(FIXTURE.read_text())
    assert len(fixture["cases"]) >= 20
    images = _frames()
    drafting = Planner(shipped_planner.bundle, dataclasses.replace(shipped_planner.settings, reflect=False))
    for case in fixture["cases"]:
        got, added = draft_record(plan_record(drafting, images[case["input"]["frame"]], case["input"]))
        assert json.dumps(got, sort_keys=True) == json.dumps(case["plan"], sort_keys=True), case["input"]
        assert added["edited_waypoints"] == [] and added["reflect_forwards"] == 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_reflection_leaves_passing_plans_untouched(shipped_planner):
    """Reflection on (the default): a fixture plan that passes the plan checker comes out byte-identical with no extra
    forward; one that fails is repaired (edited) or flagged implausible."""
    from wamdiff_ros.plan_check import check_plan

    fixture = json.loads(FIXTURE.read_text())
    images = _frames()
    passing = 0
    for case in fixture["cases"]:
        item = case["input"]
        got, added = draft_record(plan_record(shipped_planner, images[item["frame"]], item))
        route = None if item["route"] is None else np.asarray(item["route"])
        fails = case["plan"]["valid"] and check_plan(np.asarray(case["plan"]["waypoints"]), item["velocity"], route)
        if not fails:
            passing += 1
            assert json.dumps(got, sort_keys=True) == json.dumps(case["plan"], sort_keys=True), item
            assert added == {"edited_waypoints": [], "implausible": "", "reflect_rounds": 0, "reflect_forwards": 0}
        else:
            assert added["edited_waypoints"] or added["implausible"], item
    assert passing >= 10


def main() -> int:
    if "--write" not in sys.argv[1:]:
        print("usage: python test/test_plan_regression.py --write  (records the shipped model's plans)")
        return 2
    from wamdiff_ros.planner import Planner

    planner, images = Planner.from_pretrained(), _frames()
    cases = [{"input": item, "plan": plan_record(planner, images[item["frame"]], item)} for item in make_inputs()]
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({"model": "wamdiff-tiny", "cases": cases}, indent=1, sort_keys=True) + "\n")
    valid = sum(c["plan"]["valid"] for c in cases)
    print(f"wrote {FIXTURE}: {len(cases)} plans, {valid} valid")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
