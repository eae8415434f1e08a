"""Anytime plans: past its deadline the block decoder answers its best so far (the tokens fixed by then, the rest one
forward's argmax under the plan grammar), flagged; before it, nothing changes. The closed-loop planner answers a cut
plan as the node does (the anytime plan, or the fallback stop)."""

import itertools
import time

import numpy as np
import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding import block
from wamdiff_ros.planner import ANYTIME_MAX_SPEED, EgoState, Planner, _plausible

EGO = EgoState((8.0, 0.0), (0.2, 0.0))
ROUTE = np.array([[10.0, 0.0], [30.0, 0.5]])


@pytest.fixture(scope="module")
def planner():
    return Planner.from_pretrained("wamdiff-tiny")


@pytest.fixture(scope="module")
def full(planner, road_image):
    return planner.plan(road_image, EGO, "follow", route=ROUTE)


def _grammar_allows(planner, tokens):
    mask = planner._grammar.cpu()
    return all(bool(mask[i, t]) for i, t in enumerate(tokens))


def test_a_deadline_never_reached_changes_nothing(planner, road_image, full):
    late = planner.plan(road_image, EGO, "follow", route=ROUTE, deadline=time.perf_counter() + 3600.0)
    assert not late.anytime and not full.anytime
    assert late.text == full.text and late.stats.forward_calls == full.stats.forward_calls
    np.testing.assert_array_equal(late.waypoint_confidence, full.waypoint_confidence)


def test_a_deadline_already_past_answers_one_forward(planner, road_image, full):
    cut = planner.plan(road_image, EGO, "follow", route=ROUTE, deadline=0.0)
    assert cut.anytime and cut.stats.forward_calls == 1 and cut.stats.denoise_steps == 0
    assert fmt.parse_waypoints(cut.text).valid  # the grammar holds for every position of the one forward
    assert cut.valid == _plausible(cut.waypoints)[0]
    assert cut.waypoint_confidence.shape == (8,) and (cut.waypoint_confidence > 0).all()


@pytest.mark.parametrize("checks", [3, 9, 20])
def test_a_cut_keeps_the_tokens_fixed_so_far(planner, road_image, full, monkeypatch, checks):
    """A clock that passes the deadline at its ``checks``-th reading: the blocks finished by then are the full
    decode's, the answer is grammatical, and it took one forward more than the steps run (the fill), unless the cut
    block held the end of the answer."""
    counter = itertools.count()
    monkeypatch.setattr(block.time, "perf_counter", lambda: float(next(counter)))
    tokens = []
    real = block.decode_blocks

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        tokens.append(result)
        return result

    monkeypatch.setattr("wamdiff_ros.decoding.generate.decode_blocks", spy)
    planner.plan(road_image, EGO, "follow", route=ROUTE)
    cut = planner.plan(road_image, EGO, "follow", route=ROUTE, deadline=float(checks))
    full_tokens, result = tokens[0].tokens, tokens[1]
    assert cut.anytime and result.anytime
    assert _grammar_allows(planner, result.tokens)
    assert fmt.parse_waypoints(cut.text).valid
    b = planner.settings.block_size
    finished = max(len(result.steps_per_block) - 1, 0)  # blocks decoded before the cut block
    assert result.tokens[:finished * b] == full_tokens[:finished * b]
    steps = sum(result.steps_per_block)
    assert result.forward_calls in (steps, steps + 1)
    assert cut.stats.forward_calls < full.stats.forward_calls


def test_an_implausible_anytime_plan_is_refused():
    steady = np.stack([4.0 * np.arange(1, 9), np.zeros(8)], axis=1)
    assert _plausible(steady) == (True, "")
    jump = steady.copy()
    jump[4, 0] += ANYTIME_MAX_SPEED * fmt.WAYPOINT_DT_S
    ok, reason = _plausible(jump)
    assert not ok and "waypoint 5" in reason


class CutAfter:
    """The real planner, its decoding cut at the ``checks``-th reading of the decoder's clock (a fresh count per
    plan), so that the cut is the same whatever the machine's speed."""

    def __init__(self, planner, checks: int, monkeypatch) -> None:
        self.planner, self.checks, self.monkeypatch = planner, checks, monkeypatch

    def plan(self, *args, deadline=None, **kwargs):
        counter = itertools.count()
        self.monkeypatch.setattr(block.time, "perf_counter", lambda: float(next(counter)))
        try:
            return self.planner.plan(*args, deadline=None if deadline is None else float(self.checks), **kwargs)
        finally:
            self.monkeypatch.undo()


def test_the_closed_loop_planner_answers_a_cut_plan_as_the_node_does(planner, short_scenario_file, monkeypatch):
    from wamdiff_ros.world.closed_loop import LoopConfig, ModelPlanner, run_episode
    from wamdiff_ros.world.scenarios import load_scenarios

    scenarios = load_scenarios(str(short_scenario_file))
    spec = scenarios.get("highway")
    results = {}
    for on_deadline in ("anytime", "stop"):
        model = ModelPlanner(CutAfter(planner, 20, monkeypatch), f"model_{on_deadline}", deadline_s=1.0,
                             on_deadline=on_deadline)
        results[on_deadline] = run_episode(spec, 1, model, LoopConfig(mode="paused"), scenarios).log
    anytime, stop = results["anytime"], results["stop"]
    plans = len(stop.plan_latency_s)
    assert stop.plans_cut == plans and stop.anytime_plans == 0  # every plan cut: a stop each time
    assert anytime.plans_cut == len(anytime.plan_latency_s) and anytime.anytime_plans > 0
    with pytest.raises(ValueError, match="on_deadline"):
        ModelPlanner(planner, on_deadline="brake")
