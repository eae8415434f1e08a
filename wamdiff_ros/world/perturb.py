"""Deployment perturbations in the CPU world, after Bench2Drive-Robust (Thinklab-SJTU, arXiv 2605.18059, code
``Thinklab-SJTU/Bench2Drive-Robust`` at ae1b586: ``leaderboard/leaderboard/envs/sensor_interface_with_perturbations/``
and ``autoagents/agent_wrapper.py``). They act outside the planner, between the world and what the agent reads
or does, as Bench2Drive-Robust's act between CARLA and an unchanged agent; ``run_episode`` applies them
(``LoopConfig.perturb``), ``wamdiff-eval closed-loop --perturb NAME[=SEVERITY],...`` switches them on.

Each has two severities. Severity 1 is Bench2Drive-Robust's own default (what its environment variables give when
only the perturbation is enabled), where that perturbs; severity 2 a level its paper evaluates. Time is counted in
the world's ticks (``sim_hz`` = 20, Bench2Drive's rate), as Bench2Drive-Robust counts them.

- ``frame_drop`` (cached burst frame drop): on each tick outside a burst a burst starts with probability ``p``
  (``BURST_PROBABILITY`` 0.01) and lasts ``D + 1`` ticks, the trigger tick included, with ``D`` uniform in
  2..``max_ticks`` (``BURST_MAX_TICKS``: 5 by default; the paper's "Burst 20" as severity 2). Meanwhile the camera
  delivers the last image from before the burst again, under the new time: nothing marks it as stale.
- ``occlusion`` (partial observation): every frame, one axis-aligned rectangle of ``ratio`` × height by ``ratio`` ×
  width at a random place, redrawn per frame: blurred (``PARTIAL_OBS_TYPE=blur``, ``RATIO=0.3``: OpenCV's 31 × 31
  Gaussian, σ = 5 px) or black (the paper's occlusion at 0.5).
- ``gnss`` (GPS localisation noise): every reading of the ego position gets independent N(0, σ²) noise on each
  axis, σ = 5 m (``GPS_DRIFT_MODE=medium``) or 15 m (severe); no random walk, no bias; heading (compass / IMU) is
  untouched. In this world the agent reads its position for the route points it plans with and for following its
  plans (``WaypointFollower``'s pose), so both see the noise.
- ``speed`` (multiplicative speed noise): every speed reading is multiplied by a fresh draw of N(mean, std²),
  unclipped: N(1.0, 0.1²) (``SPEED_BIAS_MEAN``/``STD`` defaults) or N(0.5, 0.2²) (the paper's under-estimation, as a
  summary of it reports; not checked against its text). The planner's ego velocity and the follower's speed see it.
- ``latency`` (compute -> control latency): controls reach the actuator ``d = int(ms × sim_hz / 1000)`` ticks late
  through a FIFO, zero control (no acceleration, straight wheels) until the first one arrives: the paper's
  a_exec(t) = a(t - d) at 100 ms (severity 1; ``INFERENCE_LATENCY_MS`` defaults to 0, off) or 200 ms. (Its code
  holds each command for d ticks and calls the agent every d ticks; this FIFO keeps the agent's own rate.)

Every perturbation draws from its own generator, seeded by the episode seed and its name, so adding one does not
change another's draws and an episode is reproducible.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from wamdiff_ros.geometry import Pose2D

NAMES = ("frame_drop", "occlusion", "gnss", "speed", "latency")
SEVERITIES = (1, 2)

# name -> (severity 1, severity 2) parameters; where each number comes from is in the module docstring.
LEVELS: dict[str, tuple[dict, dict]] = {
    "frame_drop": ({"p": 0.01, "max_ticks": 5}, {"p": 0.01, "max_ticks": 20}),
    "occlusion": ({"ratio": 0.3, "fill": "blur"}, {"ratio": 0.5, "fill": "black"}),
    "gnss": ({"sigma_m": 5.0}, {"sigma_m": 15.0}),
    "speed": ({"mean": 1.0, "std": 0.1}, {"mean": 0.5, "std": 0.2}),
    "latency": ({"ms": 100.0}, {"ms": 200.0}),
}
BLUR_SIGMA_PX = 5.0  # OpenCV's GaussianBlur((31, 31), 0): sigma = 0.3 * ((31 - 1) / 2 - 1) + 0.8


@dataclass(frozen=True, slots=True)
class Perturbation:
    name: str
    severity: int = 1

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"perturbation {self.name!r}: expected one of {', '.join(NAMES)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"perturbation {self.name}: severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def params(self) -> dict:
        return dict(LEVELS[self.name][self.severity - 1])

    def __str__(self) -> str:
        return f"{self.name}={self.severity}"


def parse_perturbations(text: str | Iterable[str] | None) -> tuple[Perturbation, ...]:
    """``"frame_drop=2,latency"`` -> (Perturbation("frame_drop", 2), Perturbation("latency", 1)); "" / "none" / None
    -> (). Each name at most once."""
    if text is None:
        return ()
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    items = [t for t in items if t and t != "none"]
    out: list[Perturbation] = []
    for item in items:
        name, _, severity = item.partition("=")
        try:
            level = int(severity) if severity else 1
        except ValueError:
            raise ValueError(f"perturbation {item!r}: severity must be 1 or 2") from None
        out.append(Perturbation(name.strip(), level))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"perturbations: each name at most once, got {text!r}")
    return tuple(out)


def label(perturbations: Iterable[Perturbation]) -> str:
    """"clean" or "frame_drop=1+latency=2": the report's name for a cell."""
    items = [str(p) for p in perturbations]
    return "+".join(items) if items else "clean"


def _rng(seed: int, name: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "little")
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, salt])


class FrameDrop:
    """The camera stream's burst state, one step per tick (``tick``); ``frozen`` while a burst lasts."""

    def __init__(self, p: float, max_ticks: int, rng: np.random.Generator) -> None:
        if not 0.0 <= p <= 1.0 or max_ticks < 2:
            raise ValueError(f"frame_drop: p in [0, 1] and max_ticks >= 2, got {p}, {max_ticks}")
        self.p, self.max_ticks, self._rng = p, max_ticks, rng
        self._left = 0  # ticks of the current burst still to come
        self.frozen_ticks = self.ticks = self.bursts = 0

    def starts_next(self) -> bool:
        """Draw whether the coming tick starts a burst (only outside one): the caller keeps the image of now as the
        one the burst repeats."""
        if self._left > 0:
            return False
        if self._rng.random() < self.p:
            self._left = int(self._rng.integers(2, self.max_ticks + 1)) + 1  # the trigger tick is dropped too
            self.bursts += 1
            return True
        return False

    def tick(self) -> bool:
        """Advance one tick; whether its camera frame is a repeat."""
        self.ticks += 1
        if self._left > 0:
            self._left -= 1
            self.frozen_ticks += 1
            return True
        return False


class Perturber:
    """One episode's perturbations: ``run_episode`` asks it, tick by tick, what the agent reads (camera frame, pose,
    speed) and what reaches the actuator. Counters (``stats``) say what it did."""

    def __init__(self, perturbations: Iterable[Perturbation], seed: int, sim_hz: float) -> None:
        self.perturbations = tuple(perturbations)
        by_name = {p.name: p.params for p in self.perturbations}
        self._drop = FrameDrop(**by_name["frame_drop"], rng=_rng(seed, "frame_drop")) if "frame_drop" in by_name else None
        self._occlusion = by_name.get("occlusion")
        self._gnss = by_name.get("gnss")
        self._speed = by_name.get("speed")
        latency = by_name.get("latency")
        self.delay_ticks = int(latency["ms"] * sim_hz / 1000.0) if latency else 0
        self._rngs = {name: _rng(seed, name) for name in ("occlusion", "gnss", "speed")}
        self._fifo: deque = deque([(0.0, 0.0)] * self.delay_ticks)
        self._cached = None  # the image a burst repeats
        self._frozen = False
        self._stats = {"frames": 0, "repeated_frames": 0, "occluded_frames": 0}

    @property
    def active(self) -> bool:
        return bool(self.perturbations)

    @property
    def perturbs_pose(self) -> bool:
        return self._gnss is not None

    @property
    def stats(self) -> dict:
        """Frames the agent read, of them repeats (a burst's) and occluded; camera ticks, frozen ticks and bursts."""
        out = dict(self._stats)
        if self._drop is not None:
            out.update(camera_ticks=self._drop.ticks, frozen_ticks=self._drop.frozen_ticks, bursts=self._drop.bursts)
        return out

    # camera ---------------------------------------------------------------------------------------------------
    def before_tick(self, render) -> None:
        """Call once per tick before the world steps, with ``render()`` giving the camera frame of now: draws whether
        the next tick starts a burst, and keeps this frame for it."""
        if self._drop is not None and self._drop.starts_next() and not self._frozen:
            self._cached = render()  # (during a burst the cache already is the last image delivered)

    def after_tick(self) -> None:
        """Call once per tick after the world stepped: the camera stream moves on."""
        if self._drop is not None:
            self._frozen = self._drop.tick()

    def camera(self, render):
        """The frame the agent reads now: ``render()``'s, or during a burst the cached one; then occluded."""
        self._stats["frames"] += 1
        if self._frozen and self._cached is not None:
            self._stats["repeated_frames"] += 1
            frame = self._cached
        else:
            frame = render()
        if self._occlusion is not None and frame is not None:
            frame = type(frame)(self._occlude(frame.image), frame.boxes)
            self._stats["occluded_frames"] += 1
        return frame

    def _occlude(self, image: np.ndarray) -> np.ndarray:
        h, w = image.shape[:2]
        ratio = self._occlusion["ratio"]
        ph, pw = int(h * ratio), int(w * ratio)
        rng = self._rngs["occlusion"]
        top, left = int(rng.integers(0, h - ph + 1)), int(rng.integers(0, w - pw + 1))
        out = image.copy()
        if self._occlusion["fill"] == "black":
            out[top:top + ph, left:left + pw] = 0
        else:
            patch = Image.fromarray(np.ascontiguousarray(image[top:top + ph, left:left + pw]))
            out[top:top + ph, left:left + pw] = np.asarray(patch.filter(ImageFilter.GaussianBlur(BLUR_SIGMA_PX)))
        return out

    # ego state ------------------------------------------------------------------------------------------------
    def pose(self, pose: Pose2D) -> Pose2D:
        """One reading of the ego pose (draw once per tick and share it)."""
        if self._gnss is None:
            return pose
        dx, dy = self._rngs["gnss"].normal(0.0, self._gnss["sigma_m"], 2)
        return Pose2D(pose.x + float(dx), pose.y + float(dy), pose.heading)

    def speed_factor(self) -> float:
        """One reading's multiplicative speed error (draw once per tick; 1.0 without the perturbation)."""
        if self._speed is None:
            return 1.0
        return float(self._rngs["speed"].normal(self._speed["mean"], self._speed["std"]))

    # actuation ------------------------------------------------------------------------------------------------
    def actuate(self, command: tuple[float, float]) -> tuple[float, float]:
        """What reaches the actuator this tick: ``command`` ``delay_ticks`` ticks late (FIFO)."""
        if self.delay_ticks == 0:
            return command
        self._fifo.append(command)
        return self._fifo.popleft()
