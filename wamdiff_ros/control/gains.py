"""Waypoint-follower gains, one set per world, read from ``wamdiff_ros/control_gains.yaml``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from wamdiff_ros.errors import GainsError

GAINS_PATH = Path(__file__).resolve().parents[1] / "control_gains.yaml"


@dataclass(frozen=True, slots=True)
class FollowerGains:
    """Every number the follower and the actuators use. Units are in the names; the PIDs are discrete like the
    reference agents' (integral = mean of the last ``*_window`` errors, derivative = error change per step), so
    they assume the follower steps at the world's control rate."""

    # Lateral: PID on the heading error to the aim point (rad) -> front-wheel angle (rad).
    lateral_kp: float
    lateral_ki: float
    lateral_kd: float
    lateral_window: int
    # Aim point distance: clip(lookahead_s * speed + lookahead_min_m, lookahead_min_m, lookahead_max_m).
    lookahead_s: float
    lookahead_min_m: float
    lookahead_max_m: float
    # Longitudinal: PID on the speed error (m/s) -> acceleration (m/s^2).
    speed_kp: float
    speed_ki: float
    speed_kd: float
    speed_window: int
    accel_feedforward: float  # weight of the plan's own acceleration added to the PID's
    max_accel_mps2: float
    max_decel_mps2: float  # positive; the deceleration a brake commands
    # Brake when the desired speed is below brake_speed_mps or the speed above brake_ratio x desired.
    brake_speed_mps: float
    brake_ratio: float
    max_steer_rad: float
    max_plan_age_s: float
    control_period_s: float  # nominal step, until the follower has measured one
    # Creep: stopped (< stopped_speed_mps) for creep_after_s while the plan wants to move (peak speed left in it
    # > creep_min_plan_speed_mps) but too slowly to leave the brake -> drive at creep_speed_mps for creep_s.
    stopped_speed_mps: float
    creep_after_s: float
    creep_s: float
    creep_speed_mps: float
    creep_min_plan_speed_mps: float
    # Each new plan is averaged with the earlier ones at the same instants, weight exp(-age / tau); 0 = off
    # (wamdiff_ros.control.blend).
    plan_blend_tau_s: float = 0.0
    # A known delay between the follower's command and the actuator acting on it (s; 0 = none): the follower
    # predicts where the car will be when its command acts (the commands still on their way, a kinematic bicycle of
    # wheelbase_m) and follows the plan there and then.
    actuation_delay_s: float = 0.0
    wheelbase_m: float = 2.9
    # CARLA only: throttle = throttle_per_mps2 x acceleration (<= max_throttle), brake = brake_per_mps2 x deceleration.
    throttle_per_mps2: float = 0.25
    max_throttle: float = 0.75
    brake_per_mps2: float = 0.125

    @classmethod
    def for_world(cls, world: str, path: Path = GAINS_PATH) -> FollowerGains:
        """The gains of ``world`` ("highway_env" | "carla") from the gains file."""
        table = yaml.safe_load(Path(path).read_text())
        if not isinstance(table, dict) or world not in table:
            worlds = ", ".join(sorted(table)) if isinstance(table, dict) else "none"
            raise GainsError(world, f"no gains for this world in {path}; worlds: {worlds}")
        return cls.from_dict(table[world], name=world)

    @classmethod
    def from_dict(cls, values: dict, name: str = "gains") -> FollowerGains:
        """Build from a mapping; every key without a default is required, unknown keys are errors."""
        if not isinstance(values, dict):
            raise GainsError(name, f"expected a mapping of gains, got {type(values).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in values:
            if key not in fields:
                raise GainsError(f"{name}.{key}", f"unknown gain; known: {', '.join(fields)}")
        kwargs: dict[str, float | int] = {}
        for key, f in fields.items():
            if key not in values:
                if f.default is dataclasses.MISSING:
                    raise GainsError(f"{name}.{key}", "missing")
                continue
            kwargs[key] = _number(f"{name}.{key}", values[key], integer=f.type == "int")
        gains = cls(**kwargs)
        gains._check(name)
        return gains

    def lookahead_m(self, speed: float) -> float:
        """Aim distance (m) at ``speed`` (m/s)."""
        distance = self.lookahead_s * abs(speed) + self.lookahead_min_m
        return min(max(distance, self.lookahead_min_m), self.lookahead_max_m)

    def _check(self, name: str) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise GainsError(f"{name}.{f.name}", f"must be >= 0, got {getattr(self, f.name)}")
        for key in ("lateral_window", "speed_window", "control_period_s", "max_steer_rad", "brake_ratio", "wheelbase_m"):
            if getattr(self, key) <= 0:
                raise GainsError(f"{name}.{key}", f"must be > 0, got {getattr(self, key)}")
        for key in ("plan_blend_tau_s", "actuation_delay_s"):
            if not math.isfinite(getattr(self, key)):
                raise GainsError(f"{name}.{key}", f"must be finite, got {getattr(self, key)}")
        if self.lookahead_min_m > self.lookahead_max_m:
            raise GainsError(f"{name}.lookahead_max_m", f"below lookahead_min_m ({self.lookahead_min_m})")


def _number(key: str, value: object, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GainsError(key, f"expected a number, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise GainsError(key, f"expected a whole number, got {value!r}")
        return int(value)
    if math.isnan(value):
        raise GainsError(key, "is NaN")
    return float(value)
