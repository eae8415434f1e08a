"""Pictures of a plan: the camera image with the projected path and boxes, a bird's-eye panel beside it, and a text
strip below. No ROS imports. Frames as in ``wamdiff_ros.format``: waypoints in the ego frame (x forward, y left,
metres), boxes on the 0-1000 image grid (x right, y down)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from wamdiff_ros.format import BOX_GRID, Box

STRIP_HEIGHT = 24  # text strip below the images, pixels; the bird's-eye panel is square (its width is the height)
LINE_HEIGHT = 12  # each further line of text ("\n") makes the strip this much taller
GRID_M = 5.0
MAX_RANGE_M = 200.0  # the bird's-eye panel shows at most this far ahead; farther points fall off it
MIN_FRONT_M = 0.1
_PATH_RGB = (0, 200, 255)  # path colour when no confidence is given
_BOX_RGB = (255, 210, 0)
_MARK_RGB = (255, 255, 255)  # the ring around a waypoint reflection repaired
_LIMIT_PX = 1e5  # projected coordinates are clipped here so PIL never sees absurd values


@dataclass(frozen=True, slots=True)
class CameraModel:
    """Pinhole camera ``forward_m`` ahead of the ego origin and ``height_m`` above the ground, looking along +x;
    ``pitch_deg`` > 0 tilts it down. ``fov_deg`` is the horizontal field of view; pixels are square and the principal
    point is the centre. The world renderer (``wamdiff_ros.world.camera``) projects with this same definition."""

    fov_deg: float = 90.0
    height_m: float = 1.5
    pitch_deg: float = 0.0
    forward_m: float = 0.0

    def focal_px(self, width: int) -> float:
        return (width / 2.0) / math.tan(math.radians(self.fov_deg) / 2.0)

    def ego_to_camera(self) -> tuple[np.ndarray, np.ndarray]:
        """(R, t): an ego-frame point p (x forward, y left, z up) has camera coordinates (right, down, depth)
        ``R @ (p - t)``; t is the camera position in the ego frame."""
        c, s = math.cos(math.radians(self.pitch_deg)), math.sin(math.radians(self.pitch_deg))
        rot = np.array([[0.0, -1.0, 0.0], [-s, 0.0, -c], [c, 0.0, -s]])
        return rot, np.array([self.forward_m, 0.0, self.height_m])

    def pixels(self, camera_points: np.ndarray, width: int, height: int) -> np.ndarray:
        """Camera coordinates (N, 3) (right, down, depth > 0) to pixels (N, 2) (u right, v down; pixel i spans
        [i, i + 1))."""
        p = np.asarray(camera_points, dtype=np.float64).reshape(-1, 3)
        f = self.focal_px(width)
        return np.stack([width / 2.0 + f * p[:, 0] / p[:, 2], height / 2.0 + f * p[:, 1] / p[:, 2]], axis=1)

    def project_points(self, points_xyz: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        """Ego-frame 3-D points (N, 3) to pixels (N, 2) and a bool mask of finite points more than 0.1 m in front of
        the image plane; points outside the mask are NaN."""
        rot, t = self.ego_to_camera()
        with np.errstate(invalid="ignore"):
            cam = (np.asarray(points_xyz, dtype=np.float64).reshape(-1, 3) - t) @ rot.T
        return self._masked(cam, np.isfinite(cam).all(axis=1) & (cam[:, 2] > MIN_FRONT_M), width, height)

    def project(self, points_xy: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        """Ground points (N, 2) to pixels (N, 2) float64 (u right, v down) and a bool mask of points in front of
        the camera (x > 0.1 m ahead of the camera, finite, ahead of the image plane). Points outside the mask are
        NaN."""
        pts = np.asarray(points_xy, dtype=np.float64).reshape(-1, 2)
        rot, t = self.ego_to_camera()
        with np.errstate(invalid="ignore"):
            cam = (np.concatenate([pts, np.zeros((len(pts), 1))], axis=1) - t) @ rot.T
            mask = np.isfinite(pts).all(axis=1) & (pts[:, 0] - self.forward_m > MIN_FRONT_M) & (cam[:, 2] > 1e-6)
        return self._masked(cam, mask, width, height)

    def _masked(self, cam: np.ndarray, mask: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
        uv = np.full((len(cam), 2), np.nan)
        uv[mask] = self.pixels(cam[mask], width, height)
        return np.clip(uv, -_LIMIT_PX, _LIMIT_PX), mask


def _colours(n: int, confidence: np.ndarray | None) -> list[tuple[int, int, int]]:
    if confidence is None:
        return [_PATH_RGB] * n
    c = np.nan_to_num(np.asarray(confidence, dtype=np.float64).reshape(-1), nan=0.0)
    c = np.clip(np.resize(c, n) if c.size else np.zeros(n), 0.0, 1.0)
    return [(int(round(255 * (1 - t))), int(round(200 * t)), 0) for t in c]  # red (0) to green (1)


def _draw_path(d: ImageDraw.ImageDraw, uv: np.ndarray, ok: np.ndarray, colours: list, radius: float,
               marked: Sequence[int] = ()) -> None:
    """The path; the ``marked`` waypoints (repaired by reflection) get a white ring around their dot."""
    idx = [i for i in range(len(uv)) if ok[i]]
    for a, b in zip(idx, idx[1:]):
        d.line([tuple(uv[a]), tuple(uv[b])], fill=colours[b], width=max(1, int(radius)))
    for i in idx:
        u, v = uv[i]
        if i in marked:
            ring = radius * 1.8
            d.ellipse([u - ring, v - ring, u + ring, v + ring], outline=_MARK_RGB, width=max(1, int(radius / 2)))
        d.ellipse([u - radius, v - radius, u + radius, v + radius], fill=colours[i], outline=(0, 0, 0))


def _birds_eye(size: int, wp: np.ndarray, colours: list, marked: Sequence[int] = ()) -> Image.Image:
    panel = Image.new("RGB", (size, size), (25, 28, 32))
    d = ImageDraw.Draw(panel)
    finite = np.isfinite(wp).all(axis=1)
    reach = float(np.abs(wp[finite]).max()) if finite.any() else 0.0
    range_m = min(MAX_RANGE_M, max(20.0, math.ceil(min(reach, MAX_RANGE_M) * 1.1 / 10.0) * 10.0))  # 10 m steps
    margin = max(8, size // 16)
    scale = (size - margin) / range_m  # px per metre
    ox, oy = size / 2.0, size - margin  # the ego origin
    for k in range(0, int(range_m // GRID_M) + 2):  # lines across at x = 0, 5, 10 ... and along at y = 0, +-5 ...
        shade = (70, 75, 82) if k % 2 == 0 else (45, 49, 55)
        d.line([(0, oy - k * GRID_M * scale), (size, oy - k * GRID_M * scale)], fill=shade)
        for s in (-1, 1) if k else (1,):
            d.line([(ox + s * k * GRID_M * scale, 0), (ox + s * k * GRID_M * scale, size)], fill=shade)
    d.text((3, 2), f"grid {GRID_M:g} m", fill=(150, 150, 150))
    car_w, car_l = 1.8 * scale / 2, 4.5 * scale
    d.rectangle([ox - car_w, oy - car_l * 0.75, ox + car_w, oy + car_l * 0.25], fill=(230, 230, 230))
    uv = np.stack([ox - wp[:, 1] * scale, oy - wp[:, 0] * scale], axis=1)
    uv = np.clip(np.nan_to_num(uv, nan=0.0), -_LIMIT_PX, _LIMIT_PX)
    _draw_path(d, uv, finite, colours, radius=max(2.0, size / 80), marked=marked)
    return panel


def draw_plan(image: np.ndarray, waypoints: np.ndarray, boxes: Sequence[Box] = (),
              confidence: np.ndarray | None = None, text: str = "",
              camera: CameraModel = CameraModel(), marked: Sequence[int] = ()) -> Image.Image:
    """Camera image (H, W, 3) uint8 with the projected path and the boxes, a square (H x H) bird's-eye panel on its
    right, and ``text`` on a strip below: a (W + H, H + STRIP_HEIGHT) RGB image, LINE_HEIGHT taller per further line of
``text``. Non-finite waypoints are skipped; ``marked`` ones (0-based: waypoints reflection repaired) are ringed."""
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    arr = np.ascontiguousarray(np.clip(arr[..., :3], 0, 255).astype(np.uint8))
    h, w = arr.shape[:2]
    wp = np.asarray(waypoints, dtype=np.float64).reshape(-1, 2)
    colours = _colours(len(wp), confidence)

    cam = Image.fromarray(arr, "RGB")
    d = ImageDraw.Draw(cam)
    font = ImageFont.load_default()
    for b in boxes:
        x1, x2 = sorted((b.x1 * w / BOX_GRID, b.x2 * w / BOX_GRID))
        y1, y2 = sorted((b.y1 * h / BOX_GRID, b.y2 * h / BOX_GRID))
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            continue
        d.rectangle([x1, y1, x2, y2], outline=_BOX_RGB, width=2)
        label = b.label if b.score >= 1.0 else f"{b.label} {b.score:.2f}"
        tx, ty = x1, y1 - 12 if y1 >= 12 else y2 + 1
        l, t, r, bt = d.textbbox((tx, ty), label, font=font)
        d.rectangle([l - 1, t - 1, r + 1, bt + 1], fill=(0, 0, 0))
        d.text((tx, ty), label, fill=_BOX_RGB, font=font)
    uv, front = camera.project(wp, w, h)
    _draw_path(d, uv, front, colours, radius=max(2.0, w / 160), marked=marked)

    lines = text.split("\n") if text else []
    strip = STRIP_HEIGHT + LINE_HEIGHT * max(len(lines) - 1, 0)
    out = Image.new("RGB", (w + h, h + strip), (0, 0, 0))
    out.paste(cam, (0, 0))
    out.paste(_birds_eye(h, wp, colours, marked), (w, 0))
    for i, line in enumerate(lines):
        ImageDraw.Draw(out).text((4, h + (STRIP_HEIGHT - 11) // 2 + LINE_HEIGHT * i), line, fill=(235, 235, 235),
                                 font=font)
    return out


def save_plan_png(path: str | Path, image: np.ndarray, waypoints: np.ndarray, boxes: Sequence[Box] = (),
                  confidence: np.ndarray | None = None, text: str = "",
                  camera: CameraModel = CameraModel()) -> Path:
    """``draw_plan`` saved as a PNG at ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draw_plan(image, waypoints, boxes, confidence, text, camera).save(path, format="PNG")
    return path
