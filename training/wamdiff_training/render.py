"""Markdown tables and the L2 figure of RESULTS.md, and the model card's measured lines, from the JSON logs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from wamdiff_ros.world.summary import starts_text
from wamdiff_training.runs import (DEFAULT_THRESHOLD, K, LEVEL, OPEN_LOOP, OVERLAP_STUDENTS, OVERLAP_TEACHERS,
                                   PLANNER_LABELS, RHO_TEACHER, SWEPT, Target, _label, load_pieces, read_json)

LOWSPEED = "lowspeed.json"  # `wamdiff-eval compare --json` of the low-speed student against the chain's, on v2


def _f(value, digits: int = 2, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{100 * value:.{digits}f}" if pct else f"{value:.{digits}f}"


def _row(cells: Iterable) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(head: list[str], rows: list[list], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(head) - 1)
    return [_row(head), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|", *map(_row, rows)]


def _row_at(entry: dict, threshold: float | None = DEFAULT_THRESHOLD) -> dict | None:
    """The plan row at ``threshold`` (AR: its single row)."""
    if entry.get("status") != "ok" or not entry.get("plan"):
        return None
    if entry["decode"]["mode"] == "ar":
        return entry["plan"][0]
    return next((r for r in entry["plan"] if r["threshold"] == threshold), entry["plan"][0])


def _decode(entry: dict) -> str:
    d = entry["decode"]
    return "AR" if d["mode"] == "ar" else f"B={d['block_size']}, t={_f(d['threshold'], 2)}"


def _ok(piece: dict | None, key: str) -> dict | None:
    entry = (piece or {}).get("entries", {}).get(key)
    return entry if entry and entry.get("status") == "ok" else None


def _not_run(name: str) -> list[str]:
    return [f"*not run* — `training/results/{name}.json` is missing; run `wamdiff-train results evaluate --only "
            f"{name}` (or `make results-eval`).", ""]


def _reasons(entries: dict, label_key: str = "label") -> list[str]:
    lines = [f"- {e.get(label_key, k)}: {e['status']} ({e.get('reason', '')})" for k, e in entries.items()
             if e.get("status") != "ok"]
    return (["", "Not evaluated:", "", *lines] if lines else [])


METRIC_HEAD = ["model", "decode", "step", "L2 mean (m)", "L2 wp1", "L2 wp8", "invalid %", "token acc %",
               "det mAP50 %", "question acc %", "fwd/token", "tokens/s", f"ρ{K}"]


METRIC_ALIGN = "ll" + "r" * (len(METRIC_HEAD) - 2)


def _metric_cells(entry: dict | None, label: str, threshold: float | None = DEFAULT_THRESHOLD) -> list:
    row = _row_at(entry, threshold) if entry else None
    if row is None:
        status = (entry or {}).get("status", "not run")
        return [label, status, *["-"] * (len(METRIC_HEAD) - 2)]
    wp = row["l2_per_waypoint"]
    rho = entry.get("rho") or {}
    return [label, _decode(entry), entry.get("step", "-"), _f(row["l2_mean"]), _f(wp[0]), _f(wp[-1]),
            _f(row["invalid_rate"], 1, True), _f(entry["token_accuracy"], 1, True),
            _f(entry["detection"]["map50"], 1, True), _f(entry["question_accuracy"], 1, True),
            _f(row["forward_calls_per_token"], 3), _f(row["tokens_per_s"], 0), _f(rho.get("value"), 3)]


def _data_line(piece: dict) -> str:
    d = piece.get("data") or {}
    used = ", ".join(f"{t} {n}" for t, n in (d.get("used") or {}).items())
    avail = ", ".join(f"{t} {n}" for t, n in (d.get("available") or {}).items())
    return (f"Held-out split `{d.get('file', '?')}`: {used} records used ({d.get('selection', '')}; available: "
            f"{avail}). ρ{K} against `{piece['settings'].get('rho_teacher', RHO_TEACHER)}`.")


def render_open_loop(piece: dict | None) -> list[str]:
    lines = ["## (a) AR vs block diffusion, open loop", ""]
    if piece is None:
        return lines + _not_run("open_loop")
    entries = piece["entries"]
    lines += [_data_line(piece), "",
              "Plan L2 is the mean over valid plans of the distance to the reference waypoint (0.5 s apart); token "
              "accuracy is teacher-forced (AR: next token; diffusion: BD3 noisy states at the decode B); detection mAP "
              "at IoU 0.5; question accuracy is exact match; forward calls per token and tokens/s are decoder "
              f"numbers on this CPU. Diffusion rows at threshold {DEFAULT_THRESHOLD}.", ""]
    lines += _table(METRIC_HEAD, [_metric_cells(entries.get(t.key), _label(entries.get(t.key), t)) for t in OPEN_LOOP],
                    METRIC_ALIGN)
    lines += _reasons(entries)
    final = _ok(piece, SWEPT)
    lines += render_behaviours(entries)
    lines += render_perception(entries)
    lines += ["", "### Per-waypoint L2 (m)", ""]
    lines += _table(["model", *(f"wp{i}" for i in range(1, 9))],
                    [[_label(entries[t.key], t), *[_f(v) for v in _row_at(entries[t.key])["l2_per_waypoint"]]]
                     for t in OPEN_LOOP if _ok(piece, t.key)])
    lines += ["", "### Threshold sweep of the final student", ""]
    if final is None:
        lines.append("*not run* (student/cross_scale has not been evaluated)")
    else:
        rows = sorted(final["plan"], key=lambda r: -r["threshold"])
        lines += _table(["threshold", "L2 mean (m)", "L2 wp8", "invalid %", "fwd/token", "tokens/s",
                         "latency ms/plan"],
                        [[_f(r["threshold"]), _f(r["l2_mean"]), _f(r["l2_per_waypoint"][-1]),
                          _f(r["invalid_rate"], 1, True), _f(r["forward_calls_per_token"], 3),
                          _f(r["tokens_per_s"], 0), _f(r["latency_ms"], 0)] for r in rows])
    return lines + [""]


def render_behaviours(entries: dict) -> list[str]:
    """Plan L2 per expert behaviour next to constant velocity's on the same records (rows of models evaluated
    before the breakdown existed are left out)."""
    found = []
    for t in OPEN_LOOP:
        row = _row_at(entries[t.key]) if t.key in entries and entries[t.key].get("status") == "ok" else None
        if (row or {}).get("by_behaviour"):
            found.append((_label(entries[t.key], t), row["by_behaviour"]))
    if not found:
        return []
    counts = {name: g["plans"] for name, g in found[0][1].items()}  # the same records for every model
    rows = [[label, *(f"{_f(groups[b]['l2_mean'])} ({_f(groups[b]['constant_velocity_l2_mean'])})"
                      if b in groups else "–" for b in counts),
             _f((groups.get("junction") or {}).get("turn_shortfall_m"))] for label, groups in found]
    return ["", "### Plan L2 by what the expert does (m; constant velocity on the same records in brackets)", "",
            "A model that ignores the command and the camera is no better than constant velocity at junctions, lane "
            "changes and yields. Records per group: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ". "
            "Turn shortfall: over the junction references that end ≥ 1 m to one side, how far short of that sideways "
            "offset the plan's last waypoint ends (positive: under-turns; - where not logged).", "",
            *_table(["model", *counts, "turn shortfall (m)"], rows)]


def render_perception(entries: dict) -> list[str]:
    """Question accuracy per question and the lead-vehicle distance read off the image (rows of models evaluated
    before the breakdown existed are left out)."""
    found = [(_label(entries[t.key], t), entries[t.key]) for t in OPEN_LOOP
             if entries.get(t.key, {}).get("status") == "ok" and entries[t.key].get("per_question")]
    if not found:
        return []
    keys = list(found[0][1]["per_question"])
    rows = []
    for label, e in found:
        lead = e.get("lead_distance") or {}
        rows.append([label, *(_f(e["per_question"].get(k, {}).get("exact_match"), 1, True) for k in keys),
                     _f(lead.get("mae_m"), 1), _f(lead.get("blind_mae_m"), 1), _f(lead.get("pearson_r"), 2)])
    return ["", "### What the camera tells the model (question exact match %; lead-vehicle distance)", "",
            "The lead-vehicle answer is read as a distance (\"none within 100 m\" as 100 m): its mean absolute error "
            "next to the error of always answering the mean (a model blind to the image does no better), and "
            "Pearson r with the reference.", "",
            *_table(["model", *keys, "lead MAE (m)", "blind MAE (m)", "lead r"], rows)]


def render_fixed(piece: dict | None, name: str, title: str, targets: tuple[Target, ...], intro: str) -> list[str]:
    lines = [f"## {title}", ""]
    if piece is None:
        return lines + _not_run(name)
    lines += [intro, "", _data_line(piece), ""]
    lines += _table(METRIC_HEAD, [_metric_cells(piece["entries"].get(t.key), t.label) for t in targets],
                    METRIC_ALIGN)
    return lines + _reasons(piece["entries"]) + [""]


def render_overlap(piece: dict | None) -> list[str]:
    lines = ["## (d) Top-5 overlap ρ5: diffusion teacher vs AR teacher", ""]
    if piece is None:
        return lines + _not_run("overlap")
    lines += [f"ρ{K} = |top-{K} of the teacher ∩ top-{K} of the student| / {K} on the student's fixed noisy states "
              "(the same seed and records as (a)); an AR teacher is aligned as its logit at i − 1 given the clean "
              "prefix against the student's at masked position i.", ""]
    rows = []
    for s in OVERLAP_STUDENTS:
        cells = [s.label]
        for t in OVERLAP_TEACHERS:
            e = piece["entries"].get(f"{s.key}__{t.key}") or {}
            cells.append(_f((e.get("rho") or {}).get("value"), 3) if e.get("status") == "ok"
                         else e.get("status", "not run"))
        rows.append(cells)
    first = OVERLAP_STUDENTS[0].key
    lines += _table(["student", *(_label(piece["entries"].get(f"{first}__{t.key}"), t, "teacher_label")
                                  for t in OVERLAP_TEACHERS)], rows)
    return lines + _reasons(piece["entries"], "student_label") + [""]


def l2_curves(piece: dict | None) -> list[tuple[str, list]]:
    picks = (("teacher_ar", "teacher AR"), ("student_ar", "student AR"), ("student_final", "final student · B=32"),
             ("teacher_b32", "teacher · B=32"))
    return [(label, _row_at(e)["l2_per_waypoint"]) for key, label in picks if (e := _ok(piece, key))]


def write_figure(piece: dict | None, path: Path) -> Path | None:
    from wamdiff_training.plots import CheckpointCurves, plot_l2_per_waypoint

    curves = l2_curves(piece)
    if not curves:
        path.unlink(missing_ok=True)  # no stale figure beside a RESULTS.md that does not show it
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return plot_l2_per_waypoint([CheckpointCurves(label, wp) for label, wp in curves], path)


def render_figure(piece: dict | None, link: str | None) -> list[str]:
    lines = ["## (e) Per-waypoint L2, AR vs diffusion", ""]
    if link is None:
        return lines + ["*not run* — none of teacher AR, student AR, final student, teacher B=32 has been evaluated "
                        "(open_loop.json).", ""]
    names = ", ".join(label for label, _ in l2_curves(piece))
    return lines + [f"![per-waypoint L2]({link})", "", f"Curves: {names} (from open_loop.json).", ""]


# closed loop


def closed_loop_frames(piece: dict) -> tuple[list[dict], list[dict]]:
    groups, episodes = [], []
    for entry in piece["entries"].values():
        if entry.get("status") == "ok":
            groups += entry["groups"]
            episodes += entry["episodes"]
    return groups, episodes


def paired(episodes: list[dict], a: str, b: str, mode: str) -> dict | None:
    """(a − b) DS over episodes matched by (scenario, seed), with the package's paired bootstrap CI."""
    from wamdiff_ros.world.summary import paired_difference_ci

    ds_a = {(e["scenario"], e["seed"]): e["ds"] for e in episodes if e["planner"] == a and e["mode"] == mode}
    ds_b = {(e["scenario"], e["seed"]): e["ds"] for e in episodes if e["planner"] == b and e["mode"] == mode}
    keys = sorted(ds_a.keys() & ds_b.keys())
    if not keys:
        return None
    diff, lo, hi = paired_difference_ci([ds_a[k] for k in keys], [ds_b[k] for k in keys], level=LEVEL)
    return {"a": a, "b": b, "mode": mode, "episodes": len(keys), "diff": diff, "lo": lo, "hi": hi}


def _group(groups: list[dict], planner: str, mode: str) -> dict | None:
    return next((g for g in groups if g["planner"] == planner and g["mode"] == mode), None)


def planner_labels(piece: dict) -> dict[str, str]:
    """Closed-loop planner name -> label, as each model's entry was evaluated (it names the run driven)."""
    entries = piece.get("entries", {})
    return {k: _label(entries.get(k), Target(k, "", v)) for k, v in PLANNER_LABELS.items()}


def render_closed_loop(piece: dict | None) -> list[str]:
    lines = ["## (f) Closed loop", ""]
    if piece is None:
        return lines + _not_run("closed_loop")
    s = piece["settings"]
    groups, episodes = closed_loop_frames(piece)
    lines += [f"`wamdiff-eval closed-loop`, scenario set {s.get('scenario_file') or 'frozen v1'} "
              f"({s['scenarios']}), {s['episodes_per_scenario']} held-out seeds per scenario from {s['first_seed']}, "
              f"plans requested at {s.get('plan_hz', 5.0):g} Hz by every planner, "
              + (f"each blended with the earlier ones by the follower (τ = {s['plan_blend_tau_s']:g} s), "
                 if s.get("plan_blend_tau_s") else "each followed as it comes (no plan blending), ") +
              "both timing modes (paused: the world waits for each plan; realtime: it does not). DS = route completion "
              f"× infraction penalty, mean with its bootstrap {round(100 * LEVEL)} % CI.", ""]
    labels = planner_labels(piece)
    rows = []
    for planner in labels:
        for mode in s["modes"]:
            g = _group(groups, planner, mode)
            if g is None:
                continue
            rows.append([labels[planner], mode, g["episodes"],
                         f"{_f(g['ds'], 1)} [{_f(g['ds_lo'], 1)}, {_f(g['ds_hi'], 1)}]", _f(g["sr"], 1),
                         _f(g["rc"], 1), _f(g["collisions_per_ep"], 2), _f(g["latency_p50_ms"], 0),
                         _f(g["forward_calls_per_token"], 3)])
    lines += _table(["planner", "mode", "episodes", f"DS [{round(100 * LEVEL)}% CI]", "SR %", "RC", "collisions/ep",
                     "plan p50 ms", "fwd/token"], rows, "llrlrrrrr")
    lines += _reasons(piece["entries"])
    lines += ["", f"Paired DS differences over episodes matched by (scenario, seed), bootstrap {round(100 * LEVEL)} % "
              "CI (the Stage II student is the same student before Stage III):", ""]
    prow = []
    for a, b, what in (("student", "ar", "final student − AR model"),
                       ("student_stage2", "ar", "Stage II student − AR model"),
                       ("student", "student_stage2", "final student − Stage II student (what Stage III did)")):
        apart = _measured_apart(piece["entries"], a, b)
        for mode in s["modes"]:
            p = paired(episodes, a, b, mode)
            if p is not None:
                prow.append([what + (" †" if apart else ""), mode, p["episodes"],
                             f"{_f(p['diff'], 1)} [{_f(p['lo'], 1)}, {_f(p['hi'], 1)}]"])
            elif a == "student" and b == "ar":
                prow.append([what, mode, "-", "not run"])
    lines += _table(["pair", "mode", "paired episodes", "DS difference [CI]"], prow, "llrl")
    if any(row[0].endswith(" †") for row in prow):
        lines += ["", "† the two were measured apart (below): the real-time difference mixes machines or code."]
    lines += _hosts(piece["entries"])
    videos = (piece["entries"].get("student") or {}).get("videos")
    if videos:
        lines += ["", "Videos of the final student (paused, not committed): " + ", ".join(f"`{v}`" for v in videos)]
    return lines + [""]


def _measured_apart(entries: dict, a: str, b: str) -> bool:
    """Whether entries ``a`` and ``b`` ran apart: both recorded where and it differs, or only one recorded it (a new
    run next to one logged before hosts were). Two older logs are taken as one run, as they were made."""
    from wamdiff_ros.provenance import same_host

    ha, hb = (entries.get(a) or {}).get("host"), (entries.get(b) or {}).get("host")
    return bool(ha) != bool(hb) or same_host(ha, hb) is False


def _host_text(host: dict) -> str:
    return (f"{host.get('cpu')} ({host.get('cores')} cores), torch {host.get('torch')}, "
            f"commit {host.get('commit') or 'unknown'}")


def _hosts(entries: dict) -> list[str]:
    """Where each closed-loop run was measured. Real-time rows depend on the machine's speed and the decoder's code,
    so rows measured apart are named as such."""
    from wamdiff_ros.provenance import same_host

    ok = {k: e for k, e in entries.items() if e.get("status") == "ok"}
    if not ok:
        return []
    hosts = {k: e.get("host") for k, e in ok.items()}
    recorded = [h for h in hosts.values() if h]
    if not recorded:
        return ["", "The machine and code of each run were not recorded (these logs predate that)."]
    if len(recorded) == len(hosts) and all(same_host(recorded[0], h) for h in recorded):
        return ["", f"Every run here was measured on {_host_text(recorded[0])}."]
    lines = ["", "Measured apart (real-time rows compare only within one machine and one version of the code):", ""]
    lines += [f"- {ok[k].get('label', k)}: {_host_text(h) if h else 'not recorded (logged before hosts were)'}"
              for k, h in hosts.items()]
    return lines


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def render_runs(piece: dict | None) -> list[str]:
    lines = ["## Runs", ""]
    if piece is None:
        return lines + _not_run("runs")
    rows, missing = [], []
    for r in piece["runs"]:
        if r["status"] != "ok":
            missing.append(r["run"])
            continue
        m = r.get("metrics") or {}
        steps = f"{r['steps']}" + (f" / {r['planned_steps']}" if r.get("planned_steps") else "")
        rows.append([r["run"], r.get("stage") or "-", "AR" if r.get("prediction") == "next_token" else
                     f"B={r.get('block_size')}", steps, _duration(r.get("wall_s")),
                     f"{_f(m.get('loss_first'), 3)} → {_f(m.get('loss_last'), 3)}",
                     _f(m.get("loss_last10_mean"), 3),
                     f"{r['params'] / 1e6:.2f} M" if r.get("params") else "-",
                     f"{r['safetensors_bytes'] / 2 ** 20:.1f} MiB" if r.get("safetensors_bytes") else "-"])
    lines += ["Per run of the hierarchy: its last checkpoint; wall time from the TensorBoard event timestamps; loss "
              "as logged in metrics.csv (first / last row, mean of the last 10).", ""]
    lines += _table(["run", "stage", "block", "steps (done / planned)", "wall", "loss first → last", "last-10 loss",
                     "params", "model.safetensors"], rows, "lllrrrrrr")
    if missing:
        lines += ["", "Not run (yet): " + ", ".join(f"`{m}`" for m in missing) + "."]
    d = piece.get("data") or {}
    lines += ["", "### Data", ""]
    if d.get("image_size"):
        w, h = d["image_size"]
        lines.append(f"- camera image {w}×{h} px, {d['camera'].get('fov_deg')}° FOV; plan records at "
                     f"{d.get('replan_hz')} Hz of simulated time")
    for split, v in (d.get("splits") or {}).items():
        tasks = ", ".join(f"{t} {n}" for t, n in v["tasks"].items())
        scen = ", ".join(f"{s} {n}" for s, n in v["episodes_per_scenario"].items())
        lines.append(f"- {split}: {v['records']} records ({tasks}), {v['images']} images, {v['episodes']} episodes "
                     f"({scen})")
    if not d.get("splits"):
        lines.append(f"- no data found in `{d.get('folder')}`")
    return lines + [""]


def _model_name(run: dict) -> str:
    return str(run.get("model") or run.get("report") or "?")


def render_lowspeed(piece: dict | None) -> list[str]:
    """(g): the paired comparison behind the low-speed student (``lowspeed.json``, written by ``wamdiff-eval compare
    --json``): a row per scenario and per pooled group, with the starts from rest that got going."""
    lines = ["## (g) Driving from standstill: scenarios v2", ""]
    if piece is None:
        return lines + [f"*not run* — `training/results/{LOWSPEED}` is missing: drive the low-speed student and the "
                        "model it continues with `wamdiff-eval closed-loop --scenario-file v2 --scenarios all`, then "
                        f"`wamdiff-eval compare NEW REF --group ... --json training/results/{LOWSPEED}`.", ""]
    new, ref = piece["runs"]["new"], piece["runs"]["ref"]
    level = round(100 * piece["level"])
    lines += [f"`wamdiff-eval closed-loop`, scenario set {new.get('scenario_set', '?')}: new `{_model_name(new)}` "
              f"against ref `{_model_name(ref)}`, {new.get('episodes_per_scenario', '?')} held-out seeds per scenario "
              f"from {new.get('first_seed', '?')}, plans requested at {new.get('plan_hz', '?')} Hz, "
              f"{', '.join(new.get('modes') or ['?'])}; episodes paired by (mode, scenario, seed). The v1 scenarios "
              "are the frozen set's, unchanged; the others start at rest or stop and go. A start from rest succeeds "
              "when the ego moves 10 m along its route within 5 s of its way opening. Bold rows pool scenarios. "
              "Whether new replaced the shipped model, and why: "
              "[docs/experiments.md](../docs/experiments.md#low-speed-continuation).",
              ""]
    singles = {r["scenario"] for r in piece["rows"]} - {"all"} - set(piece.get("groups") or {})
    rows = []
    for r in piece["rows"]:
        name = r["scenario"] if r["scenario"] in singles else f"**{r['scenario']}**"
        rows.append([name, r["mode"], r["episodes"], _f(r["new_ds"], 1), _f(r["ref_ds"], 1),
                     f"{r['ds_diff']:+.1f} [{r['ds_diff_lo']:+.1f}, {r['ds_diff_hi']:+.1f}]",
                     starts_text(r, "new"), starts_text(r, "ref"),
                     f"{_f(r['new_collisions_per_ep'], 2)}, {_f(r['ref_collisions_per_ep'], 2)}",
                     f"{r['new_completed']}, {r['ref_completed']}"])
    lines += _table(["scenario", "mode", "episodes", "new DS", "ref DS", f"new − ref [{level}% CI]",
                     "starts ok (new)", "starts ok (ref)", "collisions/ep (new, ref)", "completed (new, ref)"],
                    rows, "llrrrlrrrr")
    lines.append("")
    for side, run in (("new", new), ("ref", ref)):
        host = run.get("host") or {}
        lines.append(f"- {side}: `wamdiff-eval {' '.join(run.get('argv') or [])}` "
                     f"({host.get('cpu', '?')}, {host.get('cores', '?')} cores, commit {host.get('commit', '?')}, "
                     f"{_f(run.get('wall_s'), 0)} s)")
    return lines + [""]


def card_metrics(results: Path, lowspeed: bool = False) -> list[str]:
    """Markdown bullets of the shipped (final) student's measured numbers for the model card (``export.py``), from
    the same JSON as RESULTS.md; for the low-speed continuation (``lowspeed``) its v2 comparison first and the
    chain's lines marked as the model it continues."""
    pieces = load_pieces(Path(results))
    lines = []
    final, ar = _ok(pieces["open_loop"], SWEPT), _ok(pieces["open_loop"], "student_ar")
    if final:
        row = _row_at(final)
        lines.append(f"- open loop (held-out split, B={final['decode']['block_size']}, threshold "
                     f"{_f(row['threshold'])}): plan L2 {_f(row['l2_mean'])} m mean, {_f(row['l2_per_waypoint'][-1])} m "
                     f"at 4 s, invalid plans {_f(row['invalid_rate'], 1, True)} %, "
                     f"{_f(row['forward_calls_per_token'], 3)} forward calls per token, "
                     f"{_f(row['tokens_per_s'], 0)} tokens/s on CPU"
                     + (f" (AR model: L2 {_f(_row_at(ar)['l2_mean'])} m, {_f(_row_at(ar)['tokens_per_s'], 0)} "
                        "tokens/s)" if ar else ""))
    cl = pieces["closed_loop"]
    if cl:
        groups, episodes = closed_loop_frames(cl)
        labels = planner_labels(cl)
        for mode in cl["settings"]["modes"]:
            g = _group(groups, "student", mode)
            if g is None:
                continue
            others = ", ".join(f"{labels[p]} {_f(o['ds'], 1)}" for p in ("expert", "constant_velocity", "ar")
                               if (o := _group(groups, p, mode)))
            p = paired(episodes, "student", "ar", mode)
            lines.append(f"- closed loop, {mode}: driving score {_f(g['ds'], 1)} [{_f(g['ds_lo'], 1)}, "
                         f"{_f(g['ds_hi'], 1)}] ({round(100 * LEVEL)} % CI, {g['episodes']} episodes)"
                         + (f"; {others}" if others else "")
                         + (f"; paired student − AR {_f(p['diff'], 1)} [{_f(p['lo'], 1)}, {_f(p['hi'], 1)}]"
                            if p else ""))
    low = read_json(Path(results) / LOWSPEED) if lowspeed else None
    if low is not None:
        lines = [f"- before the low-speed continuation, the chain's Stage III student: {line[2:]}" for line in lines]
        rows = {r["scenario"]: r for r in low["rows"] if r["mode"] == "paused"}
        level = round(100 * low["level"])
        parts = []
        for name, r in rows.items():
            if name in (low.get("groups") or {}) or name == "all":
                parts.append(f"{'all' if name == 'all' else name + ' scenarios'} {_f(r['new_ds'], 1)} vs "
                             f"{_f(r['ref_ds'], 1)}, paired {r['ds_diff']:+.1f} [{r['ds_diff_lo']:+.1f}, "
                             f"{r['ds_diff_hi']:+.1f}]")
        total = rows.get("all") or {}
        per_scenario = low["runs"]["new"].get("episodes_per_scenario", "?")
        lines.insert(0, f"- closed loop on scenarios v2, paused ({per_scenario} "
                     f"episodes per scenario, {level} % CI), this model vs `{_model_name(low['runs']['ref'])}`: "
                     + "; ".join(parts)
                     + (f"; starts from rest that got going {starts_text(total, 'new')} vs {starts_text(total, 'ref')}"
                        if total.get("rest_starts") else ""))
    return lines or ["- No results logged yet: run `make results-eval`."]
