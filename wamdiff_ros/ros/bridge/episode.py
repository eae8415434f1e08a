"""One episode of the highway bridge as plain data, free of rclpy: what the bridge counts while it runs, and the
Bench2Drive score at its end (an ``EpisodeLog`` built from the world's trace as ``world/closed_loop.py`` does)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from wamdiff_ros.world.camera import FrontCamera
from wamdiff_ros.world.metrics import EpisodeLog, EpisodeScore, score_episode
from wamdiff_ros.world.sim import World
from wamdiff_ros.geometry import Pose2D

STOPPED = "stopped"  # end reason of an episode cut short by the bridge (max_sim_s), not by the world


@dataclass(slots=True)
class Episode:
    world: World
    camera: FrontCamera
    start_ns: int  # the simulation clock at the episode's t = 0
    wall_start: float = field(default_factory=time.monotonic)
    ticks: int = 0
    frames: int = 0
    plans_applied: int = 0
    forward_calls: int = 0
    new_tokens: int = 0
    latencies: list[float] = field(default_factory=list)  # wall s from a frame to its plan
    distance_m: float = 0.0

    def moved(self, before: Pose2D) -> None:
        after = self.world.ego_pose
        self.distance_m += math.hypot(after.x - before.x, after.y - before.y)

    def log(self, planner: str, mode: str) -> EpisodeLog:
        return self.world.episode_log(planner, mode, self.latencies,
                                      self.forward_calls / self.new_tokens if self.new_tokens else None, STOPPED)

    def result(self, planner: str, mode: str) -> tuple[EpisodeScore, dict]:
        """The score, and the score with the bridge's own numbers as one JSON-ready record."""
        score = score_episode(self.log(planner, mode))
        return score, {**score.to_json(), "sim_s": round(self.world.t, 3),
                       "wall_s": round(time.monotonic() - self.wall_start, 3), "distance_m": round(self.distance_m, 2),
                       "progress_m": round(float(self.world.trace["progress_m"][-1]), 2), "frames": self.frames,
                       "plans_applied": self.plans_applied}
