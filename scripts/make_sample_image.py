#!/usr/bin/env python3
"""Draw the bundled synthetic front-camera image, ``wamdiff_ros/assets/sample_front.png`` (512x256 RGB).

Deterministic (PIL only, no randomness). The scene is laid out in metres and projected with the same pinhole as
``wamdiff_ros.draw.CameraModel()`` (90 deg horizontal FOV, camera 1.5 m above the ground, no pitch), so planned
waypoints drawn over it line up with the road: ego lane centred on y=0, lanes 3.5 m wide, road edges at +-5.25 m.

Usage: python scripts/make_sample_image.py [OUTPUT.png]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from PIL import Image, ImageDraw

W, H = 512, 256
FOV_DEG, CAM_H = 90.0, 1.5
FX = (W / 2) / math.tan(math.radians(FOV_DEG) / 2)
CX, CY = W / 2, H / 2  # the horizon is the image's middle row (no pitch)
LANE = 3.5
EDGE = 1.5 * LANE  # three lanes: the ego lane and one either side
FAR = 400.0
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "wamdiff_ros" / "assets" / "sample_front.png"


def px(x: float, y: float, z: float = 0.0) -> tuple[float, float]:
    """Ego-frame point (x forward, y left, z up, metres) to pixel (u, v)."""
    return CX - FX * y / x, CY + FX * (CAM_H - z) / x


def ground_quad(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [px(x0, y0), px(x0, y1), px(x1, y1), px(x1, y0)]


def lerp(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return tuple(int(round(p + (q - p) * t)) for p, q in zip(a, b))  # type: ignore[return-value]


def draw_background(d: ImageDraw.ImageDraw) -> None:
    horizon = int(CY)
    for v in range(horizon):  # sky: deep blue at the top, hazy near the horizon
        d.line([(0, v), (W, v)], fill=lerp((70, 120, 190), (200, 220, 235), (v / horizon) ** 1.5))
    # distant tree line on the horizon, a smooth deterministic outline
    ridge = [(u, horizon - 6 - 4 * math.sin(u / 23.0) - 3 * math.sin(u / 7.0 + 1.0)) for u in range(0, W + 8, 8)]
    d.polygon([(0, horizon), *ridge, (W, horizon)], fill=(70, 100, 70))
    for v in range(horizon, H):  # grass: darker toward the camera
        d.line([(0, v), (W, v)], fill=lerp((120, 150, 95), (70, 120, 55), (v - horizon) / (H - horizon)))


def draw_road(d: ImageDraw.ImageDraw) -> None:
    near = 1.0
    d.polygon(ground_quad(near, FAR, -EDGE - 0.6, EDGE + 0.6), fill=(150, 150, 140))  # shoulder
    d.polygon(ground_quad(near, FAR, -EDGE, EDGE), fill=(95, 95, 100))  # asphalt
    for y in (-0.85, 0.85, LANE - 0.85, LANE + 0.85, -LANE - 0.85, -LANE + 0.85):  # faint worn wheel tracks
        d.polygon(ground_quad(near, FAR, y - 0.3, y + 0.3), fill=(90, 90, 95))
    for y in (-EDGE + 0.1, EDGE - 0.1):  # solid edge lines
        d.polygon(ground_quad(near, FAR, y - 0.08, y + 0.08), fill=(235, 235, 225))
    for y in (-LANE / 2, LANE / 2):  # dashed lane lines: 3 m dash, 6 m gap
        x = 2.0
        while x < 120.0:
            d.polygon(ground_quad(x, x + 3.0, y - 0.07, y + 0.07), fill=(240, 240, 240))
            x += 9.0


def draw_vehicle(d: ImageDraw.ImageDraw, x: float, y: float, body: tuple[int, int, int],
                 width: float = 1.8, height: float = 1.5, length: float = 4.5) -> None:
    """A vehicle whose rear face is at distance ``x``, centred on lateral offset ``y``."""
    left, right = y + width / 2, y - width / 2
    dark = lerp(body, (0, 0, 0), 0.45)
    darker = lerp(body, (0, 0, 0), 0.65)
    # shadow under the car
    d.polygon(ground_quad(x - 0.2, x + length, right - 0.15, left + 0.15), fill=(55, 55, 60))
    # the side the camera can see (the one facing the image centre), and the roof, both darker than the rear
    side = right if y > 0 else left
    if abs(y) > 0.3:
        d.polygon([px(x, side), px(x + length, side), px(x + length, side, height * 0.95), px(x, side, height)],
                  fill=dark)
        d.polygon([px(x + 0.8, side, height - 0.1), px(x + length - 0.6, side, height * 0.95 - 0.1),
                   px(x + length - 0.6, side, height - 0.55), px(x + 0.8, side, height - 0.55)], fill=(40, 48, 60))
        for xt in (x + 0.6, x + length - 1.3):  # the visible wheels on that side
            d.polygon([px(xt, side, 0.6), px(xt + 0.7, side, 0.6), px(xt + 0.7, side), px(xt, side)],
                      fill=(20, 20, 22))
    d.polygon([px(x, left, height), px(x, right, height), px(x + length * 0.8, right, height * 0.97),
               px(x + length * 0.8, left, height * 0.97)], fill=darker)
    # rear face
    (u0, v0), (u1, v1) = px(x, left, height), px(x, right, 0.25)
    d.rectangle([u0, v0, u1, v1], fill=body, outline=darker)
    # rear window, lights, bumper, number plate, tyres
    wu0, wv0 = px(x, left - 0.2, height - 0.08)
    wu1, wv1 = px(x, right + 0.2, height - 0.55)
    d.rectangle([wu0, wv0, wu1, wv1], fill=(45, 55, 70))
    for yl in (left - 0.05, right + 0.3):
        lu0, lv0 = px(x, yl, 0.95)
        lu1, lv1 = px(x, yl - 0.25, 0.8)
        d.rectangle([lu0, lv0, lu1, lv1], fill=(200, 30, 30))
    bu0, bv0 = px(x, left, 0.45)
    bu1, bv1 = px(x, right, 0.25)
    d.rectangle([bu0, bv0, bu1, bv1], fill=dark)
    pu0, pv0 = px(x, y + 0.26, 0.65)
    pu1, pv1 = px(x, y - 0.26, 0.5)
    d.rectangle([pu0, pv0, pu1, pv1], fill=(230, 230, 220))
    for yt in (left - 0.05, right + 0.3):
        tu0, tv0 = px(x, yt, 0.25)
        tu1, tv1 = px(x, yt - 0.25, 0.0)
        d.rectangle([tu0, tv0, tu1, tv1], fill=(20, 20, 22))


def make_image() -> Image.Image:
    img = Image.new("RGB", (W, H))
    d = ImageDraw.Draw(img)
    draw_background(d)
    draw_road(d)
    for x, y, colour in ((40.0, -LANE, (205, 205, 210)), (20.0, 0.0, (170, 40, 35)), (9.0, LANE, (40, 80, 160))):
        draw_vehicle(d, x, y, colour)  # far to near, so nearer vehicles cover farther ones
    return img


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    make_image().save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
