"""Follower ``Control`` -> a world's actuator command. Plain floats only: no highway-env or carla imports."""

from __future__ import annotations

from wamdiff_ros.control.follower import Control
from wamdiff_ros.control.gains import FollowerGains


class HighwayEnvActuator:
    """-> (acceleration m/s^2, steering rad) in OUR convention (positive left); the world adapter mirrors it into
    highway-env's screen frame."""

    def __init__(self, gains: FollowerGains) -> None:
        self.gains = gains

    def __call__(self, control: Control) -> tuple[float, float]:
        g = self.gains
        acceleration = min(max(control.acceleration, -g.max_decel_mps2), g.max_accel_mps2)
        steering = min(max(control.steer, -g.max_steer_rad), g.max_steer_rad)
        return float(acceleration), float(steering)


class CarlaActuator:
    """-> (throttle in [0, max_throttle], steer in [-1, 1], brake in [0, 1]) for ``carla.VehicleControl``.

    CARLA steer = -front-wheel angle / max_steer_rad (CARLA's steer is positive RIGHT and normalised by the
    vehicle's maximum front-wheel angle). Throttle comes from positive acceleration, brake from negative
    acceleration or the brake flag (full brake); never both."""

    def __init__(self, gains: FollowerGains) -> None:
        self.gains = gains

    def __call__(self, control: Control) -> tuple[float, float, float]:
        g = self.gains
        steer = min(max(-control.steer / g.max_steer_rad, -1.0), 1.0)
        if control.brake:
            return 0.0, float(steer), 1.0
        if control.acceleration >= 0.0:
            return float(min(control.acceleration * g.throttle_per_mps2, g.max_throttle)), float(steer), 0.0
        return 0.0, float(steer), float(min(-control.acceleration * g.brake_per_mps2, 1.0))
