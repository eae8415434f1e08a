"""Tests for wamdiff_ros.world.metrics and wamdiff_ros.world.report: LB 2.0 / Bench2Drive scoring on synthetic logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from wamdiff_ros.world.comfort import comfort, comfort_signals, savgol
from wamdiff_ros.world.metrics import (
    PENALTY,
    EpisodeLog,
    EpisodeScore,
    Infraction,
    InfractionEvent,
    infraction_penalty,
    route_completion,
    score_episode,
)
from wamdiff_ros.world.report import markdown_table, plot_bev, write_report
from wamdiff_ros.world.summary import bootstrap_ci, paired_difference_ci, summarize
from wamdiff_ros.world.types import LaneStrip, RoadGeometry

DT = 0.1


def make_log(progress: np.ndarray, route_length_m: float = 200.0, on_lanes: np.ndarray | None = None,
             events: list[InfractionEvent] | None = None, end_reason: str = "completed", planner: str = "wam",
             scenario: str = "merge", seed: int = 0, mode: str = "paused", speed: float = 10.0) -> EpisodeLog:
    """A straight drive along +x whose route progress is ``progress``."""
    n = len(progress)
    t = DT * np.arange(n)
    return EpisodeLog(
        scenario=scenario, seed=seed, planner=planner, mode=mode, route_length_m=route_length_m,
        time_limit_s=60.0, dt=DT, t=t, x=speed * t, y=np.zeros(n), heading=np.zeros(n), speed=np.full(n, speed),
        progress_m=np.asarray(progress, dtype=np.float64),
        on_route_lanes=np.ones(n, bool) if on_lanes is None else on_lanes,
        events=events or [], end_reason=end_reason, plan_latency_s=[0.05, 0.07, 0.09])


def full_route(route_length_m: float = 200.0, **kwargs) -> EpisodeLog:
    return make_log(np.linspace(0.0, route_length_m, 201), route_length_m=route_length_m, **kwargs)


def trace_log(t: np.ndarray, x: np.ndarray, y: np.ndarray, heading: np.ndarray, speed: np.ndarray) -> EpisodeLog:
    n = len(t)
    return EpisodeLog(scenario="trace", seed=0, planner="p", mode="paused", route_length_m=100.0, time_limit_s=60.0,
                      dt=float(t[1] - t[0]), t=t, x=x, y=y, heading=heading, speed=speed, progress_m=np.zeros(n),
                      on_route_lanes=np.ones(n, bool))


def collision(kind: Infraction, t: float = 1.0, at_fault: bool = True) -> InfractionEvent:
    return InfractionEvent(kind=kind, t=t, actor=7, at_fault=at_fault, x=10.0, y=0.0)


# ---------------------------------------------------------------------------------------------------------------
# penalty and driving score


def test_two_vehicle_collisions_multiply_to_036() -> None:
    events = [collision(Infraction.COLLISION_VEHICLE, 1.0), collision(Infraction.COLLISION_VEHICLE, 5.0)]
    assert infraction_penalty(events) == pytest.approx(0.36)
    log = make_log(np.linspace(0.0, 150.0, 151), events=events, end_reason="timeout")
    score = score_episode(log)
    assert score.route_completion == pytest.approx(75.0)
    assert score.driving_score == pytest.approx(75.0 * 0.36)
    assert score.collisions == 2 and score.at_fault_collisions == 2 and score.rear_ended == 0
    assert score.infractions == {"collisions_vehicle": 2}
    assert not score.success


def test_lb2_penalty_table() -> None:
    assert infraction_penalty([collision(Infraction.COLLISION_STATIC)]) == pytest.approx(0.65)
    assert infraction_penalty([collision(Infraction.COLLISION_PEDESTRIAN)]) == pytest.approx(0.50)
    assert PENALTY[Infraction.RED_LIGHT] == 0.70 and PENALTY[Infraction.STOP_SIGN] == 0.80
    assert PENALTY[Infraction.SCENARIO_TIMEOUT] == 0.70 and PENALTY[Infraction.YIELD_EMERGENCY] == 0.70
    assert set(PENALTY) == set(Infraction)
    assert infraction_penalty([]) == 1.0
    ending = [InfractionEvent(k, 3.0) for k in (Infraction.ROUTE_DEVIATION, Infraction.ROUTE_TIMEOUT,
                                                Infraction.AGENT_BLOCKED, Infraction.OUTSIDE_LANES)]
    assert infraction_penalty(ending) == 1.0


def test_min_speed_changes_nothing() -> None:
    clean = score_episode(full_route())
    slow = score_episode(full_route(events=[InfractionEvent(Infraction.MIN_SPEED, 4.0, note="62%")]))
    assert slow.infraction_penalty == 1.0
    assert slow.driving_score == clean.driving_score == pytest.approx(100.0)
    assert slow.success and clean.success


def test_not_at_fault_collision_still_penalised_but_counted_apart() -> None:
    score = score_episode(full_route(events=[collision(Infraction.COLLISION_VEHICLE, at_fault=False)]))
    assert score.infraction_penalty == pytest.approx(0.6)  # LB 2.0 has no notion of fault
    assert score.collisions == 1 and score.at_fault_collisions == 0 and score.rear_ended == 1
    assert not score.success


# ---------------------------------------------------------------------------------------------------------------
# route completion


def test_offlane_advance_is_discounted() -> None:
    progress = np.linspace(0.0, 100.0, 101)  # 1 m per step
    on_lanes = np.ones(101, bool)
    on_lanes[41:71] = False  # the advances into steps 41..70: 30 m
    log = make_log(progress, route_length_m=200.0, on_lanes=on_lanes, end_reason="timeout")
    assert route_completion(log) == pytest.approx(35.0)
    assert score_episode(log).offlane_m == pytest.approx(30.0)


def test_backwards_progress_is_not_double_counted() -> None:
    progress = np.concatenate([np.linspace(0, 50, 51), np.linspace(49, 40, 10), np.linspace(41, 100, 60)])
    log = make_log(progress, route_length_m=200.0, end_reason="timeout")
    assert route_completion(log) == pytest.approx(50.0)
    # a small negative start (spawned just behind the route start) neither adds nor subtracts
    assert route_completion(make_log(np.linspace(-2.0, 100.0, 103))) == pytest.approx(50.0)


def test_rc_clipped_to_100() -> None:
    assert route_completion(make_log(np.linspace(0.0, 230.0, 231))) == 100.0


def test_wrong_exit_ends_at_40_percent() -> None:
    log = make_log(np.linspace(0.0, 80.0, 81), route_length_m=200.0, end_reason="route_deviation",
                   events=[InfractionEvent(Infraction.ROUTE_DEVIATION, 8.0)])
    score = score_episode(log)
    assert score.route_completion == pytest.approx(40.0)
    assert score.driving_score == pytest.approx(40.0)
    assert score.end_reason == "route_deviation"
    assert not score.success


def test_success_needs_full_route_and_no_infraction() -> None:
    assert score_episode(full_route()).success
    assert not score_episode(make_log(np.linspace(0.0, 199.0, 200))).success
    assert not score_episode(full_route(events=[InfractionEvent(Infraction.RED_LIGHT, 2.0)])).success
    assert not score_episode(full_route(events=[InfractionEvent(Infraction.OUTSIDE_LANES, 2.0)])).success


# ---------------------------------------------------------------------------------------------------------------
# comfort


def test_savgol_is_exact_on_quadratics() -> None:
    t = np.arange(30) * DT
    y = 3.0 * t**2 - 2.0 * t + 1.0
    for window in (5, 8):
        np.testing.assert_allclose(savgol(y, window, 2, DT), y, atol=1e-9)
        np.testing.assert_allclose(savgol(y, window, 2, DT, deriv=1), 6.0 * t - 2.0, atol=1e-9)


@pytest.mark.parametrize("dt", [0.05, 0.1, 0.2])
def test_comfort_smooth_traces_score_100(dt: float) -> None:
    t = np.arange(0.0, 20.0, dt)
    straight = trace_log(t, 10.0 * t, np.zeros_like(t), np.zeros_like(t), np.full_like(t, 10.0))
    assert comfort(straight) == 100.0
    radius, speed = 50.0, 10.0
    heading = speed / radius * t
    curve = trace_log(t, radius * np.sin(heading), radius * (1 - np.cos(heading)), heading + math.pi / 2 * 3,
                      np.full_like(t, speed))
    assert comfort(curve) == 100.0
    signals = comfort_signals(curve)
    np.testing.assert_allclose(signals.lat_accel, speed**2 / radius, atol=1e-6)
    np.testing.assert_allclose(signals.yaw_rate, speed / radius, atol=1e-6)


def test_comfort_penalises_hard_braking_and_swerving() -> None:
    t = np.arange(0.0, 20.0, DT)
    accel = np.where(t % 4.0 < 1.0, -6.0, 2.0)  # a 6 m/s^2 stop every 4 s
    braking = trace_log(t, np.zeros_like(t), np.zeros_like(t), np.zeros_like(t), 10.0 + np.cumsum(accel) * DT)
    assert comfort(braking) < 50.0
    swerve_heading = 0.5 * np.sin(np.pi * t)  # yaw rate up to 1.6 rad/s
    swerving = trace_log(t, np.zeros_like(t), np.zeros_like(t), swerve_heading, np.full_like(t, 10.0))
    assert comfort(swerving) < 50.0
    # smooth first half, swerving second half: about half of the 2 s segments are comfortable
    half = trace_log(t, np.zeros_like(t), np.zeros_like(t), np.where(t < 10.0, 0.0, swerve_heading),
                     np.full_like(t, 10.0))
    assert 30.0 <= comfort(half) <= 60.0
    assert score_episode(full_route()).comfort == 100.0


# ---------------------------------------------------------------------------------------------------------------
# statistics


def test_bootstrap_ci_contains_mean_and_narrows() -> None:
    rng = np.random.default_rng(1)
    small = rng.normal(50.0, 20.0, 20)
    large = rng.normal(50.0, 20.0, 500)
    m_small, lo_small, hi_small = bootstrap_ci(small)
    m_large, lo_large, hi_large = bootstrap_ci(large)
    assert lo_small <= m_small <= hi_small and lo_large <= m_large <= hi_large
    assert m_small == pytest.approx(small.mean())
    assert hi_large - lo_large < 0.5 * (hi_small - lo_small)
    assert bootstrap_ci([7.0]) == (7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))


def test_paired_difference_ci() -> None:
    a = [80.0, 40.0, 100.0, 10.0, 65.0]
    assert paired_difference_ci(a, list(a)) == (0.0, 0.0, 0.0)
    diff, lo, hi = paired_difference_ci([x + 5.0 for x in a], a)
    assert (diff, lo, hi) == pytest.approx((5.0, 5.0, 5.0))
    with pytest.raises(ValueError):
        paired_difference_ci([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------------------------------------------------
# serialisation


def test_episode_log_json_round_trip() -> None:
    on_lanes = np.ones(201, bool)
    on_lanes[5:9] = False
    log = full_route(on_lanes=on_lanes, events=[collision(Infraction.COLLISION_STATIC, 2.5, at_fault=False)])
    log.forward_calls_per_token, log.end_phase = 0.25, "junction"
    back = EpisodeLog.from_json(json.loads(json.dumps(log.to_json())))
    assert back.end_phase == "junction"
    for name in ("t", "x", "y", "heading", "speed", "progress_m"):
        np.testing.assert_array_equal(getattr(back, name), getattr(log, name))
    assert back.on_route_lanes.dtype == bool and (back.on_route_lanes == on_lanes).all()
    assert back.events == log.events and back.events[0].kind is Infraction.COLLISION_STATIC
    assert (back.scenario, back.seed, back.planner, back.mode, back.end_reason) == ("merge", 0, "wam", "paused",
                                                                                 "completed")
    assert back.plan_latency_s == log.plan_latency_s and back.forward_calls_per_token == 0.25
    score = score_episode(log)
    assert EpisodeScore.from_json(json.loads(json.dumps(score.to_json()))) == score


def test_episode_log_rejects_ragged_traces() -> None:
    with pytest.raises(ValueError):
        EpisodeLog("s", 0, "p", "paused", 100.0, 60.0, DT, t=np.arange(3), x=np.zeros(3), y=np.zeros(3),
                   heading=np.zeros(3), speed=np.zeros(2), progress_m=np.zeros(3), on_route_lanes=np.ones(3, bool))


# ---------------------------------------------------------------------------------------------------------------
# summary and report


def synthetic_scores() -> list[EpisodeScore]:
    logs = [
        # planner "wam": two clean routes and a vehicle collision at 50 % -> DS 100, 100, 30
        full_route(planner="wam", scenario="merge", seed=0),
        full_route(planner="wam", scenario="merge", seed=1),
        make_log(np.linspace(0.0, 100.0, 101), planner="wam", scenario="exit", seed=0, end_reason="timeout",
                 events=[collision(Infraction.COLLISION_VEHICLE)]),
        # planner "ar": DS 100, 50 (wrong exit), 65 (static collision on a full route)
        full_route(planner="ar", scenario="merge", seed=0),
        make_log(np.linspace(0.0, 100.0, 101), planner="ar", scenario="merge", seed=1, end_reason="route_deviation"),
        full_route(planner="ar", scenario="exit", seed=0, events=[collision(Infraction.COLLISION_STATIC)]),
    ]
    logs[2].end_phase = "junction"  # a junction route cut short in the ring / box
    logs[5].end_phase = "exit"  # completed: not counted as cut short
    return [score_episode(log) for log in logs]


def test_summarize_and_markdown_numbers() -> None:
    summary = summarize(synthetic_scores())
    groups = {g["planner"]: g for g in summary["groups"]}
    wam, ar = groups["wam"], groups["ar"]
    assert wam["episodes"] == 3 and wam["mode"] == "paused"
    assert wam["ds"] == pytest.approx(230.0 / 3) and ar["ds"] == pytest.approx(215.0 / 3)
    assert wam["ds_lo"] <= wam["ds"] <= wam["ds_hi"]
    assert wam["sr"] == pytest.approx(200.0 / 3) and ar["sr"] == pytest.approx(100.0 / 3)
    assert wam["rc"] == pytest.approx(250.0 / 3) and ar["rc"] == pytest.approx(250.0 / 3)
    assert wam["penalty"] == pytest.approx(2.6 / 3) and ar["penalty"] == pytest.approx(2.65 / 3)
    assert wam["collisions_per_ep"] == pytest.approx(1 / 3) and ar["at_fault_per_ep"] == pytest.approx(1 / 3)
    assert wam["latency_p50_ms"] == pytest.approx(70.0)
    assert wam["per_scenario_ds"] == {"exit": pytest.approx(30.0), "merge": pytest.approx(100.0)}
    assert ar["per_scenario_ds"] == {"exit": pytest.approx(65.0), "merge": pytest.approx(75.0)}
    assert ar["end_reasons"] == {"completed": 2, "route_deviation": 1}
    assert wam["unfinished_phases"] == {"junction": 1} and ar["unfinished_phases"] == {}
    (paired,) = summary["paired"]
    assert (paired["a"], paired["b"], paired["episodes"]) == ("ar", "wam", 3)
    assert paired["ds_diff"] == pytest.approx(-5.0)  # (0 - 50 + 35) / 3
    scenario_rows = {(r["scenario"], r["planner"]): r for r in summary["per_scenario"]}
    assert scenario_rows[("merge", "ar")]["episodes"] == 2 and scenario_rows[("merge", "ar")]["sr"] == 50.0

    text = markdown_table(summary)
    wam_row = next(line for line in text.splitlines() if line.startswith("| wam | paused |"))
    cells = [c.strip() for c in wam_row.strip("|").split("|")]
    assert cells[2] == "3"
    assert cells[3].startswith("76.7 [")
    assert cells[4:] == ["66.7", "83.3", "0.867", "0.33", "0.33", "100.0", "70.0"]
    merge_row = next(line for line in text.splitlines() if line.startswith("| merge |"))
    assert merge_row == "| merge | 75.0 (2) | 100.0 (2) |"
    assert "| paused | ar | wam | 3 | -5.0 [" in text
    assert "| exit | wam | paused | 0 | 1 | 0 |" in text and "| exit | ar |" not in text


def test_write_report_and_bev(tmp_path: Path) -> None:
    collided = make_log(np.linspace(0.0, 100.0, 101), planner="wam", scenario="exit", end_reason="timeout",
                        events=[collision(Infraction.COLLISION_VEHICLE), collision(Infraction.COLLISION_VEHICLE,
                                                                                   t=3.0, at_fault=False)])
    other = full_route(planner="ar", scenario="exit")
    other.y = other.y + 3.5
    logs = [collided, other]
    centre = np.stack([np.linspace(-10.0, 250.0, 27), np.zeros(27)], axis=1)
    road = RoadGeometry(lanes=(LaneStrip(centre, np.full(27, 3.5)), LaneStrip(centre + (0.0, 3.5), np.full(27, 3.5))))
    png = plot_bev(logs, tmp_path / "bev.png", road=road)
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    scores = [score_episode(log) for log in logs]
    paths = write_report(scores, logs, tmp_path / "report", roads={"exit": road})
    data = json.loads(paths.json.read_text())
    assert len(data["episodes"]) == 2 and {g["planner"] for g in data["summary"]["groups"]} == {"wam", "ar"}
    assert data["episodes"][0]["driving_score"] == pytest.approx(50.0 * 0.36)
    assert "| ar | paused | 1 | 100.0 [100.0, 100.0] |" in paths.markdown.read_text()
    assert [p.name for p in paths.bev] == ["exit_seed0.png"] and paths.bev[0].stat().st_size > 1000
