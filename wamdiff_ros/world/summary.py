"""Aggregates of episode scores: per (planner, mode) totals with bootstrap confidence intervals, per-scenario
driving scores and paired differences over matched (scenario, seed) episodes."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from wamdiff_ros.world.metrics import EpisodeScore



def bootstrap_ci(values: Sequence[float] | np.ndarray, level: float = 0.9, n: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap of the mean at confidence ``level``; NaNs for no values."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    means = v[np.random.default_rng(seed).integers(0, v.size, size=(n, v.size))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    mean = float(v.mean())
    # Clamp so a degenerate resample distribution never reports an interval that excludes the point estimate.
    return mean, float(min(lo, mean)), float(max(hi, mean))


def paired_difference_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = 0.9,
                         n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean of a - b, lo, hi) over matched episodes (same scenario and seed, same order): bootstrap of the paired
    differences, which removes the between-scenario variance both planners share."""
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_.shape != b_.shape:
        raise ValueError(f"paired samples differ in shape: {a_.shape} vs {b_.shape}")
    return bootstrap_ci(a_ - b_, level=level, n=n, seed=seed)


def _mean(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def _median(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.median(v)) if v else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _totals(group: list[EpisodeScore], level: float, n: int, seed: int) -> dict[str, Any]:
    ds, ds_lo, ds_hi = bootstrap_ci([s.driving_score for s in group], level=level, n=n, seed=seed)
    count = len(group)
    return {
        "episodes": count,
        "ds": ds, "ds_lo": ds_lo, "ds_hi": ds_hi,
        "sr": 100.0 * sum(s.success for s in group) / count,
        "rc": float(np.mean([s.route_completion for s in group])),
        "penalty": float(np.mean([s.infraction_penalty for s in group])),
        "collisions_per_ep": sum(s.collisions for s in group) / count,
        "at_fault_per_ep": sum(s.at_fault_collisions for s in group) / count,
        "rear_ended_per_ep": sum(s.rear_ended for s in group) / count,
        "offlane_m": float(np.mean([s.offlane_m for s in group])),
        "comfort": float(np.mean([s.comfort for s in group])),
        # Episodes keep only their own latency statistics: report their mean / median across episodes.
        "latency_mean_ms": _ms(_mean(s.plan_latency_mean_s for s in group)),
        "latency_p50_ms": _ms(_median(s.plan_latency_p50_s for s in group)),
        "latency_p90_ms": _ms(_median(s.plan_latency_p90_s for s in group)),
        "forward_calls_per_token": _mean(s.forward_calls_per_token for s in group),
        "rest_starts": sum(s.start_ok is not None for s in group),  # episodes that start at rest,
        "rest_starts_ok": sum(bool(s.start_ok) for s in group),      # and those that got going (start_ok)
        "end_reasons": dict(sorted(_count(s.end_reason for s in group).items())),
        # junction routes cut short: where on the route (approach / junction / exit) each one ended
        "unfinished_phases": dict(sorted(_count(
            s.end_phase for s in group if s.end_phase and s.end_reason != "completed").items())),
    }


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for item in items:
        out[item] += 1
    return dict(out)


def summarize(scores: Sequence[EpisodeScore], level: float = 0.9, n: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Bench2Drive-style totals, JSON-ready.

    ``groups``: per (planner, mode) -- episodes, DS mean with its bootstrap CI, SR %, RC, penalty, collisions /
    at-fault / rear-ended per episode, comfort, latency (ms) and ``per_scenario_ds``. ``per_scenario``: the same
    totals per (scenario, planner, mode). ``paired``: for every two planners in one mode, the DS difference over the
    episodes both ran (matched by scenario and seed) with its paired bootstrap CI."""
    by_group: dict[tuple[str, str], list[EpisodeScore]] = defaultdict(list)
    by_scenario: dict[tuple[str, str, str], list[EpisodeScore]] = defaultdict(list)
    for s in scores:
        by_group[(s.planner, s.mode)].append(s)
        by_scenario[(s.scenario, s.planner, s.mode)].append(s)
    groups = []
    for (planner, mode), group in sorted(by_group.items()):
        per_scenario: dict[str, list[float]] = defaultdict(list)
        for s in group:
            per_scenario[s.scenario].append(s.driving_score)
        groups.append({"planner": planner, "mode": mode, **_totals(group, level, n, seed),
                       "per_scenario_ds": {k: float(np.mean(v)) for k, v in sorted(per_scenario.items())}})
    scenarios = [{"scenario": scenario, "planner": planner, "mode": mode, **_totals(group, level, n, seed)}
                 for (scenario, planner, mode), group in sorted(by_scenario.items())]
    paired = []
    modes = sorted({mode for _, mode in by_group})
    for mode in modes:
        planners = sorted(p for p, m in by_group if m == mode)
        for i, a in enumerate(planners):
            for b in planners[i + 1:]:
                ds_a = {(s.scenario, s.seed): s.driving_score for s in by_group[(a, mode)]}
                ds_b = {(s.scenario, s.seed): s.driving_score for s in by_group[(b, mode)]}
                keys = sorted(ds_a.keys() & ds_b.keys())
                if not keys:
                    continue
                diff, lo, hi = paired_difference_ci([ds_a[k] for k in keys], [ds_b[k] for k in keys],
                                                    level=level, n=n, seed=seed)
                paired.append({"mode": mode, "a": a, "b": b, "episodes": len(keys),
                               "ds_diff": diff, "ds_diff_lo": lo, "ds_diff_hi": hi})
    return {"level": level, "groups": groups, "per_scenario": scenarios, "paired": paired}


def starts_text(row: dict[str, Any], side: str) -> str:
    """``k/n (p %)``: of a ``compare`` row's starts from rest, those that got going on ``side`` (new or ref); ``-``
    when the row has none."""
    n, ok = row.get("rest_starts") or 0, row[f"{side}_rest_starts_ok"]
    return f"{ok}/{n} ({100.0 * ok / n:.0f} %)" if n else "-"


def compare(new: Sequence[EpisodeScore], ref: Sequence[EpisodeScore], level: float = 0.9, n: int = 2000,
            seed: int = 0, groups: dict[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Paired driving-score difference ``new - ref`` over the episodes both runs hold (same mode, scenario and
    seed): a row per mode and scenario, a row per mode for each of ``groups`` (name -> scenarios pooled, e.g. the v1
    scenarios of a v2 run) and a row per mode over all of them (scenario ``"all"``), each with both means, the
    difference with its bootstrap CI at ``level`` (and each mean's own), the collisions per episode, the completed
    routes and the starts from rest (episodes that start at rest, and those that got going on each side); plus how
    many episodes only one side holds (left out)."""
    a = {(s.mode, s.scenario, s.seed): s for s in new}
    b = {(s.mode, s.scenario, s.seed): s for s in ref}
    keys = sorted(a.keys() & b.keys())
    groups = dict(groups or {})
    rows = []
    for mode in sorted({k[0] for k in keys}):
        in_mode = [k for k in keys if k[0] == mode]
        pools = [(name, {name}) for name in sorted({k[1] for k in in_mode})]
        pools += [(name, set(members)) for name, members in groups.items()]
        for scenario, members in pools + [("all", None)]:
            ks = [k for k in in_mode if members is None or k[1] in members]
            if not ks:
                continue
            x, y = [a[k].driving_score for k in ks], [b[k].driving_score for k in ks]
            diff, lo, hi = paired_difference_ci(x, y, level=level, n=n, seed=seed)
            (_, new_lo, new_hi), (_, ref_lo, ref_hi) = (bootstrap_ci(v, level=level, n=n, seed=seed) for v in (x, y))
            rows.append({"mode": mode, "scenario": scenario, "episodes": len(ks),
                         "new_ds": float(np.mean(x)), "ref_ds": float(np.mean(y)),
                         "new_ds_lo": new_lo, "new_ds_hi": new_hi, "ref_ds_lo": ref_lo, "ref_ds_hi": ref_hi,
                         "ds_diff": diff, "ds_diff_lo": lo, "ds_diff_hi": hi,
                         "new_collisions_per_ep": float(np.mean([a[k].collisions for k in ks])),
                         "ref_collisions_per_ep": float(np.mean([b[k].collisions for k in ks])),
                         "new_completed": sum(a[k].end_reason == "completed" for k in ks),
                         "ref_completed": sum(b[k].end_reason == "completed" for k in ks),
                         "rest_starts": sum(a[k].start_ok is not None for k in ks),
                         "new_rest_starts_ok": sum(bool(a[k].start_ok) for k in ks),
                         "ref_rest_starts_ok": sum(bool(b[k].start_ok) for k in ks)})
    return {"level": level, "rows": rows, "episodes": len(keys), "groups": {k: list(v) for k, v in groups.items()},
            "only_new": len(a.keys() - b.keys()), "only_ref": len(b.keys() - a.keys())}
