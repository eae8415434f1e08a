"""Tests for wamdiff_ros.draw: the pinhole projection, the plan picture, and the bundled sample image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wamdiff_ros.draw import STRIP_HEIGHT, CameraModel, draw_plan, save_plan_png
from wamdiff_ros.format import Box

W, H = 320, 160
SAMPLE = Path(__file__).resolve().parents[1] / "wamdiff_ros" / "assets" / "sample_front.png"


def grey(w: int = W, h: int = H) -> np.ndarray:
    return np.full((h, w, 3), 90, dtype=np.uint8)


def straight_plan(speed: float = 6.0, curve: float = 0.2) -> np.ndarray:
    t = np.arange(1, 9, dtype=np.float32) * 0.5
    return np.stack([speed * t, curve * t**2], axis=1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# projection


def test_point_straight_ahead_is_on_the_vertical_centre_line() -> None:
    uv, front = CameraModel().project(np.array([[10.0, 0.0]]), W, H)
    assert front.tolist() == [True]
    assert uv[0, 0] == pytest.approx(W / 2)
    assert uv[0, 1] > H / 2  # the ground is below the horizon


def test_ground_point_matches_pinhole_formula() -> None:
    cam = CameraModel(fov_deg=90.0, height_m=1.5)
    uv, _ = cam.project(np.array([[6.0, 2.0]]), W, H)
    f = (W / 2) / np.tan(np.radians(45.0))
    assert uv[0, 0] == pytest.approx(W / 2 - f * 2.0 / 6.0)
    assert uv[0, 1] == pytest.approx(H / 2 + f * 1.5 / 6.0)


def test_farther_point_is_higher_in_the_image() -> None:
    uv, front = CameraModel().project(np.array([[5.0, 0.0], [20.0, 0.0], [80.0, 0.0]]), W, H)
    assert front.all()
    assert uv[0, 1] > uv[1, 1] > uv[2, 1] > H / 2


def test_left_point_lands_left_of_centre_and_right_point_right() -> None:
    uv, front = CameraModel().project(np.array([[10.0, 2.0], [10.0, -2.0]]), W, H)
    assert front.all()
    assert uv[0, 0] < W / 2 < uv[1, 0]


def test_points_behind_or_at_the_camera_and_nan_are_masked() -> None:
    uv, front = CameraModel().project(np.array([[-5.0, 0.0], [0.05, 0.0], [np.nan, 1.0], [3.0, 0.0]]), W, H)
    assert front.tolist() == [False, False, False, True]
    assert np.isnan(uv[:3]).all() and np.isfinite(uv[3]).all()


def test_wider_fov_shrinks_and_downward_pitch_raises_points() -> None:
    p = np.array([[10.0, 3.0]])
    narrow, _ = CameraModel(fov_deg=60.0).project(p, W, H)
    wide, _ = CameraModel(fov_deg=110.0).project(p, W, H)
    assert abs(wide[0, 0] - W / 2) < abs(narrow[0, 0] - W / 2)
    level, _ = CameraModel().project(p, W, H)
    pitched, _ = CameraModel(pitch_deg=5.0).project(p, W, H)
    assert pitched[0, 1] < level[0, 1]  # tilting the camera down moves ground points up the image


# ---------------------------------------------------------------------------------------------------------------
# draw_plan


def test_output_size_and_mode() -> None:
    out = draw_plan(grey(), straight_plan(), text="plan ok")
    assert isinstance(out, Image.Image)
    assert out.mode == "RGB"
    assert out.size == (W + H, H + STRIP_HEIGHT)  # the bird's-eye panel is square: its width is H


def test_projected_path_changes_the_camera_pixels() -> None:
    img = grey()
    wp = straight_plan()
    out = np.asarray(draw_plan(img, wp))
    uv, front = CameraModel().project(wp, W, H)
    inside = front & (uv[:, 0] >= 0) & (uv[:, 0] < W) & (uv[:, 1] >= 0) & (uv[:, 1] < H)
    assert inside.sum() >= 4
    for u, v in uv[inside]:
        assert not np.array_equal(out[int(v), int(u)], img[int(v), int(u)])
    # also between two consecutive projected points (the joining line)
    (u0, v0), (u1, v1) = uv[inside][0], uv[inside][1]
    um, vm = int(round((u0 + u1) / 2)), int(round((v0 + v1) / 2))
    assert (out[vm - 1:vm + 2, um - 1:um + 2] != img[vm - 1:vm + 2, um - 1:um + 2]).any()
    # far from the path (top-left sky corner) the camera image is untouched
    assert np.array_equal(out[:20, :20], img[:20, :20])


def test_input_image_is_not_modified() -> None:
    img = grey()
    before = img.copy()
    draw_plan(img, straight_plan(), [Box("car", 100, 100, 300, 300)])
    assert np.array_equal(img, before)


def test_birds_eye_panel_shows_the_path_coloured_by_confidence() -> None:
    wp = straight_plan()
    green = np.asarray(draw_plan(grey(), wp, confidence=np.ones(8))).astype(int)[:H, W:]
    red = np.asarray(draw_plan(grey(), wp, confidence=np.zeros(8))).astype(int)[:H, W:]
    is_green = (green[..., 1] > 150) & (green[..., 0] < 60)
    is_red = (red[..., 0] > 200) & (red[..., 1] < 60)
    assert is_green.sum() > 20 and is_red.sum() > 20
    assert not ((green[..., 0] > 200) & (green[..., 1] < 60)).any()
    # the path runs forward: dots reach the upper half of the panel, ego at the bottom
    rows = np.nonzero(is_green)[0]
    assert rows.min() < H / 2 and rows.max() > H / 2


@pytest.mark.parametrize(
    "wp",
    [
        np.full((8, 2), np.nan, dtype=np.float32),
        np.where(np.arange(16).reshape(8, 2) % 3 == 0, np.nan, straight_plan()).astype(np.float32),
        np.array([[np.inf, 0.0]] + [[-np.inf, 1.0]] * 7, dtype=np.float32),
        np.zeros((8, 2), dtype=np.float32),
        np.full((8, 2), 1e30, dtype=np.float32),
    ],
)
def test_non_finite_or_degenerate_waypoints_do_not_raise(wp: np.ndarray) -> None:
    conf = np.array([np.nan, 0.5, 2.0, -1.0, 0.1, 0.2, 0.3, 0.4])
    out = draw_plan(grey(), wp, [], confidence=conf, text="nan plan")
    assert out.size == (W + H, H + STRIP_HEIGHT)


def test_boxes_change_pixels_on_the_scaled_outline() -> None:
    img = grey()
    box = Box("car", 250, 400, 500, 800, 0.8)
    wp = np.full((8, 2), np.nan, dtype=np.float32)  # no path, so only the box draws on the camera image
    plain = np.asarray(draw_plan(img, wp, [])).astype(int)[:H, :W]
    boxed = np.asarray(draw_plan(img, wp, [box])).astype(int)[:H, :W]
    x1, y1, x2, y2 = (round(box.x1 * W / 1000), round(box.y1 * H / 1000),
                      round(box.x2 * W / 1000), round(box.y2 * H / 1000))
    changed = (plain != boxed).any(axis=2)
    assert changed[(y1 + y2) // 2, x1] and changed[(y1 + y2) // 2, x2]  # left and right edges
    assert changed[y2, (x1 + x2) // 2]  # bottom edge
    assert not changed[(y1 + y2) // 2, (x1 + x2) // 2]  # the box's inside is left visible
    assert not changed[y2 + 5:, :].any()  # nothing below the box
    assert not changed[:, x2 + 5:].any()  # the label is drawn from the left edge, nothing to the right
    assert changed[:y1, x1:x2].any()  # the label above the box


def test_empty_box_list_and_text_strip() -> None:
    out = np.asarray(draw_plan(grey(), straight_plan(), [], text=""))
    assert not out[H:].any()  # empty strip stays black
    out = np.asarray(draw_plan(grey(), straight_plan(), [], text="plan: straight 6.0 m/s"))
    assert out[H:].any()


def test_save_plan_png(tmp_path: Path) -> None:
    path = save_plan_png(tmp_path / "sub" / "plan.png", grey(), straight_plan(), [Box("car", 1, 2, 30, 40)],
                         np.linspace(0, 1, 8), "hello")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (W + H, H + STRIP_HEIGHT)


# ---------------------------------------------------------------------------------------------------------------
# bundled sample image


def test_sample_image_loads() -> None:
    assert SAMPLE.stat().st_size < 60_000
    with Image.open(SAMPLE) as im:
        im.load()
        assert im.format == "PNG" and im.mode == "RGB" and im.size == (256, 128)  # the world camera's frame
        arr = np.asarray(im)
    assert arr.std() > 20  # a real picture, not a flat fill
    assert arr[0, 128, 2] > arr[0, 128, 0]  # sky is blue at the top


def test_sample_image_draws() -> None:
    with Image.open(SAMPLE) as im:
        arr = np.asarray(im.convert("RGB"))
    out = draw_plan(arr, straight_plan(), [Box("car", 480, 490, 560, 580)], np.linspace(0.3, 1, 8), "sample")
    assert out.size == (256 + 128, 128 + STRIP_HEIGHT)
