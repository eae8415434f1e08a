"""Where the tiny hierarchy agrees or disagrees with the paper's claims, each judged from the JSON logs by one stated
rule."""

from __future__ import annotations

import math

from wamdiff_training.render import _f, _ok, _row_at, closed_loop_frames, paired
from wamdiff_training.runs import ABLATION, K, OVERLAP_STUDENTS


PARITY = 0.10  # relative L2 difference still called parity


def _l2(piece: dict | None, key: str) -> float | None:
    e = _ok(piece, key)
    row = _row_at(e) if e else None
    return row["l2_mean"] if row else None


def _growth(wp: list) -> float | None:
    """L2 at the last waypoint minus at the first (None without valid plans there)."""
    return None if wp[0] is None or wp[-1] is None else wp[-1] - wp[0]


def _pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else math.inf


def disagreements(pieces: dict[str, dict | None]) -> list[tuple[bool | None, str]]:
    """(agrees with the paper?, statement) per claim, each computed from the JSON with one simple rule."""
    ol, ab, dv, ov, cl = (pieces.get(k) for k in ("open_loop", "ablation", "divergence", "overlap", "closed_loop"))
    out: list[tuple[bool | None, str]] = []
    st, ar, tar = _l2(ol, "student_final"), _l2(ol, "student_ar"), _l2(ol, "teacher_ar")
    claim = "paper: the B=32 student matches its AR counterpart's planning quality (parity)"
    if st is not None and ar is not None:
        d = _pct(st, ar)
        out.append((abs(d) <= 100 * PARITY, f"B=32 student mean L2 {st:.2f} m is {abs(d):.0f} % "
                    f"{'higher' if d > 0 else 'lower'} than the same-size AR model's {ar:.2f} m"
                    + (f" ({_pct(st, tar):+.0f} % vs the teacher AR's {tar:.2f} m)" if tar is not None else "")
                    + f"; {claim} (rule: within ±{100 * PARITY:.0f} %)"))
    else:
        out.append((None, f"{claim}: not run"))
    claim = "paper: AR error grows faster along the horizon than diffusion's (exposure bias)"
    e_st, e_ar = _ok(ol, "student_final"), _ok(ol, "student_ar")
    if e_st and e_ar:
        g_st, g_ar = (_growth(_row_at(e)["l2_per_waypoint"]) for e in (e_st, e_ar))
        if g_st is not None and g_ar is not None:
            out.append((g_st < g_ar, f"L2 growth from waypoint 1 to 8: B=32 student {g_st:.2f} m, AR {g_ar:.2f} m; "
                        f"{claim}"))
        else:
            out.append((None, f"{claim}: no valid plans at waypoint 1 or 8"))
    else:
        out.append((None, f"{claim}: not run"))
    claim = "paper: the student needs a fraction of AR's forward passes and decodes faster"
    rs, ra = (_row_at(e) if e else None for e in (e_st, e_ar))
    if rs and ra and None not in (rs["forward_calls_per_token"], ra["forward_calls_per_token"], rs["tokens_per_s"],
                                  ra["tokens_per_s"]):
        ok = rs["forward_calls_per_token"] < ra["forward_calls_per_token"] and rs["tokens_per_s"] > ra["tokens_per_s"]
        out.append((ok, f"forward calls per token {rs['forward_calls_per_token']:.3f} (student) vs "
                    f"{ra['forward_calls_per_token']:.3f} (AR), tokens/s {_f(rs['tokens_per_s'], 0)} vs "
                    f"{_f(ra['tokens_per_s'], 0)}; {claim}"))
    else:
        out.append((None, f"{claim}: not run"))
    claim = "paper: each added stage (curriculum, block distillation, model distillation) lowers the error"
    chain = [(t.label, _l2(ab, t.key)) for t in ABLATION[:4]]
    known = [(label, v) for label, v in chain if v is not None]
    if len(known) >= 2:
        worse = [f"{b[0]} ({b[1]:.2f} m ≥ {a[1]:.2f} m)" for a, b in zip(known, known[1:]) if b[1] >= a[1]]
        path = " → ".join(f"{v:.2f}" for _, v in known)
        out.append((not worse, f"ablation mean L2 {path} m" + (f"; no gain at: {'; '.join(worse)}" if worse else "")
                    + f"; {claim}" + ("" if len(known) == 4 else f" ({4 - len(known)} step(s) not run)")))
    else:
        out.append((None, f"{claim}: not run"))
    claim = "paper: distilling from a diffusion teacher beats distilling from an AR teacher"
    md, art = _l2(ab, "model_distill"), _l2(ab, "ar_teacher")
    out.append((md < art, f"mean L2 {md:.2f} m (diffusion teacher) vs {art:.2f} m (AR teacher); {claim}")
               if md is not None and art is not None else (None, f"{claim}: not run"))
    claim = "paper: JSD is the better Stage III divergence than forward or reverse KL"
    j, f, r = (_l2(dv, k) for k in ("jsd", "fkl", "rkl"))
    others = [v for v in (f, r) if v is not None]
    out.append((j <= min(others), f"mean L2 JSD {j:.2f} m, forward KL {_f(f)} m, reverse KL {_f(r)} m; {claim}")
               if j is not None and others else (None, f"{claim}: not run"))
    claim = f"paper: a diffusion teacher's top-{K} overlaps the student's more than an AR teacher's"
    for s in OVERLAP_STUDENTS:
        d_, a_ = (_ok(ov, f"{s.key}__{t}") for t in ("diffusion", "ar"))
        if d_ and a_:
            vd, va = d_["rho"]["value"], a_["rho"]["value"]
            out.append((vd > va, f"ρ{K} against the {s.label}: diffusion teacher {vd:.3f}, AR teacher {va:.3f}; "
                        f"{claim}"))
        else:
            out.append((None, f"{claim} ({s.label}): not run"))
    claim = "paper: the student drives at least as well as the AR model in closed loop"
    if cl:
        groups, episodes = closed_loop_frames(cl)
        for mode in cl["settings"]["modes"]:
            p = paired(episodes, "student", "ar", mode)
            out.append((p["lo"] >= -5, f"{mode}: student − AR DS {p['diff']:.1f} [{p['lo']:.1f}, {p['hi']:.1f}] "
                        f"over {p['episodes']} paired episodes; {claim} (rule: CI lower bound ≥ −5)")
                       if p else (None, f"{claim} ({mode}): not run"))
    else:
        out.append((None, f"{claim}: not run"))
    return out


def render_disagreements(items: list[tuple[bool | None, str]]) -> list[str]:
    lines = ["## Where we disagree with the paper", "",
             "Each line is computed from the JSON with the rule it states (lower L2 is better).", ""]
    disagree = [t for ok, t in items if ok is False]
    agree = [t for ok, t in items if ok is True]
    missing = [t for ok, t in items if ok is None]
    lines += [f"- **disagrees**: {t}" for t in disagree] or ["- no disagreement among the claims checked"]
    if agree:
        lines += ["", "Where we agree:", "", *[f"- agrees: {t}" for t in agree]]
    if missing:
        lines += ["", "Not checked (inputs missing):", "", *[f"- {t}" for t in missing]]
    return lines + [""]
