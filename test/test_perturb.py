"""Deployment perturbations (``wamdiff_ros/world/perturb.py``): each injection's statistics from a seeded run, their
independence and reproducibility, and their effect inside ``run_episode``."""

from __future__ import annotations

import numpy as np
import pytest

from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.world import closed_loop
from wamdiff_ros.world.camera import CameraFrame
from wamdiff_ros.world.closed_loop import ExpertPlanner, LoopConfig, Observation, PlanResult, run_episode
from wamdiff_ros.world.perturb import (LEVELS, FrameDrop, Perturbation, Perturber, label, parse_perturbations,
                                       _rng)
from wamdiff_ros.world.scenarios import SPLIT_SEED_BASE, load_scenarios

SEED = SPLIT_SEED_BASE["test"]
SIM_HZ = 20.0


def test_parse_and_label():
    assert parse_perturbations(None) == () == parse_perturbations("") == parse_perturbations("none")
    assert parse_perturbations("frame_drop=2, latency") == (Perturbation("frame_drop", 2), Perturbation("latency", 1))
    assert label(parse_perturbations("gnss=2,speed")) == "gnss=2+speed=1" and label(()) == "clean"
    for bad in ("fog", "gnss=3", "gnss=x", "gnss,gnss=2"):
        with pytest.raises(ValueError):
            parse_perturbations(bad)
    with pytest.raises(ValueError, match="Perturbation"):
        LoopConfig(perturb="gnss")


@pytest.mark.parametrize("severity", [1, 2])
def test_burst_frame_drop_repeats_p_times_bursts_of_the_drawn_length(severity):
    """Bench2Drive-Robust's burst: started with probability p on a tick outside one, D + 1 ticks long (the trigger
    tick too), D uniform in 2..max_ticks. Over N ticks the frozen share is p L / (1 + p L), L = E[D] + 1."""
    params = LEVELS["frame_drop"][severity - 1]
    p, top = params["p"], params["max_ticks"]
    drop, n = FrameDrop(p, top, _rng(SEED, "frame_drop")), 200_000
    runs, run = [], 0
    for _ in range(n):
        drop.starts_next()
        if drop.tick():
            run += 1
        elif run:
            runs.append(run)
            run = 0
    mean_len = (2 + top) / 2 + 1
    expected = p * mean_len / (1 + p * mean_len)
    assert drop.frozen_ticks / n == pytest.approx(expected, rel=0.06)
    assert drop.bursts == pytest.approx(p * (n - drop.frozen_ticks), rel=0.06)
    # a burst can follow the last one directly, so runs of frozen ticks are one or more bursts
    assert min(runs) >= 3 and np.mean([r for r in runs if r <= top + 1]) == pytest.approx(mean_len, rel=0.1)


def _frame(value: int) -> CameraFrame:
    return CameraFrame(np.full((128, 256, 3), value, np.uint8), [])


def test_a_burst_delivers_the_last_image_from_before_it_again():
    perturber = Perturber(parse_perturbations("frame_drop=1"), SEED, SIM_HZ)  # bursts of 3-6 ticks
    now = {"t": 0}
    render = lambda: _frame(now["t"])  # noqa: E731 - the image says the tick it was rendered at
    seen = []
    for tick in range(40):
        now["t"] = tick
        perturber._drop.p = 1.0 if tick in (0, 10) else 0.0  # bursts drawn on ticks 0 and 10, for ticks 1 and 11
        seen.append(int(perturber.camera(render).image[0, 0, 0]))
        perturber.before_tick(render)
        perturber.after_tick()
    lengths = []
    for start in (1, 11):
        assert seen[start - 1] == start - 1  # the frame before the burst was fresh ...
        n = next(i for i in range(start, 40) if seen[i] == i) - start
        assert seen[start:start + n] == [start - 1] * n  # ... and repeats for the whole burst
        lengths.append(n)
    assert all(3 <= n <= 6 for n in lengths)  # D + 1 ticks, D in 2..5
    assert perturber.stats["repeated_frames"] == sum(lengths) == perturber.stats["frozen_ticks"]


def test_a_burst_that_follows_a_burst_keeps_repeating_the_image_delivered_last():
    perturber = Perturber(parse_perturbations("frame_drop"), SEED, SIM_HZ)
    perturber._drop.p = 1.0  # every tick outside a burst starts one: the stream never moves on
    now = {"t": 0}
    seen = []
    for tick in range(30):
        now["t"] = tick
        seen.append(int(perturber.camera(lambda: _frame(now["t"])).image[0, 0, 0]))
        perturber.before_tick(lambda: _frame(now["t"]))
        perturber.after_tick()
    assert seen == [0] * 30 and perturber.stats["bursts"] >= 5


@pytest.mark.parametrize("severity", [1, 2])
def test_occlusion_covers_ratio_by_ratio_at_random_places(severity):
    params = LEVELS["occlusion"][severity - 1]
    perturber = Perturber([Perturbation("occlusion", severity)], SEED, SIM_HZ)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (128, 256, 3), dtype=np.uint8)
    corners = set()
    for _ in range(20):
        out = perturber.camera(lambda: CameraFrame(image, [])).image
        changed = np.argwhere((out != image).any(axis=2))
        (top, left), (bottom, right) = changed.min(axis=0), changed.max(axis=0)
        corners.add((int(top), int(left)))
        h, w = int(128 * params["ratio"]), int(256 * params["ratio"])
        assert bottom - top + 1 <= h and right - left + 1 <= w  # inside the patch
        if params["fill"] == "black":
            assert (bottom - top + 1, right - left + 1) == (h, w) and (out[top:bottom + 1, left:right + 1] == 0).all()
        else:  # blurred: smoother than the noise it replaced, untouched outside
            assert (bottom - top + 1) >= h - 2 and (right - left + 1) >= w - 2
            patch = out[top:bottom + 1, left:right + 1].astype(float)
            assert np.abs(np.diff(patch, axis=1)).mean() < 0.2 * np.abs(np.diff(image.astype(float), axis=1)).mean()
        outside = np.ones(image.shape[:2], bool)
        outside[top:bottom + 1, left:right + 1] = False
        assert (out[outside] == image[outside]).all()
    assert len(corners) >= 15  # redrawn every frame
    assert perturber.stats["occluded_frames"] == 20


@pytest.mark.parametrize("severity", [1, 2])
def test_gnss_noise_is_independent_gaussian_per_reading_on_position_only(severity):
    sigma = LEVELS["gnss"][severity - 1]["sigma_m"]
    perturber = Perturber([Perturbation("gnss", severity)], SEED, SIM_HZ)
    truth = Pose2D(100.0, -20.0, 0.3)
    readings = [perturber.pose(truth) for _ in range(20_000)]
    err = np.array([[r.x - truth.x, r.y - truth.y] for r in readings])
    assert all(r.heading == truth.heading for r in readings)
    assert np.abs(err.mean(axis=0)).max() < 4 * sigma / np.sqrt(len(err))
    np.testing.assert_allclose(err.std(axis=0), sigma, rtol=0.03)
    lag1 = np.corrcoef(err[1:, 0], err[:-1, 0])[0, 1]
    assert abs(lag1) < 0.03  # no random walk: readings are independent


@pytest.mark.parametrize("severity", [1, 2])
def test_speed_noise_multiplies_by_a_fresh_gaussian_draw(severity):
    params = LEVELS["speed"][severity - 1]
    perturber = Perturber([Perturbation("speed", severity)], SEED, SIM_HZ)
    factors = np.array([perturber.speed_factor() for _ in range(20_000)])
    assert factors.mean() == pytest.approx(params["mean"], abs=4 * params["std"] / np.sqrt(len(factors)))
    assert factors.std() == pytest.approx(params["std"], rel=0.03)
    assert Perturber([], SEED, SIM_HZ).speed_factor() == 1.0


@pytest.mark.parametrize("severity,ticks", [(1, 2), (2, 4)])
def test_latency_delays_every_command_by_whole_ticks(severity, ticks):
    perturber = Perturber([Perturbation("latency", severity)], SEED, SIM_HZ)
    assert perturber.delay_ticks == ticks == int(LEVELS["latency"][severity - 1]["ms"] * SIM_HZ / 1000)
    out = [perturber.actuate((float(i), -float(i))) for i in range(1, 11)]
    assert out[:ticks] == [(0.0, 0.0)] * ticks  # zero control until the first command arrives
    assert out[ticks:] == [(float(i), -float(i)) for i in range(1, 11 - ticks)]


def test_draws_are_seeded_and_each_perturbation_has_its_own_stream():
    truth = Pose2D(0.0, 0.0, 0.0)
    a = Perturber(parse_perturbations("gnss"), SEED, SIM_HZ)
    b = Perturber(parse_perturbations("speed,gnss,occlusion"), SEED, SIM_HZ)
    c = Perturber(parse_perturbations("gnss"), SEED + 1, SIM_HZ)
    pa, pb, pc = ([(q.pose(truth).x, q.speed_factor()) for _ in range(5)] for q in (a, b, c))
    assert [x for x, _ in pa] == [x for x, _ in pb]  # adding perturbations leaves gnss's draws as they were
    assert [x for x, _ in pa] != [x for x, _ in pc]
    assert Perturber(parse_perturbations("gnss"), SEED, SIM_HZ).pose(truth) == Perturber(
        parse_perturbations("gnss"), SEED, SIM_HZ).pose(truth)


# --------------------------------------------------------------------------------------------------------------
# inside run_episode


@pytest.fixture(scope="module")
def short_set(short_scenario_file):
    return load_scenarios(short_scenario_file)


class Recorder:
    """The expert, recording what it was shown: frames, speeds, poses and route points."""

    name, needs_camera = "recorder", True

    def reset(self, world) -> None:
        self._expert = ExpertPlanner()
        self._expert.reset(world)
        self.seen = []

    def plan(self, obs: Observation, route=None) -> PlanResult:
        self.seen.append({"image": obs.frame.image.copy(), "velocity": obs.ego_velocity, "pose": obs.pose,
                          "true_pose": obs.world.ego_pose, "true_velocity": obs.world.ego_velocity(),
                          "route": route, "true_route": obs.world.route_points()})
        return self._expert.plan(obs, route)


def test_a_clean_episode_is_unchanged_and_logs_no_perturbation(short_set):
    spec = short_set.get("highway")
    a = run_episode(spec, SEED, ExpertPlanner(), LoopConfig(), short_set).log
    b = run_episode(spec, SEED, ExpertPlanner(), LoopConfig(perturb=()), short_set).log
    assert a.perturbation == {} and np.array_equal(a.x, b.x) and np.array_equal(a.speed, b.speed)


def test_ego_state_perturbations_reach_what_the_agent_reads(short_set):
    spec = short_set.get("intersection")
    rec = Recorder()
    log = run_episode(spec, SEED, rec, LoopConfig(plan_hz=10.0, perturb=parse_perturbations("gnss=2,speed=2")),
                      short_set).log
    assert log.perturbation["label"] == "gnss=2+speed=2" and len(rec.seen) >= 20
    offsets = np.array([[s["pose"].x - s["true_pose"].x, s["pose"].y - s["true_pose"].y] for s in rec.seen])
    assert 5.0 < offsets.std() < 30.0  # sigma 15 m
    moving = [s for s in rec.seen if s["true_velocity"][0] > 1.0]
    ratios = [s["velocity"][0] / s["true_velocity"][0] for s in moving]
    assert 0.2 < np.mean(ratios) < 0.8  # N(0.5, 0.2)
    # the route points are the route seen from the noisy pose
    s = rec.seen[-1]
    assert not np.allclose(s["route"], s["true_route"])
    np.testing.assert_allclose(s["pose"].to_world(s["route"]), s["true_pose"].to_world(s["true_route"]), atol=1e-6)


def test_frame_drop_and_latency_in_an_episode(short_set, monkeypatch):
    spec = short_set.get("highway")
    applied = []
    real_step = closed_loop.World.step

    def step(self, acceleration, steer):
        applied.append((acceleration, steer))
        return real_step(self, acceleration, steer)

    monkeypatch.setattr(closed_loop.World, "step", step)
    monkeypatch.setitem(LEVELS, "frame_drop", ({"p": 0.3, "max_ticks": 5}, LEVELS["frame_drop"][1]))
    rec = Recorder()
    log = run_episode(spec, SEED, rec, LoopConfig(plan_hz=20.0, perturb=parse_perturbations("frame_drop,latency")),
                      short_set).log
    stats = log.perturbation
    assert stats["bursts"] > 3 and stats["repeated_frames"] > 0 and stats["camera_ticks"] == log.steps - 1  # the trace has the start too
    repeats = sum(np.array_equal(a["image"], b["image"]) for a, b in zip(rec.seen, rec.seen[1:]))
    assert repeats >= stats["repeated_frames"] - stats["bursts"]
    assert applied[:2] == [(0.0, 0.0), (0.0, 0.0)]  # 100 ms at 20 Hz: the first command acts on tick 3


def test_with_the_answer_a_repeated_frame_is_not_planned_as_new(short_set, monkeypatch):
    monkeypatch.setitem(LEVELS, "frame_drop", ({"p": 0.3, "max_ticks": 5}, LEVELS["frame_drop"][1]))
    spec = short_set.get("highway")
    config = dict(plan_hz=20.0, perturb=parse_perturbations("frame_drop"))
    plain, answered = Recorder(), Recorder()
    run_episode(spec, SEED, plain, LoopConfig(**config), short_set)
    log = run_episode(spec, SEED, answered, LoopConfig(**config, answers=("repeated_frame",)), short_set).log
    same = lambda seen: sum(np.array_equal(a["image"], b["image"]) for a, b in zip(seen, seen[1:]))  # noqa: E731
    assert same(plain.seen) > 5 and same(answered.seen) == 0
    assert log.perturbation["repeats_skipped"] > 5 and log.perturbation["answers"] == ["repeated_frame"]
    assert len(answered.seen) + log.perturbation["repeats_skipped"] == len(plain.seen)


def test_answers_are_checked_and_leave_a_clean_episode_close_to_unanswered(short_set):
    with pytest.raises(ValueError, match="answers"):
        LoopConfig(answers=("prayer",))
    spec = short_set.get("highway")
    a = run_episode(spec, SEED, ExpertPlanner(), LoopConfig(), short_set).log
    b = run_episode(spec, SEED, ExpertPlanner(), LoopConfig(answers=closed_loop.ANSWERS), short_set).log
    assert b.perturbation["pose_jumps"] == 0 and b.perturbation["speed_scaled"] == 0
    assert np.abs(a.x - b.x).max() < 0.5 and np.abs(a.speed - b.speed).max() < 0.5
