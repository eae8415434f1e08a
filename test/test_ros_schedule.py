"""The worker's scheduler (``wamdiff_ros/ros/schedule.py``) on a hand-driven clock: side tasks are due at their
rates, start only when the next plan still meets its deadline by the latency estimates, refusals are counted once per
due instance, and the diagnostics report each task."""

import pytest

from wamdiff_ros.ros.schedule import ANSWER, DESCRIBE, DETECT, PLAN, Scheduler


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _scheduler(detect_hz=2.0, describe_hz=1.0, plan_s=0.05, frame_s=0.1):
    clock = Clock()
    s = Scheduler(detect_hz, describe_hz, clock=clock)
    for i in range(10):  # frames every frame_s, each planned in plan_s
        s.frame_arrived(clock.t)
        s.record(PLAN, clock.t, clock.t + plan_s)
        clock.t += frame_s
    clock.t -= frame_s - plan_s  # just after the last plan
    return s, clock


def test_side_tasks_are_due_at_their_rates_and_questions_first():
    s, clock = _scheduler()
    assert s.frame_period() == pytest.approx(0.1)
    assert s.choose(1.0, question_pending=True) == ANSWER
    s.record(ANSWER, clock.t, clock.t + 0.01)
    first = s.choose(1.0)
    assert first in (DETECT, DESCRIBE)
    s.record(first, clock.t, clock.t + 0.02)
    second = s.choose(1.0)
    assert {first, second} == {DETECT, DESCRIBE}
    s.record(second, clock.t, clock.t + 0.02)
    assert s.choose(1.0) is None  # neither is due again yet
    clock.t += 0.5
    assert s.choose(1.0) == DETECT  # 2 Hz: due again after 0.5 s; describe (1 Hz) not yet
    s.record(DETECT, clock.t, clock.t + 0.02)
    clock.t += 0.5
    assert s.choose(1.0) in (DETECT, DESCRIBE)
    assert Scheduler(0.0, 0.0, clock=clock).choose(1.0) is None  # 0 Hz: never


def test_a_side_task_starts_only_if_the_next_plan_still_meets_its_deadline():
    """Next frame expected 0.05 s from now, plans take 0.05 s (p99): with a 0.2 s deadline the slack is
    0.05 + 0.2 - 0.05 = 0.2 s."""
    s, clock = _scheduler(detect_hz=1.0, describe_hz=0.0)
    assert s.slack(clock.t, 0.2) == pytest.approx(0.2)
    s.record(DETECT, clock.t - 10.0, clock.t - 10.0 + 0.15)  # detection takes 0.15 s (its p99)
    assert s.choose(0.2) == DETECT  # 0.15 <= 0.2
    assert s.choose(0.09) is None  # slack 0.09 s < 0.15 s: refused ...
    assert s.tasks[DETECT].skips == 1
    assert s.choose(0.09) is None and s.tasks[DETECT].skips == 1  # ... and counted once per due instance
    # a frame already waiting (arrived 0.08 s ago) is the next plan: slack = -0.08 + 0.2 - 0.05 = 0.07 s
    assert s.slack(clock.t, 0.2, waiting_since=clock.t - 0.08) == pytest.approx(0.07)
    assert s.choose(0.2, waiting_since=clock.t - 0.08) is None
    s.record(DETECT, clock.t, clock.t + 0.15)  # it ran after all: a new due instance may be counted again
    assert not s.tasks[DETECT].skip_counted


def test_before_its_first_run_a_side_task_is_expected_to_take_a_plans_time():
    s, clock = _scheduler(detect_hz=1.0, describe_hz=0.0, plan_s=0.05)
    assert s.expected(DETECT) == pytest.approx(0.05)
    assert s.choose(0.049) is None  # slack 0.049 < 0.05
    assert s.choose(0.06) == DETECT


def test_delayed_plans_and_diagnostics():
    s, clock = _scheduler()
    s.plan_done(frame_arrival=clock.t - 0.1, side_task_end=clock.t - 0.05, late=False)  # waited for the task
    s.plan_done(frame_arrival=clock.t - 0.1, side_task_end=clock.t - 0.05, late=True)
    s.plan_done(frame_arrival=clock.t, side_task_end=clock.t - 0.05, late=True)  # arrived after it: not delayed
    s.plan_done(frame_arrival=clock.t, side_task_end=None, late=True)
    values = s.values()
    assert values["plans_delayed_by_side_tasks"] == 2 and values["plans_delayed_and_late"] == 1
    assert values["plan.rate_hz"] == pytest.approx(10.0) and values["plan.runs"] == 10
    assert values["plan.p50_ms"] == pytest.approx(50.0)
    assert values["detect.runs"] == 0 and values["detect.skips"] == 0 and "plan.skips" not in values
    with pytest.raises(ValueError, match="rate"):
        s.set_rates(-1.0, 0.0)


def test_a_task_started_late_keeps_its_rate():
    """Each detection starts 0.1 s after it is due (the worker was planning): the next is still due one period after
    the one before, so 20 of them take 20 periods, not 20 x (period + 0.1 s)."""
    s, clock = _scheduler(detect_hz=2.0, describe_hz=0.0)
    starts = []
    for _ in range(20):
        while s.choose(10.0) != DETECT:
            clock.t += 0.01
        clock.t += 0.1  # late by the plan that was running
        starts.append(clock.t)
        s.record(DETECT, clock.t, clock.t + 0.05)
    assert (starts[-1] - starts[0]) / 19 == pytest.approx(0.5, abs=0.02)
    clock.t += 5.0  # far behind: a new schedule, not a burst of catch-up runs
    assert s.choose(10.0) == DETECT
    s.record(DETECT, clock.t, clock.t + 0.05)
    assert s.choose(10.0) is None
