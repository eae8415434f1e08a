"""Frozen scenario definitions (``scenarios_v<N>.yaml``, package data): loading and validation."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

KINDS = ("highway", "merge", "roundabout", "intersection")
EXITS = ("right", "straight", "left")
DEFAULT_VERSION = 1
SPLIT_SEED_BASE = {"train": 0, "val": 500_000, "test": 1_000_000}  # episode i of split s uses seed base[s] + i
SEEDS_PER_SPLIT = 500_000  # so splits never share an episode


class ScenarioError(ValueError):
    """A scenario file or name is invalid; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    name: str
    kind: str
    duration_s: float
    desired_speed: float
    ego_speed: float
    target_distance_m: float = 0.0  # highway / merge: the route's length from the start
    exit_distance_m: float = 0.0  # roundabout / intersection: how far past the exit the route ends
    exits: tuple[str, ...] = ()
    ego_start_m: float = 0.0
    ego_lane: int = 0
    lanes: int = 3
    stop_line: bool = False  # intersection: a stop line at the junction entry; entering without a full stop there
    traffic: dict = field(default_factory=dict)  # is a stop infraction (Leaderboard's RunningStopTest)


@dataclass(frozen=True, slots=True)
class ScenarioSet:
    version: int
    sim_hz: int
    blocked_s: float
    deviation_m: float
    wrong_lane_s: float
    scenarios: dict[str, ScenarioSpec]
    source: str

    def get(self, name: str) -> ScenarioSpec:
        if name not in self.scenarios:
            raise ScenarioError(f"{self.source}: no scenario {name!r}; known: {', '.join(self.scenarios)}")
        return self.scenarios[name]

    def select(self, names: str | list[str] | None) -> list[ScenarioSpec]:
        """``None`` / ``"all"`` -> every scenario; otherwise a list or a comma-separated string of names."""
        if names is None or names == "all" or names == ["all"]:
            return list(self.scenarios.values())
        if isinstance(names, str):
            names = [n for n in names.split(",") if n]
        return [self.get(n.strip()) for n in names]


def _spec(name: str, raw: dict, source: str) -> ScenarioSpec:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: scenario {name!r} must be a mapping")
    known = set(ScenarioSpec.__slots__) - {"name"}
    unknown = set(raw) - known
    if unknown:
        raise ScenarioError(f"{source}: scenario {name!r} has unknown field(s) {sorted(unknown)}")
    for key in ("kind", "duration_s", "desired_speed", "ego_speed"):
        if key not in raw:
            raise ScenarioError(f"{source}: scenario {name!r} lacks {key!r}")
    if raw["kind"] not in KINDS:
        raise ScenarioError(f"{source}: scenario {name!r}: kind must be one of {KINDS}, got {raw['kind']!r}")
    exits = tuple(raw.get("exits", ()))
    if raw["kind"] in ("roundabout", "intersection") and (not exits or set(exits) - set(EXITS)):
        raise ScenarioError(f"{source}: scenario {name!r}: exits must be a non-empty subset of {EXITS}")
    if raw["kind"] in ("highway", "merge") and float(raw.get("target_distance_m", 0)) <= 0:
        raise ScenarioError(f"{source}: scenario {name!r}: target_distance_m must be > 0")
    if raw.get("stop_line") and raw["kind"] != "intersection":
        raise ScenarioError(f"{source}: scenario {name!r}: stop_line is for intersections only")
    if float(raw["ego_speed"]) < 0 or float(raw["desired_speed"]) <= 0:
        raise ScenarioError(f"{source}: scenario {name!r}: ego_speed must be >= 0 and desired_speed > 0")
    traffic = raw.get("traffic", {}) or {}
    for key, needs in (("queue", ("vehicles", "first_gap_m", "gap_m", "release_s", "stagger_s", "speed")),
                       ("stop_and_go", ("gap_m", "speed", "brake_after_s", "decel", "stand_s", "cycles"))):
        if key in traffic:
            if raw["kind"] != "highway":
                raise ScenarioError(f"{source}: scenario {name!r}: traffic.{key} is for the straight road (highway)")
            missing = [k for k in needs if k not in (traffic[key] or {})]
            if missing:
                raise ScenarioError(f"{source}: scenario {name!r}: traffic.{key} lacks {missing}")
    if float(raw["duration_s"]) <= 0:
        raise ScenarioError(f"{source}: scenario {name!r}: duration_s must be > 0")
    return ScenarioSpec(name=name, **{**raw, "exits": exits})


def load_scenarios(path: str | Path | None = None, version: int = DEFAULT_VERSION) -> ScenarioSet:
    """The frozen set shipped with the package (``version``), or a user's file at ``path``; a ``path`` of the form
    ``v<N>`` that is not a file names frozen set N (``--scenario-file v2``)."""
    if path is not None and re.fullmatch(r"v\d+", str(path)) and not Path(path).exists():
        path, version = None, int(str(path)[1:])
    if path is None:
        ref = resources.files("wamdiff_ros.world") / f"scenarios_v{version}.yaml"
        if not ref.is_file():
            raise ScenarioError(f"no frozen scenario set version {version} (scenarios_v{version}.yaml)")
        text, source = ref.read_text(), f"scenarios_v{version}.yaml"
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ScenarioError(f"{source}: cannot read the scenario file: {exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("scenarios"), dict):
        raise ScenarioError(f"{source}: expected a mapping with a 'scenarios' mapping")
    try:
        return ScenarioSet(
            version=int(raw["version"]), sim_hz=int(raw["sim_hz"]), blocked_s=float(raw["blocked_s"]),
            deviation_m=float(raw["deviation_m"]), wrong_lane_s=float(raw["wrong_lane_s"]),
            scenarios={n: _spec(n, s, source) for n, s in raw["scenarios"].items()}, source=source,
        )
    except KeyError as exc:
        raise ScenarioError(f"{source}: missing top-level field {exc.args[0]!r}") from exc
