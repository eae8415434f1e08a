"""``wamdiff-train results evaluate``: the hierarchy's checkpoints evaluated open loop (``wamdiff-train eval``) and
closed loop (``wamdiff-eval closed-loop``), in process, into compact resumable JSON logs."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from wamdiff_training.runs import (ABLATION, CLOSED_LOOP, DEFAULT_THRESHOLD, DIVERGENCE, K, LEVEL, OPEN_LOOP,
                                   OPTIONAL_CLOSED_LOOP, OVERLAP_STUDENTS, OVERLAP_TEACHERS, PIECES, REDO_KEYS,
                                   RHO_TEACHER, ResultsError, SCHEMA, SWEEP, SWEPT, Target, clean,
                                   evaluate_runs, final_ar_runs, find_checkpoint, load_hierarchy_plan, read_json,
                                   step_of, with_ar, write_json)

log = logging.getLogger("wamdiff_training")


def same_file(a: str | None, b: str | None) -> bool:
    """Whether two logged paths name the same file (a root whose data folder links another root's is the same)."""
    return a == b or (a is not None and b is not None and Path(a).resolve() == Path(b).resolve())


def data_subset(data: Path, work: Path, max_samples: int | None) -> dict:
    """At most ``max_samples`` records per task from <data>/test.json, evenly spaced over the file (so every
    scenario and seed is represented, not just the first episode), written to <work>/test_subset.json."""
    test = data / "test.json"
    try:
        records = json.loads(test.read_text())
    except (OSError, ValueError) as exc:
        raise ResultsError(f"cannot read the held-out split {test} ({exc})") from exc
    by_task: dict[str, list] = {}
    for r in records:
        by_task.setdefault(r.get("task", "?"), []).append(r)
    from wamdiff_training.evaluation import evenly_spaced  # (lazy: torch)

    chosen = [r for rs in by_task.values() for r in evenly_spaced(rs, max_samples)]
    work.mkdir(parents=True, exist_ok=True)
    subset = work / "test_subset.json"
    subset.write_text(json.dumps(chosen))  # image paths stay relative: --root points at the data folder
    return {"file": str(test), "subset": str(subset), "image_root": str(data),
            "selection": "evenly spaced over the file, per task" + (f", at most {max_samples}" if max_samples else ""),
            "available": {t: len(rs) for t, rs in sorted(by_task.items())},
            "used": {t: sum(r.get("task") == t for r in chosen) for t in sorted(by_task)}}


class Evaluator:
    """``wamdiff-train eval`` in process, one checkpoint at a time; results cached by the weights of (checkpoint,
    rho teacher), so a checkpoint that appears in several pieces, or under another root that links the same run,
    decodes once (a threshold subset reuses a sweep's rows)."""

    def __init__(self, data: dict, work: Path, seed: int = 0) -> None:
        self.data, self.work, self.seed = data, work, seed
        self.cache: dict[tuple[str, str | None], dict] = {}

    def remember(self, entry: dict) -> None:
        """Cache an entry, only while it still describes its checkpoint's weights (a logged entry of a run that was
        trained again in the same folder must not answer for the new weights)."""
        if entry.get("status") == "ok" and entry.get("weights") == weights_id(entry["checkpoint"]):
            teacher = (entry.get("rho") or {}).get("teacher")
            if teacher is None or entry.get("rho_teacher_weights") == weights_id(teacher):
                self.cache[(entry["weights"], teacher and entry["rho_teacher_weights"])] = entry

    def open_loop(self, checkpoint: str, thresholds: Iterable[float], teacher: str | None) -> dict:
        thresholds = list(thresholds)
        cached = self.cache.get((weights_id(checkpoint), teacher and weights_id(teacher)))
        if cached is not None:
            rows = {r["threshold"]: r for r in cached["plan"]}
            ar = cached["decode"]["mode"] == "ar"
            if cached["decode"]["threshold"] == thresholds[0] and (ar or all(t in rows for t in thresholds)):
                rho = cached["rho"] and {**cached["rho"], "teacher": teacher}  # the same weights under this path
                return {**cached, "checkpoint": checkpoint, "step": step_of(checkpoint), "rho": rho,
                        "plan": list(rows.values()) if ar else [rows[t] for t in thresholds]}
        from transformers.utils import logging as hf_logging

        from wamdiff_training import evaluation

        hf_logging.disable_progress_bar()
        argv = ["--checkpoint", checkpoint, "--data", self.data["subset"], "--root", self.data["image_root"],
                "--thresholds", ",".join(f"{t:g}" for t in thresholds), "--k", str(K), "--seed", str(self.seed),
                *(["--teacher", teacher] if teacher else []), "--out", str(self.work / "eval"), "--no-progress"]
        result = evaluation.evaluate(evaluation.parser().parse_args(argv), argv)
        entry = {**compact_eval(result["checkpoints"][0], result), "weights": weights_id(checkpoint),
                 "rho_teacher_weights": teacher and weights_id(teacher)}
        self.remember(entry)
        return entry

    def rho(self, student: str, teacher: str) -> dict:
        """Only the teacher-forced part of ``wamdiff-train eval --teacher`` (the same states and alignment)."""
        from wamdiff_training import evaluation
        from wamdiff_training.data import encode_record, load_records

        began = time.perf_counter()
        argv = ["--checkpoint", student, "--teacher", teacher, "--data", self.data["subset"], "--out", "-"]
        args = evaluation.parser().parse_args(argv)
        t = evaluation.load_subject(teacher, "teacher", args, DEFAULT_THRESHOLD, "--teacher")
        s = evaluation.load_subject(student, "student", args, DEFAULT_THRESHOLD)
        evaluation.check_teacher(t, s)
        records = load_records(self.data["subset"], self.data["image_root"])
        samples = {task: [encode_record(s.bundle, r) for r in records if r.task == task] for task in evaluation.TASKS}
        accuracy, rho = evaluation.teacher_forced(s, {k: v for k, v in samples.items() if v}, t, K, args.batch_size,
                                                  self.seed)
        return {"rho": rho, "student_decode": "ar" if s.ar else f"B={s.settings.block_size}",
                "teacher_decode": "ar" if t.ar else f"B={t.settings.block_size}",
                "token_accuracy": accuracy["token_accuracy"], "positions": accuracy["positions"],
                "wall_s": time.perf_counter() - began}


def compact_eval(e: dict, result: dict) -> dict:
    """The fields RESULTS.md needs of one ``wamdiff-train eval`` checkpoint entry (no per-record data)."""
    tf, det, ask, rho = e["teacher_forced"], e["detection"], e["ask"], e.get("rho")
    return {
        "status": "ok", "checkpoint": e["path"], "step": step_of(e["path"]),
        "decode": {"mode": e["decode"]["mode"], "block_size": e["decode"]["block_size"],
                   "trained_block_size": e["decode"]["trained_block_size"], "threshold": e["decode"]["threshold"],
                   "steps": e["decode"]["steps"]},
        "plan": [{"threshold": r["threshold"], "plans": r["plans"], "invalid_rate": r["invalid_rate"],
                  "l2_mean": r["l2_mean"], "l2_per_waypoint": r["l2_per_waypoint"],
                  "forward_calls_per_token": r["forward_calls_per_token"], "tokens_per_s": r["tokens_per_s"],
                  "latency_ms": r["latency_ms"], "by_behaviour": r.get("by_behaviour")} for r in e["plan"]["sweep"]],
        "token_accuracy": tf["token_accuracy"], "token_accuracy_states": tf["states"],
        "detection": {k: det[k] for k in ("records", "invalid", "precision", "recall", "map50")},
        "question_accuracy": ask["exact_match"], "question_accuracy_normalised": ask["normalised_match"],
        "questions": ask["records"], "per_question": ask.get("per_question"),
        "lead_distance": ask.get("lead_distance"),
        "rho": None if rho is None else {k: rho[k] for k in ("k", "value", "positions", "teacher", "alignment")},
        "command_line": result["command_line"], "wall_s": result["wall_s"],
    }


@dataclass(slots=True)
class Piece:
    """One results JSON being (re)built entry by entry; written after every entry, so a kill loses one at most.

    Entries are kept across runs while the settings hold, apart from the root: an entry stands for the weights it
    was computed from, so a root that links another root's runs keeps their entries.
    ``source`` is the held-out file the open-loop pieces decode (None for the closed loop); it must not change."""

    name: str
    path: Path
    settings: dict
    force: bool
    source: str | None = None
    data: dict | None = None
    kept: int = 0

    def __post_init__(self) -> None:
        old = None if self.force else read_json(self.path)
        if old is not None:
            was = {k: v for k, v in (old.get("settings") or {}).items() if k != "root"}
            now = {k: v for k, v in clean(self.settings).items() if k != "root"}
            if was != now or not same_file((old.get("data") or {}).get("file"), self.source):
                log.info("results: %s: settings changed (%s -> %s), evaluating again", self.name,
                         {**was, "data": (old.get("data") or {}).get("file")}, {**now, "data": self.source})
                old = None
        self.data = {"piece": self.name, "schema": SCHEMA, "settings": self.settings,
                     "entries": {} if old is None else old.get("entries", {})}

    def current(self, key: str, checkpoint: str | None) -> dict | None:
        """The stored entry when it is done and still describes ``checkpoint``'s weights (a run trained again writes
        the same step folder with other weights); one computed from the same weights under another path (the run
        linked into this root) is kept with this path."""
        entry = self.data["entries"].get(key)
        if entry is None or entry.get("status") != "ok" or (entry.get("checkpoint") is None) != (checkpoint is None):
            return None
        if checkpoint is None:  # the baselines: no weights
            return entry
        if entry.get("weights") is None or entry["weights"] != weights_id(checkpoint):
            return None
        if entry["checkpoint"] != checkpoint:
            log.info("results: %s/%s: the weights of %s, kept from %s", self.name, key, checkpoint, entry["checkpoint"])
            entry = self.data["entries"][key] = {**entry, "checkpoint": checkpoint, "step": step_of(checkpoint)}
        return entry

    def logged(self, key: str, *folders: Path) -> bool:
        """Keeps ``key``'s done entry as logged when one of the run folders it was computed from is not on this
        machine (trained and evaluated on another: a fresh machine holds only the runs trained there), so that
        evaluating the runs at hand loses nothing; True when kept."""
        entry = self.data["entries"].get(key)
        if entry is None or entry.get("status") != "ok" or all(f.exists() for f in folders):
            return False
        log.info("results: %s/%s: kept as logged (%s is not on this machine)", self.name, key,
                 next(f for f in folders if not f.exists()))
        self.kept += 1
        return True

    def put(self, key: str, entry: dict) -> None:
        if entry.get("status") == "ok" and entry.get("checkpoint"):
            entry = {**entry, "weights": weights_id(entry["checkpoint"])}
        if entry.get("status") == "ok" and entry.get("teacher"):  # overlap entries: the teacher's weights too
            entry = {**entry, "teacher_weights": weights_id(entry["teacher"])}
        self.data["entries"][key] = entry
        write_json(self.path, self.data)

    def finish(self, keys: list[str], extra: dict | None = None) -> dict:
        entries = self.data["entries"]
        self.data["entries"] = {k: entries[k] for k in keys if k in entries}
        self.data.update(extra or {})
        self.data["complete"] = all(e.get("status") == "ok" for e in self.data["entries"].values())
        write_json(self.path, self.data)
        return self.data


def weights_id(checkpoint: str | Path) -> str | None:
    """sha256 (first 16 hex digits) of a checkpoint's model.safetensors: what an entry was computed from."""
    path = Path(checkpoint) / "model.safetensors"
    if not path.is_file():
        return None
    stat = path.stat()
    return _weights_id(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _weights_id(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def _eval_entries(piece: Piece, targets: Iterable[Target], root: Path, evaluator: Evaluator,
                  thresholds: Callable[[Target], list[float]], teacher: Callable[[Target], str | None]) -> None:
    for target in targets:
        ckpt, why = find_checkpoint(root, target.run)
        base = {"run": target.run, "label": target.label}
        if ckpt is None and piece.logged(target.key, root / target.run):
            continue
        if ckpt is None:
            log.info("results: %s/%s: not run (%s)", piece.name, target.key, why)
            piece.put(target.key, {**base, "status": "not run", "reason": why})
            continue
        want = teacher(target)
        if (kept := piece.current(target.key, ckpt)) is not None:
            have = ((kept.get("rho") or {}).get("teacher") is not None, kept.get("rho_teacher_weights"))
            if have != (want is not None, want and weights_id(want)):  # the rho teacher appeared or changed: rho again
                log.info("results: %s/%s: rho%d against %s (was %s)", piece.name, target.key, K, want, have)
                try:
                    kept = {**kept, "rho": evaluator.rho(ckpt, want)["rho"] if want else None,
                            "rho_teacher_weights": want and weights_id(want)}
                except Exception as exc:  # noqa: BLE001
                    log.warning("results: %s/%s: rho failed: %s", piece.name, target.key, exc)
                    kept = {**kept, "rho": None}
                piece.put(target.key, kept)
            else:
                if want and kept["rho"]["teacher"] != want:  # the same teacher weights, linked into this root
                    kept = {**kept, "rho": {**kept["rho"], "teacher": want}}
                    piece.put(target.key, kept)
                log.info("results: %s/%s: kept (%s)", piece.name, target.key, ckpt)
            evaluator.remember(kept)
            piece.kept += 1
            continue
        log.info("results: %s/%s: evaluating %s", piece.name, target.key, ckpt)
        try:
            entry = {**evaluator.open_loop(ckpt, thresholds(target), want),
                     "rho_teacher_weights": want and weights_id(want)}
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not stop the other evaluations
            log.warning("results: %s/%s: failed: %s", piece.name, target.key, exc)
            entry = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "checkpoint": ckpt}
        piece.put(target.key, {**base, **entry})


def _teacher_for(root: Path, target: Target) -> str | None:
    ckpt, _ = find_checkpoint(root, RHO_TEACHER)
    return None if target.run == RHO_TEACHER else ckpt


def evaluate_open_loop(root: Path, out: Path, evaluator: Evaluator, force: bool, settings: dict,
                       targets: tuple[Target, ...] = OPEN_LOOP) -> dict:
    piece = Piece("open_loop", out / "open_loop.json", {**settings, "sweep": list(SWEEP),
                                                        "threshold": DEFAULT_THRESHOLD, "rho_teacher": RHO_TEACHER},
                  force, evaluator.data["file"])
    sweep = [DEFAULT_THRESHOLD, *(t for t in SWEEP if t != DEFAULT_THRESHOLD)]  # the first decodes detect / ask
    _eval_entries(piece, targets, root, evaluator,
                  lambda t: sweep if t.key == SWEPT else [DEFAULT_THRESHOLD], lambda t: _teacher_for(root, t))
    return piece.finish([t.key for t in targets], {"data": evaluator.data})


def evaluate_fixed(name: str, targets: tuple[Target, ...], root: Path, out: Path, evaluator: Evaluator, force: bool,
                   settings: dict) -> dict:
    piece = Piece(name, out / f"{name}.json", {**settings, "threshold": DEFAULT_THRESHOLD, "block_size": 32,
                                               "rho_teacher": RHO_TEACHER}, force, evaluator.data["file"])
    _eval_entries(piece, targets, root, evaluator, lambda t: [DEFAULT_THRESHOLD], lambda t: _teacher_for(root, t))
    return piece.finish([t.key for t in targets], {"data": evaluator.data})


def evaluate_overlap(root: Path, out: Path, evaluator: Evaluator, force: bool, settings: dict,
                     teachers: tuple[Target, ...] = OVERLAP_TEACHERS) -> dict:
    piece = Piece("overlap", out / "overlap.json", {**settings, "k": K}, force, evaluator.data["file"])
    keys = []
    for s in OVERLAP_STUDENTS:
        for t in teachers:
            key = f"{s.key}__{t.key}"
            keys.append(key)
            base = {"student_run": s.run, "student_label": s.label, "teacher_run": t.run, "teacher_label": t.label,
                    "teacher_kind": t.key}
            ckpt, why = find_checkpoint(root, s.run)
            teacher, why_t = find_checkpoint(root, t.run)
            if (ckpt is None or teacher is None) and piece.logged(key, root / s.run, root / t.run):
                continue
            if ckpt is None or teacher is None:
                piece.put(key, {**base, "status": "not run", "reason": why or why_t})
                log.info("results: overlap/%s: not run (%s)", key, why or why_t)
                continue
            kept = piece.current(key, ckpt)
            if kept is not None and kept.get("teacher_weights") == weights_id(teacher):
                if kept.get("teacher") != teacher:  # the same teacher weights, linked into this root
                    rho = kept.get("rho")
                    rho = {**rho, "teacher": teacher} if isinstance(rho, dict) and "teacher" in rho else rho
                    piece.put(key, {**kept, "teacher": teacher, "teacher_step": step_of(teacher), "rho": rho})
                piece.kept += 1
                continue
            log.info("results: overlap/%s: rho%d of %s against %s", key, K, ckpt, teacher)
            try:
                entry = {"status": "ok", "checkpoint": ckpt, "step": step_of(ckpt), "teacher": teacher,
                         "teacher_step": step_of(teacher), **evaluator.rho(ckpt, teacher)}
            except Exception as exc:  # noqa: BLE001
                log.warning("results: overlap/%s: failed: %s", key, exc)
                entry = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "checkpoint": ckpt}
            piece.put(key, {**base, **entry})
    return piece.finish(keys, {"data": evaluator.data})


def compact_report(report: dict, rename: dict[str, str]) -> dict:
    """Per-episode rows (what paired CIs need) and the per (planner, mode) totals of a ``wamdiff-eval`` report."""
    episodes = [{"planner": rename.get(s["planner"], s["planner"]), "mode": s["mode"], "scenario": s["scenario"],
                 "seed": s["seed"], "ds": s["driving_score"], "rc": s["route_completion"],
                 "penalty": s["infraction_penalty"], "collisions": s["collisions"],
                 "at_fault": s["at_fault_collisions"], "success": s["success"],
                 "completed": s["end_reason"] == "completed", "end_reason": s["end_reason"],
                 "latency_p50_ms": None if s["plan_latency_p50_s"] is None else 1e3 * s["plan_latency_p50_s"],
                 "forward_calls_per_token": s.get("forward_calls_per_token")} for s in report["episodes"]]
    keys = ("episodes", "ds", "ds_lo", "ds_hi", "sr", "rc", "penalty", "collisions_per_ep", "at_fault_per_ep",
            "latency_p50_ms", "latency_p90_ms", "forward_calls_per_token")
    groups = [{"planner": rename.get(g["planner"], g["planner"]), "mode": g["mode"], **{k: g.get(k) for k in keys}}
              for g in report["summary"]["groups"]]
    run = report.get("run", {})
    return {"groups": groups, "episodes": episodes, "level": report["summary"].get("level", LEVEL),
            "scenario_set": run.get("scenario_set"), "scenario_version": run.get("scenario_version"),
            "wall_s": run.get("wall_s"), "host": run.get("host")}


def evaluate_closed_loop(root: Path, out: Path, work: Path, args: argparse.Namespace,
                         targets: tuple[Target, ...] = CLOSED_LOOP, redo: set[str] = frozenset()) -> dict:
    modes = ["paused", "realtime"]
    settings = {"root": str(root), "episodes_per_scenario": args.episodes, "first_seed": args.seed,
                "scenarios": args.scenarios, "scenario_file": args.scenario_file, "modes": modes,
                "plan_hz": args.plan_hz}
    if args.blend_tau:  # recorded only when on: the logs made before blending existed stay current
        settings["plan_blend_tau_s"] = args.blend_tau
    piece = Piece("closed_loop", out / "closed_loop.json", settings, args.force)
    keys = []
    for target in targets:
        if target.key == "teacher_ar" and not args.with_teacher:
            if piece.data["entries"].get(target.key, {}).get("status") == "ok":
                keys.append(target.key)  # from an earlier --with-teacher run: kept
            continue
        base = {"label": target.label, "run": target.run or None}
        ckpt = why = None
        if target.run:
            ckpt, why = find_checkpoint(root, target.run)
            if ckpt is None and piece.logged(target.key, root / target.run):
                keys.append(target.key)
                continue
            if ckpt is None and target.key in OPTIONAL_CLOSED_LOOP:
                log.info("results: closed_loop/%s: skipped (%s)", target.key, why)
                continue
        keys.append(target.key)
        if target.run and ckpt is None:
            log.info("results: closed_loop/%s: not run (%s)", target.key, why)
            piece.put(target.key, {**base, "status": "not run", "reason": why})
            continue
        if target.key not in redo and piece.current(target.key, ckpt) is not None:
            piece.kept += 1
            log.info("results: closed_loop/%s: kept", target.key)
            continue
        report_dir = work / "closed_loop" / target.key
        model = snapshot(ckpt, work / "snapshots" / target.key) if ckpt else "none"
        argv = ["closed-loop", "--model", model,
                "--baselines", "expert,constant_velocity" if ckpt is None else "none",
                "--scenarios", args.scenarios, "--episodes", str(args.episodes), "--seed", str(args.seed),
                "--workers", str(args.workers), "--plan-hz", str(args.plan_hz), "--blend-tau", str(args.blend_tau),
                "--realtime",
                "--videos", "2" if target.key == "student" else "0",
                "--out", str(report_dir), "--no-progress",
                *(["--scenario-file", args.scenario_file] if args.scenario_file else [])]
        log.info("results: closed_loop/%s: wamdiff-eval %s", target.key, " ".join(argv))
        entry = _closed_loop_run(argv, report_dir, target, ckpt)
        piece.put(target.key, {**base, **entry})
    return piece.finish(keys)


def snapshot(ckpt: str, folder: Path) -> str:
    """A copy of the checkpoint's model files (not its training state) for a long closed-loop run: a training run
    still going rotates its old checkpoints away (``out.keep``) while the evaluator's workers load theirs."""
    import shutil

    dest = folder / Path(ckpt).name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ckpt, dest, ignore=shutil.ignore_patterns("train_state.pt", "*.tmp-*"))
    return str(dest)


def _closed_loop_run(argv: list[str], report_dir: Path, target: Target, ckpt: str | None) -> dict:
    from wamdiff_ros.world import evaluate

    try:
        code = evaluate.main(argv)
    except SystemExit as exc:  # argparse's error exit
        code = exc.code
    report = read_json(report_dir / "report.json") if code == 0 else None
    if report is None:
        log.warning("results: closed_loop/%s: wamdiff-eval exited with %s", target.key, code)
        return {"status": "failed", "reason": f"wamdiff-eval exited with {code}", "checkpoint": ckpt}
    rename = {} if ckpt is None else {"model": target.key}
    videos = sorted(str(p) for p in report_dir.glob("video_*.mp4"))
    return {"status": "ok", "checkpoint": ckpt, "step": step_of(ckpt), "command_line": ["wamdiff-eval", *argv],
            **compact_report(report, rename), **({"videos": videos} if videos else {})}


def evaluate_all(args: argparse.Namespace) -> dict[str, str]:
    root, out, work = Path(args.root), Path(args.out), Path(args.work)
    only = PIECES if not args.only else tuple(args.only.split(","))
    unknown = set(only) - set(PIECES)
    if unknown:
        raise ResultsError(f"--only: unknown piece(s) {', '.join(sorted(unknown))}; known: {', '.join(PIECES)}")
    redo = set(args.redo.split(",")) if args.redo else set()
    if redo - set(REDO_KEYS):
        raise ResultsError(f"--redo: unknown closed-loop key(s) {', '.join(sorted(redo - set(REDO_KEYS)))}; "
                           f"known: {', '.join(REDO_KEYS)}")
    if not root.is_dir():
        raise ResultsError(f"--root {root}: no such folder")
    if args.episodes < 1 or args.workers < 1 or (args.max_samples is not None and args.max_samples < 1):
        raise ResultsError("--episodes, --workers and --max-samples must be >= 1")
    plan = load_hierarchy_plan(args.plan, root)
    ar = final_ar_runs(plan, root)  # AR rows: each model's last DAgger round when the plan has rounds
    done: dict[str, str] = {}
    if "runs" in only:
        evaluate_runs(root, out, args.plan, plan)
        done["runs"] = "refreshed"
    open_pieces = [p for p in ("open_loop", "ablation", "divergence", "overlap") if p in only]
    if open_pieces:
        settings = {"root": str(root), "max_samples": args.max_samples, "seed": 0}
        evaluator = Evaluator(data_subset(root / "data", work, args.max_samples), work)
        for name in ("open_loop", "ablation", "divergence"):  # earlier pieces' entries seed the cache
            old = read_json(out / f"{name}.json")
            if old is not None and not args.force and old.get("settings", {}).get("max_samples") == args.max_samples \
                    and same_file((old.get("data") or {}).get("file"), evaluator.data["file"]):  # keyed by weights
                for entry in old.get("entries", {}).values():
                    evaluator.remember(entry)
        for name in open_pieces:
            if name == "open_loop":
                piece = evaluate_open_loop(root, out, evaluator, args.force, settings, with_ar(OPEN_LOOP, ar))
            elif name == "overlap":
                piece = evaluate_overlap(root, out, evaluator, args.force, settings, with_ar(OVERLAP_TEACHERS, ar))
            else:
                piece = evaluate_fixed(name, ABLATION if name == "ablation" else DIVERGENCE, root, out, evaluator,
                                       args.force, settings)
            done[name] = _status(piece)
    if "closed_loop" in only:
        done["closed_loop"] = _status(evaluate_closed_loop(root, out, work, args, with_ar(CLOSED_LOOP, ar), redo))
    return done


def _status(piece: dict) -> str:
    entries = piece["entries"].values()
    counts = {s: sum(e.get("status") == s for e in entries) for s in ("ok", "not run", "failed")}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)
