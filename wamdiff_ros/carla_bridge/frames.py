"""CARLA's frames -> ours, stated once (stdlib only, Python 3.7 syntax).

CARLA (Unreal) is left-handed: x forward / east, y right / south, z up; yaw in degrees, clockwise seen from above;
a camera's pitch is positive nose-up; steer is positive right. Ours (``wamdiff_ros.world.types``) is right-handed:
world x east, y north, heading counter-clockwise in radians; ego x forward, y left. So, the one conversion:

    x = x_carla,  y = -y_carla,  heading = -radians(yaw_carla);  ego acceleration (a_x, a_y) = (a_x_carla, -a_y_carla)

Sensors, as the leaderboard delivers them:
- compass (IMU, radians): 0 facing north (CARLA -y), pi/2 facing east (CARLA +x), i.e. compass = yaw + pi/2, so
  heading = pi/2 - compass.
- GNSS (lat, lon in degrees): CARLA <= 0.9.15 and the leaderboard's route GPS (``_location_to_gps``) put latitude
  increasing along CARLA -y, so north = our +y and the equirectangular projection below lands in our world frame
  (up to a translation). CARLA 0.9.16's own ``Map.transform_to_geolocation`` flips that sign; Bench2Drive runs
  0.9.15, whose sensor and route agree.
"""

from __future__ import annotations

import math
from typing import Tuple

EARTH_RADIUS_EQUA_M = 6378137.0  # CARLA's (geom/GeoLocation.cpp)


def wrap_angle(a: float) -> float:
    return (a + math.pi) % (2.0 * math.pi) - math.pi


def pose_from_carla(x: float, y: float, yaw_deg: float) -> Tuple[float, float, float]:
    """A CARLA location and yaw -> (x, y, heading) in our right-handed world frame."""
    return float(x), -float(y), wrap_angle(-math.radians(yaw_deg))


def heading_from_compass(compass_rad: float) -> float:
    return wrap_angle(math.pi / 2.0 - compass_rad)


def ego_acceleration_from_imu(ax: float, ay: float) -> Tuple[float, float]:
    """The IMU's accelerometer (CARLA sensor frame: x forward, y right) -> our ego frame (x forward, y left)."""
    return float(ax), -float(ay)


def camera_pitch_carla(pitch_down_deg: float) -> float:
    """Our camera pitch (positive down, ``CameraConfig.pitch_deg``) -> CARLA's sensor pitch (positive up)."""
    return -float(pitch_down_deg)


class GeoProjection(object):
    """Equirectangular projection around (lat0, lon0), as the reference agents do: metres east / north of the
    origin. Over a town (a few km) it differs from CARLA's Mercator by under 0.1 % in scale, which relative
    positions (route progress, ego motion between frames) do not notice."""

    def __init__(self, lat0: float, lon0: float) -> None:
        self.lat0, self.lon0 = float(lat0), float(lon0)
        self._north = EARTH_RADIUS_EQUA_M * math.pi / 180.0
        self._east = self._north * math.cos(math.radians(self.lat0))

    def to_local(self, lat: float, lon: float) -> Tuple[float, float]:
        return (float(lon) - self.lon0) * self._east, (float(lat) - self.lat0) * self._north
