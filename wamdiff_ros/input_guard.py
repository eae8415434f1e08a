"""The planner's answers to imperfect inputs (a frozen camera, a noisy pose, a biased speedometer), free of ROS and
torch: the node (``ros/node.py``) and the closed-loop world (``world/closed_loop.py``) share them, and the
perturbations of ``world/perturb.py`` measure them.

- ``RepeatedFrameGate``: a camera frame whose pixels repeat the last planned frame byte for byte, under a new
  stamp, while the car moves, is a frozen stream (Bench2Drive-Robust's cached burst frame drop; a stalled driver):
  it is not planned as new. A real sensor's noise makes two genuine frames differ; in a still scene seen from a car
  at rest, a repeat is what the world looks like, so it is planned.
- ``EgoStateFilter``: dead reckoning from the speed and heading, corrected by each position reading with a gain
  (time constant ``position_tau_s``); a reading further than ``jump_gate_m`` from the prediction is an implausible
  jump (counted) and pulls at most as far as the gate. The speedometer is smoothed (``speed_tau_s``) while its
  readings scatter (a clean one passes as read: smoothing lags a braking car) and checked
  against the positions: while the positions are consistent and the car moves, speed
  from the positions over ``scale_window_s`` over the measured speed gives the speedometer's scale; once it is off by
  more than ``scale_tolerance`` the estimate corrects for it (counted). Consistent: a quadratic fit of the positions
  over the window leaves a residual below ``consistent_m``, so GNSS noise of metres never sets a scale.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass

import numpy as np


class RepeatedFrameGate:
    """``repeated(image, speed)``: whether ``image`` repeats the last frame the gate let through while the car
    moves (``speed`` >= ``min_speed_mps``). Counters: ``frames``, ``repeated``."""

    def __init__(self, min_speed_mps: float = 0.5) -> None:
        if not min_speed_mps >= 0:
            raise ValueError(f"min_speed_mps must be >= 0, got {min_speed_mps}")
        self.min_speed_mps = min_speed_mps
        self._last: bytes | None = None
        self.frames = self.repeated_frames = 0

    @staticmethod
    def digest(image: np.ndarray) -> bytes:
        image = np.ascontiguousarray(image)
        return hashlib.blake2b(memoryview(image).cast("B"), digest_size=16,
                               person=repr(image.shape).encode()[:16]).digest()

    def repeated(self, image: np.ndarray, speed: float) -> bool:
        self.frames += 1
        digest = self.digest(image)
        if digest == self._last and abs(speed) >= self.min_speed_mps:
            self.repeated_frames += 1
            return True
        self._last = digest
        return False

    def reset(self) -> None:
        self._last = None


@dataclass(frozen=True, slots=True)
class EgoFilterSettings:
    position_tau_s: float = 0.5  # a reading's pull on the estimate (gain 1 - exp(-dt / tau) per reading)
    jump_gate_m: float = 2.0  # further than this from the prediction: an implausible jump, pulled by at most this
    speed_tau_s: float = 0.15  # speedometer smoothing, while it is noisy:
    noise_window_s: float = 0.5  # its readings' scatter about a line over this long ...
    noise_floor: float = 0.02  # ... above this share of the speed (at least of 1 m/s)
    scale_window_s: float = 2.0  # speed from displacement over this long ...
    consistent_m: float = 1.0  # ... trusted while the positions' residual about a quadratic fit stays below this
    min_scale_speed_mps: float = 2.0  # ... and the car moves at least this fast by the positions
    scale_tolerance: float = 0.15  # the speedometer is corrected once its scale is off by more than this
    scale_tau_s: float = 2.0  # how fast the scale estimate follows

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"EgoFilterSettings.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True)
class EgoEstimate:
    x: float
    y: float
    heading: float
    speed: float  # m/s along the heading, the speedometer's corrected and smoothed
    scale: float  # the speedometer's scale as estimated (1: none found or none applied)
    jump: bool  # this position reading was an implausible jump


class EgoStateFilter:
    """``update(t, x, y, heading, speed)`` -> ``EgoEstimate``, one call per reading. Counters: ``readings``,
    ``jumps``, ``scaled`` (readings whose speed was corrected), ``smoothed`` (readings found noisy and smoothed)."""

    def __init__(self, settings: EgoFilterSettings = EgoFilterSettings()) -> None:
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        self._state: tuple[float, float, float, float] | None = None  # t, x, y, speed
        self._raw: deque[tuple[float, float, float, float]] = deque()  # t, x, y, measured speed
        self._speeds: deque[tuple[float, float]] = deque()  # t, measured speed
        self._scale = 1.0
        self.readings = self.jumps = self.scaled = self.smoothed = 0

    def update(self, t: float, x: float, y: float, heading: float, speed: float) -> EgoEstimate:
        s = self.settings
        self.readings += 1
        if self._state is None or t <= self._state[0]:
            self._state = (t, x, y, speed)
            self._raw.clear()
            self._speeds.clear()
            self._raw.append((t, x, y, speed))
            return EgoEstimate(x, y, heading, speed, self._scale, False)
        t0, x0, y0, v0 = self._state
        dt = t - t0
        # predict: dead reckoning along the heading at the estimated speed
        px, py = x0 + v0 * dt * math.cos(heading), y0 + v0 * dt * math.sin(heading)
        ex, ey = x - px, y - py
        size = math.hypot(ex, ey)
        jump = size > s.jump_gate_m
        if jump:
            self.jumps += 1
            ex, ey = ex * s.jump_gate_m / size, ey * s.jump_gate_m / size
        gain = 1.0 - math.exp(-dt / s.position_tau_s)
        nx, ny = px + gain * ex, py + gain * ey
        # the speedometer's scale: speed from the positions (a quadratic fit over the window, whose residual says
        # whether the positions are consistent) against the measured speed over the same window
        self._raw.append((t, x, y, speed))
        while self._raw and t - self._raw[0][0] > s.scale_window_s:
            self._raw.popleft()
        span = t - self._raw[0][0]
        if span >= 0.9 * s.scale_window_s and len(self._raw) >= 5:
            raw = np.asarray(self._raw)
            tt = raw[:, 0] - raw[:, 0].mean()
            fx, fy = np.polyfit(tt, raw[:, 1], 2), np.polyfit(tt, raw[:, 2], 2)
            residual = np.concatenate([raw[:, 1] - np.polyval(fx, tt), raw[:, 2] - np.polyval(fy, tt)])
            moved = math.hypot(fx[1], fy[1])  # the fit's speed at the window's middle
            measured = float(raw[:, 3].mean())
            if float(np.sqrt(np.mean(residual ** 2))) < s.consistent_m and moved >= s.min_scale_speed_mps \
                    and measured > 0.1:
                follow = 1.0 - math.exp(-dt / s.scale_tau_s)
                self._scale += follow * (moved / measured - self._scale)
        scale = self._scale if abs(self._scale - 1.0) > s.scale_tolerance else 1.0
        self.scaled += scale != 1.0
        # smooth the speedometer only while it is noisy: its readings' scatter about a line over the last
        # ``noise_window_s`` above ``noise_floor``; a clean one passes as read (smoothing lags a braking car)
        self._speeds.append((t, speed))
        while self._speeds and t - self._speeds[0][0] > s.noise_window_s:
            self._speeds.popleft()
        noisy = False
        if len(self._speeds) >= 5:
            ts, vs = np.asarray(self._speeds).T
            fit = np.polyfit(ts - ts.mean(), vs, 1)
            scatter = float(np.std(vs - np.polyval(fit, ts - ts.mean())))
            noisy = scatter > s.noise_floor * max(abs(float(vs.mean())), 1.0)
        self.smoothed += noisy
        smooth = 1.0 - math.exp(-dt / s.speed_tau_s) if noisy else 1.0
        nv = v0 + smooth * (speed * scale - v0)
        self._state = (t, nx, ny, nv)
        return EgoEstimate(nx, ny, heading, nv, scale, jump)
