"""Tests for wamdiff_ros.world.camera: projection against the pinhole formula, occlusion labelling, culling, clipping,
road and sky pixels, determinism, and agreement with the plan overlay's CameraModel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wamdiff_ros.bench.render import highway_road, roundabout_scene
from wamdiff_ros.world.camera import (
    NEAR_M, CameraConfig, CameraConfigError, FrontCamera, LabelledBox, clip_near)
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.world.road_mesh import ASPHALT_RGB, MARKING_RGB
from wamdiff_ros.world.types import LINE_DASHED, LINE_SOLID, LaneStrip, RoadGeometry, VehicleBox

CFG = CameraConfig()
W, H = CFG.width, CFG.height
EGO = Pose2D(0.0, 0.0, 0.0)
EMPTY = RoadGeometry(())


def car(vid: int, x: float, y: float, heading: float = 0.0, **kw) -> VehicleBox:
    return VehicleBox(vid, Pose2D(x, y, heading), **kw)


def by_hand(x: float, y: float, z: float) -> tuple[float, float]:
    """Pinhole pixel of an ego-frame point for the default config, written out independently of the code."""
    f = (W / 2) / math.tan(math.radians(CFG.fov_deg / 2))
    p = math.radians(CFG.pitch_deg)
    dx, dz = x - CFG.mount_forward_m, z - CFG.mount_height_m
    depth = dx * math.cos(p) - dz * math.sin(p)
    down = -dx * math.sin(p) - dz * math.cos(p)
    return W / 2 - f * y / depth, H / 2 + f * down / depth


def box_by_hand(v: VehicleBox) -> tuple[float, float, float, float]:
    c, s = math.cos(v.pose.heading), math.sin(v.pose.heading)
    uv = [by_hand(v.pose.x + c * lx - s * ly, v.pose.y + s * lx + c * ly, z)
          for lx in (-v.length / 2, v.length / 2) for ly in (-v.width / 2, v.width / 2) for z in (0.0, v.height)]
    us, vs = [p[0] for p in uv], [p[1] for p in uv]
    return max(0.0, min(us)), max(0.0, min(vs)), min(W, max(us)), min(H, max(vs))


def pixels(b: LabelledBox) -> tuple[float, float, float, float]:
    return b.box.x1 * W / 1000, b.box.y1 * H / 1000, b.box.x2 * W / 1000, b.box.y2 * H / 1000


def render(vehicles: list[VehicleBox], road: RoadGeometry = EMPTY, ego: Pose2D = EGO, cfg: CameraConfig = CFG):
    return FrontCamera(road, cfg).render(ego, vehicles)


# ---------------------------------------------------------------------------------------------------------------
# geometry and labels


@pytest.mark.parametrize("vehicle", [car(1, 20.0, 0.0), car(2, 15.0, 3.5), car(3, 12.0, -4.0, 0.6, height=3.0)])
def test_box_matches_the_pinhole_formula(vehicle: VehicleBox) -> None:
    frame = render([vehicle])
    assert [b.vehicle_id for b in frame.boxes] == [vehicle.id]
    b = frame.boxes[0]
    assert b.box.label == "car" and b.box.score == 1.0 and b.visible_fraction == 1.0
    assert pixels(b) == pytest.approx(box_by_hand(vehicle), abs=2.0)


def test_vehicle_hidden_behind_a_nearer_one_is_not_labelled() -> None:
    frame = render([car(7, 30.0, 0.0), car(8, 15.0, 0.0)])
    assert [b.vehicle_id for b in frame.boxes] == [8]


def test_partly_occluded_vehicle_above_the_threshold_is_labelled() -> None:
    frame = render([car(7, 30.0, 2.5), car(8, 15.0, 0.0)])
    assert [b.vehicle_id for b in frame.boxes] == [8, 7]  # near to far
    far = frame.boxes[1]
    assert CFG.min_visible_fraction <= far.visible_fraction < 0.95
    assert frame.boxes[0].visible_fraction == 1.0
    strict = render([car(7, 30.0, 2.5), car(8, 15.0, 0.0)], cfg=CameraConfig(min_visible_fraction=0.99))
    assert [b.vehicle_id for b in strict.boxes] == [8]


def test_boxes_are_sorted_near_to_far() -> None:
    frame = render([car(1, 60.0, -4.0), car(2, 12.0, 4.0), car(3, 30.0, 0.0)])
    assert [b.vehicle_id for b in frame.boxes] == [2, 3, 1]


@pytest.mark.parametrize("vehicle", [car(1, -20.0, 0.0), car(2, 200.0, 0.0), car(3, 10.0, 30.0), car(4, 8.0, -25.0)],
                         ids=["behind", "beyond-range", "outside-fov-left", "outside-fov-right"])
def test_vehicles_out_of_view_are_not_labelled(vehicle: VehicleBox) -> None:
    assert render([vehicle]).boxes == []


def test_too_small_box_is_not_labelled() -> None:
    assert render([car(1, 80.0, 0.0)]).boxes  # about 3 px wide, 2.5 px high: above the default 2 px
    assert render([car(1, 80.0, 0.0)], cfg=CameraConfig(min_box_px=3)).boxes == []


def test_vehicle_crossing_the_image_edge_gets_a_clipped_box() -> None:
    vehicle = car(5, 10.0, 9.0)
    (b,) = render([vehicle]).boxes
    assert b.box.x1 == 0.0 and 0.0 < b.box.x2 < 1000.0
    assert pixels(b) == pytest.approx(box_by_hand(vehicle), abs=2.0)


def test_vehicle_alongside_crossing_the_camera_plane_is_clipped_not_mirrored() -> None:
    frame = render([car(6, 2.0, 3.5, speed=10.0)])  # from 1.5 m behind the camera to 3.5 m ahead
    (b,) = frame.boxes
    assert b.box.x1 == 0.0 and b.box.x2 < 500.0  # its front shows on the left edge only
    body = (frame.image != render([]).image).any(axis=2)
    assert body[:, : W // 2].any() and not body[:, W // 2:].any()


def test_only_the_other_vehicles_are_drawn_and_far_covers_nothing_near() -> None:
    near, far = car(1, 12.0, 0.0, rgb=(0, 0, 250)), car(2, 40.0, 0.0, rgb=(250, 0, 0), height=4.0)
    img = render([far, near]).image
    u, v = by_hand(12.0 - 2.5, 0.0, 0.3)  # low on the near car's back face
    assert img[int(v), int(u)].tolist() == [0, 0, int(250 * 0.56)]  # the back face's shade, not the far red truck


# ---------------------------------------------------------------------------------------------------------------
# picture


def test_image_shape_dtype_and_determinism() -> None:
    road = highway_road(300.0)
    cars = [car(1, 25.0, -4.0), car(2, 40.0, 0.0, 0.1), car(3, 18.0, -8.0)]
    a = FrontCamera(road).render(Pose2D(10.0, -4.0, 0.02), cars)
    b = FrontCamera(road).render(Pose2D(10.0, -4.0, 0.02), cars)
    assert a.image.shape == (H, W, 3) and a.image.dtype == np.uint8
    assert a.image.tobytes() == b.image.tobytes() and a.boxes == b.boxes
    small = FrontCamera(road, CameraConfig(width=96, height=48)).render(Pose2D(10.0, -4.0, 0.02), cars)
    assert small.image.shape == (48, 96, 3)


def test_road_and_markings_are_visible_on_a_straight_highway() -> None:
    img = render([], highway_road(300.0), Pose2D(15.0, -4.0, 0.0)).image  # a dash 2-5 m ahead of the camera
    assert img[H - 8, W // 2].tolist() == list(ASPHALT_RGB)  # lower middle: the ego's lane
    marking = (img == MARKING_RGB).all(axis=2)
    assert marking[int(CFG.horizon_v()) + 2:].sum() > 50
    assert not marking[: int(CFG.horizon_v())].any()  # nothing of the road above the horizon
    rows = np.nonzero(marking.any(axis=1))[0]
    assert rows.max() > H * 0.75  # near dashes reach the lower part of the image


def test_horizon_is_where_the_pitch_puts_it() -> None:
    img = render([]).image.astype(int)
    v_h = H / 2 - (W / 2) * math.tan(math.radians(CFG.pitch_deg))  # f = W / 2 at 90 degrees
    assert CFG.horizon_v() == pytest.approx(v_h)
    sky, ground = img[math.floor(v_h) - 1, W // 2], img[math.ceil(v_h) + 1, W // 2]
    assert sky[2] > sky[0] and sky[2] > sky[1]  # blue
    assert ground[1] > ground[0] and ground[1] > ground[2]  # green
    tilted = render([], cfg=CameraConfig(pitch_deg=0.0)).image.astype(int)
    assert tilted[H // 2 - 1, W // 2, 2] > tilted[H // 2 - 1, W // 2, 0]
    assert tilted[H // 2 + 1, W // 2, 1] > tilted[H // 2 + 1, W // 2, 2]


def test_lane_starting_behind_the_ego_is_clipped_at_the_near_plane() -> None:
    x = np.linspace(-50.0, 100.0, 4)
    lane = LaneStrip(np.stack([x, np.zeros_like(x)], axis=1), np.full(4, 4.0), LINE_SOLID, LINE_DASHED)
    img = render([], RoadGeometry((lane,))).image
    assert img[H - 1, W // 2].tolist() == list(ASPHALT_RGB)
    assert (img[: int(CFG.horizon_v()) - 1] != ASPHALT_RGB).any(axis=2).all()  # no mirrored road in the sky


def test_clip_near_cuts_a_polygon_at_the_near_plane() -> None:
    square = np.array([[[-1.0, 1.0, -2.0], [1.0, 1.0, -2.0], [1.0, 1.0, 4.0], [-1.0, 1.0, 4.0]]])
    (cut,) = clip_near(square)
    assert len(cut) == 4 and cut[:, 2].min() == pytest.approx(NEAR_M) and cut[:, 2].max() == 4.0
    (gone,) = clip_near(square - [0.0, 0.0, 10.0])
    assert len(gone) == 0


def test_roundabout_renders_curved_asphalt() -> None:
    scene = roundabout_scene()
    ego, cars = scene.state(0)
    frame = FrontCamera(scene.road).render(ego, cars)
    asphalt = (frame.image == ASPHALT_RGB).all(axis=2)
    assert asphalt[H - 4, W // 2] and asphalt.sum() > 0.2 * W * H
    # the ring bends left (counter-clockwise): more road on the left half just below the horizon
    band = asphalt[int(CFG.horizon_v()) + 2: int(CFG.horizon_v()) + 12]
    assert band[:, : W // 2].sum() > band[:, W // 2:].sum()


# ---------------------------------------------------------------------------------------------------------------
# the plan overlay's camera


def test_camera_model_projects_like_the_renderer() -> None:
    model = CFG.camera_model()
    assert (model.fov_deg, model.height_m, model.pitch_deg, model.forward_m) == (90.0, 1.5, 5.0, 1.0)
    (b,) = render([car(1, 20.0, 0.0)]).boxes
    x1, _, _, y2 = pixels(b)
    ground, front = model.project(np.array([[20.0 - 2.5, 1.0]]), W, H)  # near bottom-left corner: the box bottom
    assert front.all() and ground[0, 1] == pytest.approx(y2, abs=1e-6)
    assert ground[0] == pytest.approx(by_hand(17.5, 1.0, 0.0))
    roof, ok = model.project_points(np.array([[17.5, 1.0, 1.5]]), W, H)  # near top-left corner: the box left
    assert ok.all() and roof[0, 0] == pytest.approx(x1, abs=1e-6)
    assert roof[0] == pytest.approx(by_hand(17.5, 1.0, 1.5))
    img = render([car(1, 20.0, 0.0, rgb=(250, 0, 0))]).image
    red_rows = np.nonzero((img[:, W // 2] == [int(250 * 0.56), 0, 0]).all(axis=1))[0]
    assert red_rows.max() + 1 == pytest.approx(ground[0, 1], abs=1.5)  # the drawn car ends where the overlay puts it


@pytest.mark.parametrize("kwargs, field", [({"width": 0}, "width"), ({"height": 12.5}, "height"),
                                           ({"fov_deg": 180.0}, "fov_deg"), ({"max_range_m": float("nan")},
                                                                             "max_range_m"),
                                           ({"min_visible_fraction": 1.5}, "min_visible_fraction"),
                                           ({"mount_height_m": -1.0}, "mount_height_m")])
def test_config_is_validated(kwargs: dict, field: str) -> None:
    with pytest.raises(CameraConfigError) as e:
        CameraConfig(**kwargs)
    assert isinstance(e.value, ValueError) and e.value.field == field and field in str(e.value)


def test_road_entirely_outside_the_view_renders_sky_and_grass_only() -> None:
    """Regression: with every road chunk in front of the camera but out of the image, nothing is drawn."""
    strip = LaneStrip(np.array([[5.0, 30.0], [25.0, 30.0]]), np.array([3.5, 3.5]), LINE_DASHED, LINE_SOLID)
    road = RoadGeometry((strip,))
    frame = render([], road=road, ego=Pose2D(0.0, 0.0, 0.0))
    blank = render([])
    assert np.array_equal(frame.image, blank.image)
