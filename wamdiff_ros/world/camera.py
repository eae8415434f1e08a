"""The world's front camera: a deterministic CPU rasteriser (PIL polygons) of the road and the other vehicles as
seen from a pinhole camera on the ego, with 2-D vehicle boxes on the 0-1000 grid of ``wamdiff_ros.format``.

Frames as in ``wamdiff_ros.world.types``; the projection is ``wamdiff_ros.draw.CameraModel`` (``CameraConfig
.camera_model()``), so plan overlays drawn on these images line up with the scene.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from wamdiff_ros.draw import CameraModel
from wamdiff_ros.errors import CameraConfigError
from wamdiff_ros.format import BOX_GRID, Box
from wamdiff_ros.world.road_mesh import PolygonLayer, road_layers
from wamdiff_ros.geometry import Pose2D, rotate_to_ego
from wamdiff_ros.world.types import RoadGeometry, VehicleBox

NEAR_M = 0.25  # near plane (camera depth); polygons crossing it are clipped
SKY_TOP_RGB, SKY_HORIZON_RGB = (84, 132, 204), (186, 208, 232)
GRASS_RGB, HAZE_RGB = (66, 112, 48), (140, 160, 138)
GLASS_RGB, TAIL_RGB, HEAD_RGB = (34, 42, 54), (190, 24, 24), (235, 232, 200)

# A vehicle's vertices in units of (length, width, height) from its ground centre: 8 body corners (index
# 4*ix + 2*iy + iz), then windscreen, rear window, left and right side windows, tail and head lights (4 each).
_UNIT = np.array(
    [[x, y, z] for x in (-0.5, 0.5) for y in (-0.5, 0.5) for z in (0.0, 1.0)]
    + [[0.5, -0.42, 0.55], [0.5, 0.42, 0.55], [0.5, 0.42, 0.9], [0.5, -0.42, 0.9]]
    + [[-0.5, -0.42, 0.55], [-0.5, 0.42, 0.55], [-0.5, 0.42, 0.9], [-0.5, -0.42, 0.9]]
    + [[-0.3, 0.5, 0.55], [0.25, 0.5, 0.55], [0.25, 0.5, 0.9], [-0.3, 0.5, 0.9]]
    + [[-0.3, -0.5, 0.55], [0.25, -0.5, 0.55], [0.25, -0.5, 0.9], [-0.3, -0.5, 0.9]]
    + [[-0.5, y0, 0.35] for y0 in (-0.45, 0.45)] + [[-0.5, y1, 0.35] for y1 in (-0.3, 0.3)]
    + [[-0.5, y1, 0.5] for y1 in (-0.3, 0.3)] + [[-0.5, y0, 0.5] for y0 in (-0.45, 0.45)]
    + [[0.5, y0, 0.35] for y0 in (-0.45, 0.45)] + [[0.5, y1, 0.35] for y1 in (-0.3, 0.3)]
    + [[0.5, y1, 0.5] for y1 in (-0.3, 0.3)] + [[0.5, y0, 0.5] for y0 in (-0.45, 0.45)]
)
# (face, body corner indices, shade index, details drawn on it as (vertex indices, colour))
_FACES = (
    ("front", (4, 6, 7, 5), 2,
     (((8, 9, 10, 11), GLASS_RGB), ((32, 34, 36, 38), HEAD_RGB), ((33, 35, 37, 39), HEAD_RGB))),
    ("back", (0, 2, 3, 1), 2,
     (((12, 13, 14, 15), GLASS_RGB), ((24, 26, 28, 30), TAIL_RGB), ((25, 27, 29, 31), TAIL_RGB))),
    ("left", (2, 6, 7, 3), 1, (((16, 17, 18, 19), GLASS_RGB),)),
    ("right", (0, 4, 5, 1), 1, (((20, 21, 22, 23), GLASS_RGB),)),
    ("top", (1, 5, 7, 3), 0, ()),
)


@dataclass(frozen=True, slots=True)
class CameraConfig:
    width: int = 256
    height: int = 128
    fov_deg: float = 90.0  # horizontal
    mount_forward_m: float = 1.0  # ahead of the ego centre
    mount_height_m: float = 1.5
    pitch_deg: float = 5.0  # down
    max_range_m: float = 150.0
    min_visible_fraction: float = 0.25  # of a vehicle's pixels, for it to be labelled
    min_box_px: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise CameraConfigError(f.name, f"expected a finite number, got {v!r}")
        checks = {
            "width": isinstance(self.width, int) and 8 <= self.width <= 8192,
            "height": isinstance(self.height, int) and 8 <= self.height <= 8192,
            "fov_deg": 1.0 <= self.fov_deg <= 170.0,
            "mount_height_m": self.mount_height_m > 0.0,
            "pitch_deg": -60.0 <= self.pitch_deg <= 60.0,
            "max_range_m": self.max_range_m > NEAR_M,
            "min_visible_fraction": 0.0 <= self.min_visible_fraction <= 1.0,
            "min_box_px": isinstance(self.min_box_px, int) and self.min_box_px >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise CameraConfigError(name, f"out of range: {getattr(self, name)!r}")

    def camera_model(self) -> CameraModel:
        """The same projection, for plan overlays (``wamdiff_ros.draw``)."""
        return CameraModel(self.fov_deg, self.mount_height_m, self.pitch_deg, self.mount_forward_m)

    def horizon_v(self) -> float:
        """Image row (continuous, down) of the horizon."""
        return self.height / 2.0 - self.camera_model().focal_px(self.width) * math.tan(math.radians(self.pitch_deg))


@dataclass(frozen=True, slots=True)
class LabelledBox:
    vehicle_id: int
    box: Box  # label "car", 0-1000 grid, score 1.0
    visible_fraction: float


@dataclass(slots=True)
class CameraFrame:
    image: np.ndarray  # (H, W, 3) uint8
    boxes: list[LabelledBox]  # near to far


@dataclass(slots=True)
class _Drawn:
    """A vehicle as drawn this frame: its body faces in PIL coordinates and its box in pixels (u0, v0, u1, v1)."""

    vehicle: VehicleBox
    faces: list[np.ndarray]
    bbox: tuple[float, float, float, float]


@lru_cache(maxsize=256)
def _shades(rgb: tuple[int, int, int]) -> tuple[tuple[int, int, int], ...]:
    """Top, side and front/back colours of a body."""
    return tuple(tuple(min(255, int(c * k)) for c in rgb) for k in (1.0, 0.74, 0.56))


def clip_near(polygons: np.ndarray) -> list[np.ndarray]:
    """Camera-frame polygons (n, K, 3) cut to depth >= NEAR_M (Sutherland-Hodgman, one plane): n arrays (m, 3)."""
    n, k = polygons.shape[:2]
    d = polygons[..., 2] - NEAR_M
    d_next, nxt = np.roll(d, -1, axis=1), np.roll(polygons, -1, axis=1)
    inside = d >= 0.0
    cross = inside != (d_next >= 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(cross, d / (d - d_next), 0.0)
    cand = np.stack([polygons, polygons + t[..., None] * (nxt - polygons)], axis=2).reshape(n, 2 * k, 3)
    keep = np.stack([inside, cross], axis=2).reshape(n, 2 * k)
    return [cand[i][keep[i]] for i in range(n)]


class FrontCamera:
    """Renders the road and the other vehicles from the ego's front camera. The road is prepared once."""

    def __init__(self, road: RoadGeometry, config: CameraConfig = CameraConfig()) -> None:
        self.config = config
        self.model = config.camera_model()
        self._layers: tuple[PolygonLayer, ...] = road_layers(road)
        self._background = Image.fromarray(_background(config), "RGB")
        w, h, f = config.width, config.height, self.model.focal_px(config.width)
        pitch = math.radians(config.pitch_deg)
        # Widest horizontal angle of the view on the ground (the bottom corners look wider when pitched down).
        ahead = min(f * math.cos(pitch) - d * math.sin(pitch) for d in (-h / 2.0, h / 2.0))
        half = math.atan2(w / 2.0, ahead) + math.radians(5.0) if ahead > 0 else math.pi / 2.0
        self._cos_half, self._sin_half = math.cos(min(half, math.pi / 2.0)), math.sin(min(half, math.pi / 2.0))

    def render(self, ego: Pose2D, vehicles: Sequence[VehicleBox]) -> CameraFrame:
        """The picture from ``ego`` (not drawn itself) and the labelled boxes of ``vehicles``, near to far."""
        c, s = math.cos(ego.heading), math.sin(ego.heading)
        rot, t = self.model.ego_to_camera()
        to_ego = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
        a = rot @ to_ego  # world -> camera: a @ p + b
        b = -a @ np.array([ego.x, ego.y, 0.0]) - rot @ t
        cam_xy = np.array([ego.x + c * t[0], ego.y + s * t[0]])
        img = self._background.copy()
        draw = ImageDraw.Draw(img)
        for layer in self._layers:
            if len(layer.radii):
                keep, _ = self._cull(layer.centres, layer.radii, cam_xy, ego.heading)
                self._draw_ground(draw, layer, layer.vertices[keep], a, b)
        drawn = self._draw_vehicles(draw, vehicles, a, b, cam_xy, ego.heading)
        return CameraFrame(np.array(img), self._label(drawn))

    def _cull(self, centres: np.ndarray, radii: np.ndarray, cam_xy: np.ndarray, heading: float
              ) -> tuple[np.ndarray, np.ndarray]:
        """Circles that may show in the view (within range, not behind, inside the widened horizontal wedge), and
        the camera-to-centre ground distances."""
        rel = centres - cam_xy
        fwd, left = rotate_to_ego(rel[:, 0], rel[:, 1], heading)
        dist = np.hypot(fwd, left)
        side = np.abs(left) * self._cos_half - fwd * self._sin_half
        return (dist - radii <= self.config.max_range_m) & (fwd + radii > 0.0) & (side <= radii), dist

    def _pil(self, cam: np.ndarray) -> np.ndarray:
        """Camera points (..., 3), depth > 0, to PIL coordinates (pixel centres on integers)."""
        cfg = self.config
        return self.model.pixels(cam.reshape(-1, 3), cfg.width, cfg.height).reshape(*cam.shape[:-1], 2) - 0.5

    def _draw_ground(self, draw: ImageDraw.ImageDraw, layer: PolygonLayer, verts: np.ndarray, a: np.ndarray,
                     b: np.ndarray) -> None:
        if not len(verts):
            return
        cam = verts @ a[:, :2].T + b
        depth = cam[..., 2]
        front = depth.min(axis=1) >= NEAR_M
        outline = layer.rgb if layer.outline else None
        w, h = self.config.width, self.config.height
        if front.any():
            uv = self._pil(cam[front])
            lo, hi = uv.min(axis=1), uv.max(axis=1)
            on = (hi[:, 0] >= -1) & (lo[:, 0] <= w) & (hi[:, 1] >= -1) & (lo[:, 1] <= h)
            for xy in uv[on].reshape(int(on.sum()), -1).tolist() if on.any() else ():
                draw.polygon(xy, fill=layer.rgb, outline=outline)
        crossing = ~front & (depth.max(axis=1) > NEAR_M)
        if crossing.any():
            for poly in clip_near(cam[crossing]):
                if len(poly) >= 3:
                    draw.polygon(self._pil(poly).ravel().tolist(), fill=layer.rgb, outline=outline)

    def _draw_vehicles(self, draw: ImageDraw.ImageDraw, vehicles: Sequence[VehicleBox], a: np.ndarray,
                       b: np.ndarray, cam_xy: np.ndarray, heading: float) -> list[_Drawn]:
        """Draws the vehicles far to near (visible faces only) and returns them in that order."""
        if not vehicles:
            return []
        pose = np.array([[v.pose.x, v.pose.y, v.pose.heading] for v in vehicles])
        dims = np.array([[v.length, v.width, v.height] for v in vehicles])
        keep, dist = self._cull(pose[:, :2], 0.5 * np.hypot(dims[:, 0], dims[:, 1]), cam_xy, heading)
        order = [int(i) for i in np.argsort(-dist, kind="stable") if keep[i] and dist[i] <= self.config.max_range_m]
        if not order:
            return []
        pose, dims = pose[order], dims[order]
        local = _UNIT[None] * dims[:, None, :]
        hc, hs = np.cos(pose[:, 2])[:, None], np.sin(pose[:, 2])[:, None]
        world = np.stack([pose[:, :1] + hc * local[..., 0] - hs * local[..., 1],
                          pose[:, 1:2] + hs * local[..., 0] + hc * local[..., 1], local[..., 2]], axis=2)
        cam = world @ a.T + b
        with np.errstate(divide="ignore", invalid="ignore"):
            uv = self._pil(cam)
        # the camera in each vehicle's own frame decides which faces it sees
        rel = cam_xy - pose[:, :2]
        seen_x, seen_y = hc[:, 0] * rel[:, 0] + hs[:, 0] * rel[:, 1], hc[:, 0] * rel[:, 1] - hs[:, 0] * rel[:, 0]
        cam_z = self.config.mount_height_m
        out: list[_Drawn] = []
        for k, i in enumerate(order):
            v = vehicles[i]
            half_l, half_w = dims[k, 0] / 2.0, dims[k, 1] / 2.0
            visible = {"front": seen_x[k] > half_l, "back": seen_x[k] < -half_l, "left": seen_y[k] > half_w,
                       "right": seen_y[k] < -half_w, "top": cam_z > dims[k, 2]}
            crossing = cam[k, :8, 2].min() < NEAR_M
            if cam[k, :8, 2].max() <= NEAR_M or not any(visible.values()):
                continue
            shades = _shades(tuple(v.rgb))
            faces: list[np.ndarray] = []
            for name, idx, shade, details in _FACES:
                if not visible[name]:
                    continue
                for j, (vidx, fill) in enumerate(((idx, shades[shade]),) + details):
                    if crossing:
                        (poly,) = clip_near(cam[k, list(vidx)][None])
                        if len(poly) < 3:
                            continue
                        xy = self._pil(poly)
                    else:
                        xy = uv[k, list(vidx)]
                    draw.polygon(xy.ravel().tolist(), fill=fill, outline=fill)
                    if j == 0:
                        faces.append(xy)
            if faces:
                pts = np.concatenate(faces) if crossing else uv[k, :8]
                lo, hi = pts.min(axis=0) + 0.5, pts.max(axis=0) + 0.5
                out.append(_Drawn(v, faces, (float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1]))))
        return out

    def _label(self, drawn: list[_Drawn]) -> list[LabelledBox]:
        """Boxes of the drawn vehicles (far to near) that are big and unoccluded enough, returned near to far."""
        cfg = self.config
        w, h = cfg.width, cfg.height
        if not drawn:
            return []
        bb = np.array([d.bbox for d in drawn])
        clipped = np.stack([np.clip(bb[:, 0], 0, w), np.clip(bb[:, 1], 0, h),
                            np.clip(bb[:, 2], 0, w), np.clip(bb[:, 3], 0, h)], axis=1)
        size = clipped[:, 2:] - clipped[:, :2]
        big = (size > 0).all(axis=1) & (size >= cfg.min_box_px).all(axis=1)
        overlap = ((clipped[:, None, 0] < clipped[None, :, 2]) & (clipped[None, :, 0] < clipped[:, None, 2])
                   & (clipped[:, None, 1] < clipped[None, :, 3]) & (clipped[None, :, 1] < clipped[:, None, 3]))
        overlap &= (size > 0).all(axis=1)[:, None] & (size > 0).all(axis=1)[None, :]
        covered = np.triu(overlap, k=1)  # covered[i, j]: j, drawn after i, may hide part of i
        fraction = np.ones(len(drawn))
        if (covered.any(axis=1) & big).any():
            fraction = self._visible_fractions(drawn, covered, big)
        boxes = []
        for k in range(len(drawn) - 1, -1, -1):
            if big[k] and fraction[k] >= cfg.min_visible_fraction:
                x1, y1, x2, y2 = (float(c) for c in clipped[k])
                box = Box("car", x1 * BOX_GRID / w, y1 * BOX_GRID / h, x2 * BOX_GRID / w, y2 * BOX_GRID / h, 1.0)
                boxes.append(LabelledBox(drawn[k].vehicle.id, box, float(fraction[k])))
        return boxes

    def _visible_fractions(self, drawn: list[_Drawn], covered: np.ndarray, big: np.ndarray) -> np.ndarray:
        """Unoccluded / full silhouette pixels, from an id buffer of the overlapping vehicles drawn far to near;
        1 for vehicles nothing nearer overlaps."""
        w, h = self.config.width, self.config.height
        involved = [k for k in range(len(drawn)) if covered[k].any() or covered[:, k].any()]
        wide = len(involved) > 255
        ids = Image.new("I" if wide else "L", (w, h), 0)
        draw = ImageDraw.Draw(ids)
        for n, k in enumerate(involved, start=1):
            for xy in drawn[k].faces:
                draw.polygon(xy.ravel().tolist(), fill=n, outline=n)
        counts = np.bincount(np.asarray(ids).ravel(), minlength=len(involved) + 1) if wide else ids.histogram()
        fraction = np.ones(len(drawn))
        for n, k in enumerate(involved, start=1):
            if not (covered[k].any() and big[k]):
                continue
            u0, v0, u1, v1 = drawn[k].bbox
            x0, y0 = max(0, math.floor(u0) - 1), max(0, math.floor(v0) - 1)
            x1, y1 = min(w, math.ceil(u1) + 2), min(h, math.ceil(v1) + 2)
            alone = Image.new("L", (max(1, x1 - x0), max(1, y1 - y0)), 0)
            solo = ImageDraw.Draw(alone)
            for xy in drawn[k].faces:
                solo.polygon((xy - (x0, y0)).ravel().tolist(), fill=255, outline=255)
            full = alone.histogram()[255]
            fraction[k] = min(1.0, counts[n] / full) if full else 0.0
        return fraction


def _background(cfg: CameraConfig) -> np.ndarray:
    """Sky (a vertical gradient) above the horizon, grass fading into haze towards it below."""
    v = np.arange(cfg.height, dtype=np.float64) + 0.5
    horizon = cfg.horizon_v()
    sky_t = np.clip(v / max(horizon, 1e-6), 0.0, 1.0)[:, None]
    ground_t = np.clip((v - horizon) / max(cfg.height - horizon, 1e-6), 0.0, 1.0)[:, None] ** 0.5
    sky = np.array(SKY_TOP_RGB) * (1 - sky_t) + np.array(SKY_HORIZON_RGB) * sky_t
    ground = np.array(HAZE_RGB) * (1 - ground_t) + np.array(GRASS_RGB) * ground_t
    rows = np.where((v < horizon)[:, None], sky, ground)
    return np.ascontiguousarray(np.repeat(rows[:, None, :], cfg.width, axis=1).round().astype(np.uint8))
