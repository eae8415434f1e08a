"""Comfort as Bench2Drive's "Driving Smoothness" measures it, on nuPlan's ``ego_is_comfortable`` bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from wamdiff_ros.world.metrics import EpisodeLog


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
