"""Road surfaces and markings as flat world-frame polygons, built once per map for the front camera.

Each lane strip becomes asphalt chunks (at most ``CHUNK_M`` long and ``CHUNK_TURN_DEG`` of turning, resampled every
``SEGMENT_TURN_DEG`` of turning so curves stay round), a kerb strip beyond each solid edge, solid lines, and dashes
measured along the lane centre. Polygons of one kind are padded to a common vertex count so a frame can transform
all of them with one numpy expression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wamdiff_ros.world.types import LINE_DASHED, LINE_SOLID, LaneStrip, RoadGeometry

CHUNK_M = 20.0
CHUNK_TURN_DEG = 30.0
SEGMENT_TURN_DEG = 3.0
MARKING_WIDTH_M = 0.15
DASH_ON_M, DASH_OFF_M = 3.0, 6.0
KERB_WIDTH_M = 1.0
STOP_LINE_WIDTH_M = 0.5
OVERLAP_M = 0.3  # surfaces run on past a lane's ends along its end tangents, so lanes that meet leave no seam

KERB_RGB = (150, 147, 138)
ASPHALT_RGB = (78, 78, 82)
MARKING_RGB = (236, 236, 230)


@dataclass(frozen=True, slots=True)
class PolygonLayer:
    """Flat polygons of one colour drawn in one pass: vertices (M, K, 2) padded by repeating the last vertex, and a
    bounding circle (centres (M, 2), radii (M,)) per polygon for culling."""

    vertices: np.ndarray
    centres: np.ndarray
    radii: np.ndarray
    rgb: tuple[int, int, int]
    outline: bool  # also draw the outline: closes seams between chunks, keeps far markings a pixel wide

    @classmethod
    def build(cls, polygons: list[np.ndarray], rgb: tuple[int, int, int], outline: bool) -> PolygonLayer:
        k = max((len(p) for p in polygons), default=3)
        verts = np.zeros((len(polygons), k, 2))
        for i, p in enumerate(polygons):
            verts[i, : len(p)] = p
            verts[i, len(p):] = p[-1]
        lo, hi = verts.min(axis=1), verts.max(axis=1)
        centres = (lo + hi) / 2.0
        radii = np.linalg.norm(verts - centres[:, None, :], axis=2).max(axis=1) if len(polygons) else np.zeros(0)
        return cls(verts, centres.reshape(-1, 2), radii, rgb, outline)


class _Centreline:
    """Arc length and accumulated turning of a lane's centre line, to place chunk and dash ends along it."""

    def __init__(self, centre: np.ndarray) -> None:
        seg = np.diff(centre, axis=0)
        heading = np.unwrap(np.arctan2(seg[:, 1], seg[:, 0]))
        self.s = np.concatenate([[0.0], np.cumsum(np.hypot(seg[:, 0], seg[:, 1]))])
        self.turn = np.concatenate([[0.0, 0.0], np.cumsum(np.abs(np.diff(heading)))])[: len(self.s)]

    @property
    def length(self) -> float:
        return float(self.s[-1])

    def split(self, a: float, b: float, max_len: float, max_turn: float) -> np.ndarray:
        """Arc lengths from a to b, spaced so no piece is longer than max_len or turns more than max_turn."""
        cost = self.s / max_len + self.turn / max_turn
        ca, cb = np.interp([a, b], self.s, cost)
        n = max(1, math.ceil(cb - ca - 1e-9))
        return np.interp(np.linspace(ca, cb, n + 1), cost, self.s)


def _ribbon(line: _Centreline, left: np.ndarray, right: np.ndarray, a: float, b: float) -> np.ndarray:
    """Polygon (2n, 2) between two border polylines (sampled like the centre line) over arc lengths [a, b]."""
    ss = line.split(a, b, 1e9, math.radians(SEGMENT_TURN_DEG))
    lx, ly = np.interp(ss, line.s, left[:, 0]), np.interp(ss, line.s, left[:, 1])
    rx, ry = np.interp(ss, line.s, right[:, 0]), np.interp(ss, line.s, right[:, 1])
    return np.concatenate([np.stack([lx, ly], axis=1), np.stack([rx, ry], axis=1)[::-1]])


def _strip(line: _Centreline, left: np.ndarray, right: np.ndarray, a: float, b: float) -> list[np.ndarray]:
    ends = line.split(a, b, CHUNK_M, math.radians(CHUNK_TURN_DEG))
    return [_ribbon(line, left, right, s0, s1) for s0, s1 in zip(ends[:-1], ends[1:])]


def _clean(lane: LaneStrip) -> LaneStrip | None:
    """The lane without repeated samples (they have no direction); None when fewer than two samples remain."""
    c = np.asarray(lane.centre, dtype=np.float64).reshape(-1, 2)
    w = np.broadcast_to(np.asarray(lane.width, dtype=np.float64).reshape(-1), (len(c),))
    keep = np.concatenate([[True], np.hypot(*np.diff(c, axis=0).T) > 1e-6]) if len(c) else np.zeros(0, bool)
    if keep.sum() < 2 or not np.isfinite(c).all():
        return None
    return LaneStrip(c[keep], w[keep].copy(), lane.left_line, lane.right_line)


def _run_on(points: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """The polyline with one more point OVERLAP_M before its start and after its end along the lane direction."""
    return np.concatenate([points[:1] - OVERLAP_M * direction[0], points, points[-1:] + OVERLAP_M * direction[1]])


def road_layers(road: RoadGeometry) -> tuple[PolygonLayer, PolygonLayer, PolygonLayer]:
    """(kerbs, asphalt, markings), to be drawn in that order: asphalt covers kerbs where roads meet."""
    kerbs: list[np.ndarray] = []
    asphalt: list[np.ndarray] = []
    marks: list[np.ndarray] = []
    for raw in road.lanes:
        lane = _clean(raw)
        if lane is None:
            continue
        line = _Centreline(lane.centre)
        left, right = lane.borders()
        ends = np.diff(lane.centre[[0, 1, -2, -1]], axis=0)[[0, 2]]
        ends /= np.linalg.norm(ends, axis=1, keepdims=True)
        run_on = _Centreline(_run_on(lane.centre, ends))
        outer = LaneStrip(lane.centre, lane.width + 2.0 * KERB_WIDTH_M).borders()
        asphalt += _strip(run_on, _run_on(left, ends), _run_on(right, ends), 0.0, run_on.length)
        for side, kind in enumerate((lane.left_line, lane.right_line)):
            border = (left, right)[side]
            mark_l, mark_r = LaneStrip(border, np.full(len(border), MARKING_WIDTH_M)).borders()
            if kind == LINE_SOLID:
                marks += _strip(run_on, _run_on(mark_l, ends), _run_on(mark_r, ends), 0.0, run_on.length)
                kerbs += _strip(run_on, _run_on(border, ends), _run_on(outer[side], ends), 0.0, run_on.length)
            elif kind == LINE_DASHED:
                for s0 in np.arange(0.0, line.length, DASH_ON_M + DASH_OFF_M):
                    marks.append(_ribbon(line, mark_l, mark_r, s0, min(s0 + DASH_ON_M, line.length)))
    for a, b in (np.asarray(line, dtype=np.float64) for line in road.stop_lines):
        along = b - a
        along /= max(float(np.linalg.norm(along)), 1e-9)
        half = np.array([along[1], -along[0]]) * STOP_LINE_WIDTH_M / 2  # a painted bar centred on the line
        marks.append(np.stack([a - half, b - half, b + half, a + half]))
    return (PolygonLayer.build(kerbs, KERB_RGB, True), PolygonLayer.build(asphalt, ASPHALT_RGB, True),
            PolygonLayer.build(marks, MARKING_RGB, True))
