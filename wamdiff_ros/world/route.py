"""The ego's route through a highway-env road network: progress along it, and whether a position is on its lanes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from highway_env.road.lane import AbstractLane, StraightLane
from highway_env.road.road import RoadNetwork

from wamdiff_ros import format as fmt

ON_LANE_MARGIN_M = 0.5  # the ego's centre may be this far outside a lane border and still count as on it


@dataclass(slots=True)
class Route:
    """The ego's route as a sequence of road segments (from, to); progress is measured along lane 0 of each."""

    segments: list[tuple[str, str]]
    network: RoadNetwork
    start_m: float = 0.0
    target_m: float = 0.0
    command: fmt.Command = fmt.Command.FOLLOW
    command_from_m: float = math.inf  # the command is given between these two progress values
    command_to_m: float = math.inf
    junction_m: float = math.inf  # junction routes: the progress where the ring / the intersection box begins
    exit_m: float = math.inf  # ... and where the route leaves it (the ring's exit node; the end of the turn)
    offsets: list[float] = field(default_factory=list)
    lanes: list[AbstractLane] = field(default_factory=list)

    connectors: list[list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        total = 0.0
        for a, b in self.segments:
            self.offsets.append(total)
            total += self.network.graph[a][b][0].length
            self.lanes.extend(self.network.graph[a][b])
        # highway-env's junction lanes do not always meet (a roundabout exit starts ~4 m beside the ring's end):
        # the straight gap from each lane's end to the nearest lane start of the next segment counts as route
        for (a, b), (c, d) in zip(self.segments, self.segments[1:]):
            pairs = []
            for lane in self.network.graph[a][b]:
                end = lane.position(lane.length, 0.0)
                start = min((n.position(0.0, 0.0) for n in self.network.graph[c][d]),
                            key=lambda p: float(np.linalg.norm(p - end)))
                if np.linalg.norm(start - end) > 0.5:
                    pairs.append((end, start))
            self.connectors.append(pairs)

    def _on_connector(self, k: int, position: np.ndarray) -> bool:
        for a, b in self.connectors[k] if k < len(self.connectors) else ():
            ab = b - a
            u = float(np.clip((position - a) @ ab / (ab @ ab), 0.0, 1.0))
            if np.linalg.norm(position - (a + u * ab)) <= StraightLane.DEFAULT_WIDTH / 2:
                return True
        return False

    def segment_progress(self, k: int, position: np.ndarray) -> tuple[float, float]:
        """Progress (m) if ``position`` is on segment ``k``, and its distance to that segment's nearest lane (0 when
        on one)."""
        a, b = self.segments[k]
        lanes = self.network.graph[a][b]
        best = None
        for lane in lanes:
            s, r = lane.local_coordinates(position)
            d = max(abs(r) - lane.width_at(s) / 2 - ON_LANE_MARGIN_M, 0.0) + max(s - lane.length, 0.0) + max(-s, 0.0)
            if best is None or d < best[1]:
                best = (s / max(lane.length, 1e-6) * lanes[0].length, d)
        return self.offsets[k] + float(np.clip(best[0], 0.0, lanes[0].length)), best[1]

    def locate(self, k: int, position: np.ndarray) -> tuple[int, float, float]:
        """The segment among ``k``..``k + 2`` nearest to ``position`` (later wins ties), its progress and distance."""
        best = None
        for j in range(k, min(k + 3, len(self.segments))):
            p, d = self.segment_progress(j, position)
            if d > 0 and self._on_connector(j, position):
                d = 0.0
            if best is None or d <= best[2] + 1e-9:
                best = (j, p, d)
        return best

    def phase(self, progress_m: float) -> str:
        """Where ``progress_m`` lies on a junction route: ``approach``, ``junction`` (in the ring or the box, before
        the route leaves it) or ``exit``; ``""`` on a route without a junction."""
        if math.isinf(self.junction_m):
            return ""
        return "approach" if progress_m < self.junction_m else "junction" if progress_m < self.exit_m else "exit"

    def distance(self, position: np.ndarray) -> float:
        return min(lane.distance(position) for lane in self.lanes)

    def nearest_lane(self, k: int, position: np.ndarray) -> int:
        """The lane id of segment ``k`` whose centre line is laterally nearest to ``position``."""
        a, b = self.segments[k]
        lanes = self.network.graph[a][b]
        return min(range(len(lanes)), key=lambda i: abs(lanes[i].local_coordinates(position)[1]))

    def lane_sequence(self, k: int, lane_id: int) -> list[AbstractLane]:
        """Lanes along the route from segment ``k``: its lane ``lane_id`` (its last lane when it has fewer), then in
        each later segment the lane that starts nearest to where the previous one ends."""
        a, b = self.segments[k]
        lanes = [self.network.graph[a][b][min(lane_id, len(self.network.graph[a][b]) - 1)]]
        for a, b in self.segments[k + 1:]:
            end = lanes[-1].position(lanes[-1].length, 0.0)
            lanes.append(min(self.network.graph[a][b], key=lambda ln: np.linalg.norm(ln.position(0.0, 0.0) - end)))
        return lanes

    def centre_ahead(self, k: int, position: np.ndarray, distances) -> np.ndarray:
        """The centre of the route lane nearest ``position`` on segment ``k`` (``nearest_lane``), ``distances`` metres
        ahead of ``position`` along the route (``lane_sequence``), (N, 2) in the network's coordinates; a point past
        the route's end stays at the end of its last lane."""
        lanes = self.lane_sequence(k, self.nearest_lane(k, position))
        s0 = lanes[0].local_coordinates(position)[0]
        out = []
        for d in distances:
            s, i = s0 + d, 0
            while s > lanes[i].length and i + 1 < len(lanes):
                s -= lanes[i].length
                i += 1
            out.append(lanes[i].position(min(s, lanes[i].length), 0.0))
        return np.asarray(out)
