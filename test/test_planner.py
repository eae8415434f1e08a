"""The planner facade: typed errors for bad inputs, and plans that always parse under the grammar constraint."""

import logging
import math

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.errors import CommandError, EgoStateError, ImageError, InputError
from wamdiff_ros.model import DecodeMeta, tiny_random
from wamdiff_ros.planner import Answer, Detection, EgoState, Planner, waypoint_confidence
from conftest import assert_parsed_plan

EGO = EgoState((5.0, 0.1), (0.2, 0.0))
ROUTE = np.array([[10.0, -0.77], [29.24, -4.17]])  # the route lane's centre 10 m and 30 m ahead, ego frame


@pytest.fixture(scope="module")
def planner(tiny_bundle):
    return Planner(tiny_bundle, DecodeSettings(block_size=32, steps=8, schedule="static"))


@pytest.mark.parametrize(
    "image, field, message",
    [
        (np.zeros((0, 0, 3), np.uint8), "image", "empty"),
        (np.zeros((64, 64), np.uint8), "image", "HxWx3"),
        (np.zeros((64, 64, 4), np.uint8), "image", "HxWx3"),
        (np.zeros((64, 64, 3), np.float32), "image", "uint8"),
        (np.zeros((8, 64, 3), np.uint8), "image", "smaller than"),
        (np.zeros((32, 6400, 3), np.uint8), "image", "aspect ratio"),
        ([[0, 0, 0]], "image", "numpy array"),
    ],
)
def test_bad_images_raise_image_error(planner, image, field, message):
    with pytest.raises(ImageError, match=message) as info:
        planner.plan(image, EGO, "left")
    assert info.value.field == field


@pytest.mark.parametrize(
    "ego, field",
    [
        (EgoState((math.nan, 0.0)), "ego.velocity"),
        (EgoState((1.0, 0.0), (0.0, math.inf)), "ego.acceleration"),
        (EgoState((1.0, 2.0, 3.0)), "ego.velocity"),
        (EgoState(("fast", 0.0)), "ego.velocity"),
        ((5.0, 0.0), "ego"),
    ],
)
def test_bad_ego_raises_ego_state_error(planner, road_image, ego, field):
    with pytest.raises(EgoStateError) as info:
        planner.plan(road_image, ego, "left")
    assert info.value.field == field and field in str(info.value)


@pytest.mark.parametrize("command", ["uturn", "", None, 3])
def test_unknown_command_raises_command_error(planner, road_image, command):
    with pytest.raises(CommandError, match="left, right, straight, follow"):
        planner.plan(road_image, EGO, command)


def test_empty_question_is_refused(planner, road_image):
    with pytest.raises(InputError, match="question"):
        planner.ask(road_image, "  ")


@pytest.mark.parametrize(
    "seed, settings",
    [
        (0, DecodeSettings(block_size=32, steps=32, schedule="threshold")),
        (1, DecodeSettings(block_size=32, steps=4, schedule="static")),
        (2, DecodeSettings(block_size=8, steps=2, schedule="static")),
        (3, DecodeSettings(block_size=4, steps=4, schedule="threshold")),
        (4, DecodeSettings(block_size=1, steps=1)),
        (5, DecodeSettings(block_size=16, steps=1, schedule="static")),  # one step: leftovers filled in-grammar
    ],
)
def test_constrained_plans_always_parse(seed, settings):
    planner = Planner(tiny_random(seed=seed), settings)
    rng = np.random.default_rng(seed)
    for command in ("left", "right", "straight", "follow"):
        image = rng.integers(0, 256, (96, 160, 3), dtype=np.uint8)
        ego = EgoState(tuple(rng.normal(0, 5, 2)), tuple(rng.normal(0, 1, 2)))
        plan = planner.plan(image, ego, command)
        assert fmt.parse_waypoints(plan.text).valid, (plan.reason, plan.text)
        assert plan.valid or plan.reason == plan.implausible  # random weights: what reflection left is the fallback
        assert fmt.waypoint_text_version(plan.text) == planner.bundle.meta.format_version == fmt.FORMAT_VERSION
        assert plan.waypoints.shape == (8, 2) and plan.waypoints.dtype == np.float32
        assert np.isfinite(plan.waypoints).all()
        assert plan.waypoint_confidence.shape == (8,)
        assert ((plan.waypoint_confidence > 0) & (plan.waypoint_confidence <= 1)).all()
        assert plan.stats.new_tokens == len(plan.text) + 1  # digits and punctuation: one token each, then EOS


def test_autoregressive_checkpoint_plans_with_the_constraint():
    bundle = tiny_random(seed=7, meta=DecodeMeta(prediction="next_token", trained_block_size=1,
                                                 prompt_attention="causal"))
    planner = Planner(bundle, DecodeSettings(block_size=1))
    plan = planner.plan(np.full((64, 128, 3), 90, np.uint8), EGO, "straight")
    assert plan.valid and plan.stats.mode == "ar"
    assert plan.stats.forward_calls == plan.stats.new_tokens - 1


def test_unconstrained_random_model_reports_invalid_without_raising(tiny_bundle, road_image):
    planner = Planner(tiny_bundle, DecodeSettings(block_size=32, steps=4, schedule="static", constrain=False))
    plan = planner.plan(road_image, EGO, "follow")
    assert not plan.valid and plan.reason
    assert np.array_equal(plan.waypoints, np.zeros((8, 2), np.float32))
    assert plan.stats.forward_calls > 0 and plan.stats.decode_s > 0 and plan.stats.prefill_s > 0


def test_detect_and_ask_return_typed_results(planner, road_image):
    det = planner.detect(road_image)
    assert isinstance(det, Detection) and isinstance(det.boxes, list) and isinstance(det.valid, bool)
    ans = planner.ask(road_image, "Is the lane to the left free?")
    assert isinstance(ans, Answer) and isinstance(ans.text, str) and ans.stats.new_tokens > 0


def test_waypoint_confidence_is_min_over_each_waypoints_tokens():
    texts = list("1.00,2.00,3.00,4.00") + [",0.00"] * 12 + ["<|im_end|>"]
    conf = [0.9] * 19 + [0.5] * 12 + [0.1]
    conf[6] = 0.3  # a token of number 2 (waypoint 1's y)
    out = waypoint_confidence(texts, conf)
    assert out[0] == pytest.approx(0.3) and out[1] == pytest.approx(0.9) and out[2] == pytest.approx(0.5)
    assert out[7] == pytest.approx(0.5)


def test_waypoint_confidence_counts_version_3_bin_letters():
    texts = list("001.00,e05.00") + [",000.00,e05.00"] * 7 + ["<|im_end|>"]
    conf = [0.9] * 13 + [0.5] * 7 + [0.1]
    conf[7] = 0.2  # the bin letter of waypoint 1's y
    out = waypoint_confidence(texts, conf)
    assert out[0] == pytest.approx(0.2) and out[1] == pytest.approx(0.5) and out[7] == pytest.approx(0.5)


def _spy_prompts(planner, monkeypatch) -> list[str]:
    """The user prompts ``planner`` decodes from, in order."""
    prompts, run = [], planner._run

    def spy(user_text, image, constraint, deadline=None, check=None):
        prompts.append(user_text)
        return run(user_text, image, constraint, deadline, check)

    monkeypatch.setattr(planner, "_run", spy)
    return prompts


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "wamdiff_ros.planner" and r.levelno == logging.WARNING]


def test_route_trained_model_uses_the_route_and_warns_once_without_one(tiny_bundle, road_image, caplog, monkeypatch):
    assert tiny_bundle.meta.route_points  # DecodeMeta's defaults are the shipped model's: trained with route points
    planner = Planner(tiny_bundle, DecodeSettings(block_size=32, steps=4, schedule="static"))
    prompts = _spy_prompts(planner, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="wamdiff_ros.planner"):
        used = planner.plan(road_image, EGO, "left", route=ROUTE)
        assert used.stats.route == "used" and not _warnings(caplog)
        missing = [planner.plan(road_image, EGO, command) for command in ("left", "right")]
    assert [p.stats.route for p in missing] == ["missing", "missing"]
    for p in (used, *missing):
        assert_parsed_plan(p)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "route" in warned[0].getMessage()  # once per planner, not once per plan
    assert fmt.route_line(ROUTE) in prompts[0]
    np.testing.assert_allclose(fmt.parse_route_line(prompts[0]), ROUTE)
    assert not any(fmt.has_route_line(p) for p in prompts[1:])
    assert prompts[0].replace(fmt.route_line(ROUTE) + "\n", "") == prompts[1]  # the route line is the one change


def test_model_without_route_points_ignores_a_given_route(road_image, caplog, monkeypatch):
    bundle = tiny_random(seed=2, meta=DecodeMeta(route_points=False))
    planner = Planner(bundle, DecodeSettings(block_size=32, steps=4, schedule="static"))
    prompts = _spy_prompts(planner, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="wamdiff_ros.planner"):
        given = planner.plan(road_image, EGO, "left", route=ROUTE)
        none = planner.plan(road_image, EGO, "left")
    assert given.stats.route == none.stats.route == "unused" and not _warnings(caplog)
    assert not any(fmt.has_route_line(p) for p in prompts)
    assert prompts[0] == prompts[1] == fmt.plan_prompt(fmt.Command.LEFT, EGO.velocity, EGO.acceleration)
    assert given.text == none.text  # the same prompt: the same greedy plan
