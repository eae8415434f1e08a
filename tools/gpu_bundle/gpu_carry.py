#!/usr/bin/env python3
"""Helper of ``tools/gpu_bundle/build_gpu_carry.sh`` (and of the device script): which FlashInfer
files the GPU carry bundle must keep, proof that the trimmed copy still builds, and a
JIT prebuild to run on the GPU machine.  Not imported by the package.

Subcommands (each puts nothing on sys.path itself: run it with PYTHONPATH set)

``closure --site FULL --out manifest.json``
    With the *full* unpacked flashinfer package importable from FULL, generate on the
    CPU the JIT specs of the kernels the GPU fast path may build (SPECS below: FA3/FA2
    batch prefill over ragged or paged KV, batch decode, single prefill/decode, page
    append, cascade merge; bf16, head_dim 128, sm_90a), record every
    package data file Python opens while doing so (jinja templates, csrc files), and
    follow the ``#include`` closure of every spec source through the include path the
    JIT's ninja file uses (cccl, tvm_ffi, flashinfer include, csrc, cutlass, spdlog).
    Conditionals are ignored and every match in every include dir is kept, so the
    result is a superset of what any preprocessor configuration reads; the computed
    includes CUTLASS and Thrust use are expanded (COMPUTED).  Writes the keep-list.

``verify --site TRIMMED --manifest manifest.json [--nvcc] [--cpath DIR]``
    Import flashinfer from the trimmed site, regenerate the same specs (templates
    present?), rescan the closure (no include may resolve in FULL but not in
    TRIMMED) and, with ``--nvcc``, run ``nvcc -M`` (host and device preprocessing,
    exactly the ninja file's flags) on one translation unit per distinct template of
    every spec: a missing header fails it.

``prebuild [--specs fa3,page,...]``
    On the GPU machine, after ``source build/gpu_carry/env.sh``: JIT-build the named
    specs in one parallel ninja run and print the seconds it took.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\n]+)[>"]', re.M)
COMPUTED_RE = re.compile(
    r"^[ \t]*#[ \t]*include(?:_next)?[ \t]+([A-Za-z_]\w*)(?:[ \t]*\(([^)\n]*)\))?", re.M)
# computed includes seen in the cutlass / cccl closure -> the names they can expand to
COMPUTED = {
    "CUDA_STD_HEADER": lambda a: [f"cuda/std/{a}"],
    "__THRUST_DEVICE_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE":
        lambda a: [f"thrust/system/{s}/detail/{a}" for s in ("cuda", "omp", "tbb", "cpp")],
    "__THRUST_HOST_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE":
        lambda a: [f"thrust/system/{s}/detail/{a}" for s in ("cpp", "omp", "tbb")],
}

DT = "bfloat16"
HEAD_DIM = 128
ARCH = "9.0a"
# label -> required?  (a required spec that fails to generate fails the build)
SPECS = {
    "fa3": True,            # batch prefill, FA3 (sm90a): ragged + paged, mask modes 0..3
    "fa2": True,            # batch prefill, FA2 primary module (equal-stride paged + ragged)
    "fa2_indep_paged": False,
    "fa2_full": False,
    "decode": False,        # batch decode over paged KV
    "single_prefill_fa3": False,
    "single_prefill_fa2": False,
    "single_decode": False,
    "page": True,           # append_paged_kv_cache
    "cascade": False,       # merge_state(s)
}
# Not kept: norm / rope (the model's RMSNorm and M-RoPE run in torch; flashinfer's norm.cu
# also pulls trtllm headers that need cublasLt.h), gemm, moe, comm, sampling, mla, ...
PREBUILD_DEFAULT = "fa3,page"


def _make_spec(label: str):
    import torch

    from flashinfer.jit.attention import modules as M

    bf, i32, hd = getattr(torch, DT), torch.int32, HEAD_DIM
    # pos_encoding_mode=0 (rope done by the model), no sliding window, no soft cap, no fp16 qk
    pre = (bf, bf, bf, i32, hd, hd, 0, False, False, False)
    if label == "fa3":
        return M.gen_batch_prefill_module("fa3", *pre)
    if label == "fa2":
        return M._gen_batch_prefill_primary_module("fa2", *pre)
    if label == "fa2_indep_paged":
        return M._gen_batch_prefill_independent_paged_module("fa2", *pre)
    if label == "fa2_full":
        return M.gen_batch_prefill_module("fa2", *pre)
    if label == "decode":
        return M.gen_batch_decode_module(bf, bf, bf, i32, hd, hd, 0, False, False)
    if label == "single_prefill_fa3":
        return M.gen_single_prefill_module("fa3", bf, bf, bf, hd, hd, 0, False, False, False)
    if label == "single_prefill_fa2":
        return M.gen_single_prefill_module("fa2", bf, bf, bf, hd, hd, 0, False, False, False)
    if label == "single_decode":
        return M.gen_single_decode_module(bf, bf, bf, hd, hd, 0, False, False)
    if label == "page":
        from flashinfer.jit.page import gen_page_module
        return gen_page_module()
    if label == "cascade":
        from flashinfer.jit.cascade import gen_cascade_module
        return gen_cascade_module()
    raise KeyError(label)


_RECORDING = {"on": False}  # the closure's audit hook records file opens only while a spec is made


def _specs(labels=None):
    for label in labels or SPECS:
        try:
            _RECORDING["on"] = True
            try:
                spec = _make_spec(label)
            finally:
                _RECORDING["on"] = False
            yield label, spec, None
        except Exception as exc:  # optional specs may not exist in another version
            if SPECS.get(label, True):
                raise
            yield label, None, f"{type(exc).__name__}: {exc}"


def _ninja_vars(spec) -> dict[str, str] | None:
    try:
        spec.write_ninja()
        text = Path(spec.ninja_path).read_text().replace("$\n", " ")
    except Exception:
        return None
    raw: dict[str, str] = {}
    for m in re.finditer(r"^(\w+) = (.*)$", text, re.M):
        raw.setdefault(m.group(1), m.group(2))

    def expand(s: str) -> str:
        for _ in range(8):
            s = re.sub(r"\$(\w+)", lambda m: raw.get(m.group(1), ""), s)
        return s

    return {k: expand(v) for k, v in raw.items()}


def _include_dirs(spec) -> tuple[list[Path], str]:
    v = _ninja_vars(spec)
    if v and "common_cflags" in v:
        toks = shlex.split(v["common_cflags"])
        dirs = []
        for i, t in enumerate(toks):
            if t in ("-I", "-isystem") and i + 1 < len(toks):
                dirs.append(Path(toks[i + 1]))
            elif t.startswith("-I") and len(t) > 2:
                dirs.append(Path(t[2:]))
        return dirs, "ninja"
    from flashinfer.jit import env

    dirs = list(env.CCCL_INCLUDE_DIRS)
    try:
        import tvm_ffi.libinfo as li
        dirs += [Path(p) for p in li.include_paths()]
    except Exception:
        pass
    dirs += [env.FLASHINFER_INCLUDE_DIR, env.FLASHINFER_CSRC_DIR, *env.CUTLASS_INCLUDE_DIRS,
             env.SPDLOG_INCLUDE_DIR, *[Path(p) for p in (spec.extra_include_dirs or [])]]
    return dirs, "default"


def closure(roots, include_dirs, stats) -> set[Path]:
    """#include closure: every match in every dir, conditionals ignored (a superset)."""
    seen: set[Path] = set()
    todo = [Path(r).resolve() for r in roots]
    dirs = [d.resolve() for d in include_dirs if d.is_dir()]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        names = [(k, n.strip()) for k, n in INCLUDE_RE.findall(text)]
        for m in COMPUTED_RE.finditer(text):
            macro, arg = m.group(1), (m.group(2) or "").strip()
            if macro in COMPUTED:
                names += [("<", n) for n in COMPUTED[macro](arg)]
            else:
                stats["computed_unhandled"].add(f"{f.name}: #include {m.group(0).split('include', 1)[1].strip()}")
        for kind, name in names:
            found = False
            for d in ([f.parent] if kind == '"' else []) + dirs:
                p = d / name
                if p.is_file():
                    found = True
                    todo.append(p.resolve())
            if not found:
                stats["unresolved"].add(name)
    return seen


def _setup_env(ws: str | None = None) -> str:
    if ws is None:
        ws = tempfile.mkdtemp(prefix="wamdiff_fi_ws_")  # generated sources + ninja files only
        atexit.register(shutil.rmtree, ws, ignore_errors=True)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", ARCH)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = ws
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    return ws


def _import_flashinfer(site: Path):
    import flashinfer

    got = Path(flashinfer.__file__).resolve().parent
    if got != (site / "flashinfer").resolve():
        raise SystemExit(f"flashinfer imported from {got}, expected {site / 'flashinfer'}")
    return flashinfer


def _scan(site: Path, opened: set[Path] | None = None):
    from flashinfer.jit import env

    data = (site / "flashinfer" / "data").resolve()
    gen = Path(env.FLASHINFER_GEN_SRC_DIR).resolve()
    stats = {"computed_unhandled": set(), "unresolved": set()}
    keep: set[Path] = set()
    specs = []
    for label, spec, err in _specs():
        if spec is None:
            specs.append({"label": label, "skipped": err})
            continue
        inc, how = _include_dirs(spec)
        files = closure(spec.sources, inc, stats)
        mine = {p for p in files if p.is_relative_to(data)}
        keep |= mine
        specs.append({
            "label": label, "name": spec.name, "include_dirs_from": how,
            "sources": [str(Path(s).resolve()).replace(str(gen), "$GEN").replace(str(site), "$SITE")
                        for s in spec.sources],
            "closure_files_in_package": len(mine),
            "closure_files_outside_package": len(files) - len(mine),
        })
    if opened:
        keep |= {p for p in opened if p.is_file() and p.is_relative_to(data)}
    return keep, specs, stats


def cmd_closure(a) -> int:
    site = a.site.resolve()
    _setup_env()
    data = str((site / "flashinfer" / "data").resolve())
    opened: set[Path] = set()

    def hook(event, hargs):
        if _RECORDING["on"] and event == "open" and hargs and isinstance(hargs[0], (str, bytes, os.PathLike)):
            try:
                p = Path(os.fsdecode(hargs[0])).resolve()
            except Exception:
                return
            if str(p).startswith(data):
                opened.add(p)

    _RECORDING["on"] = True  # import-time reads of data files count too
    sys.addaudithook(hook)
    fi = _import_flashinfer(site)
    _RECORDING["on"] = False
    keep, specs, stats = _scan(site, opened)
    rel = sorted(str(p.relative_to(site)) for p in keep)
    manifest = {
        "flashinfer_version": fi.__version__, "arch": ARCH, "dtype": DT, "head_dim": HEAD_DIM,
        "specs": specs, "keep": rel,
        "keep_bytes": sum((site / r).stat().st_size for r in rel),
        "opened_during_generation": sorted(str(p.relative_to(site)) for p in opened if p.is_file()),
        "unresolved_includes": sorted(stats["unresolved"]),
        "computed_includes_unhandled": sorted(stats["computed_unhandled"]),
    }
    a.out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"closure: flashinfer {fi.__version__}: keep {len(rel)} data files "
          f"({manifest['keep_bytes'] / 2**20:.2f} MiB); {len(stats['unresolved'])} include names "
          f"resolve outside the package (CUDA toolkit / libc++); "
          f"{len(stats['computed_unhandled'])} computed includes unhandled; specs: "
          + ", ".join(s["label"] + (" (skipped)" if "skipped" in s else "") for s in specs))
    return 0


def _nvcc_check(spec, site: Path, cpath: list[str]) -> tuple[int, int, float]:
    """nvcc -M (host + device preprocessing, ninja's flags) on one TU per template."""
    v = _ninja_vars(spec)
    if not v or "cuda_cflags" not in v:
        raise RuntimeError(f"{spec.name}: no ninja file to read flags from")
    nvcc = v.get("nvcc") or "nvcc"
    flags = shlex.split(v["cuda_cflags"])
    srcs = [Path(s) for s in spec.sources
            if "mask_" not in Path(s).name or "mask_0" in Path(s).name]
    env = dict(os.environ)
    if cpath:
        env["CPATH"] = os.pathsep.join(cpath + ([env["CPATH"]] if env.get("CPATH") else []))
    n_deps, t0 = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        for s in srcs:
            dep = Path(td) / (s.name + ".d")
            cmd = [nvcc, *flags, "-M", str(s), "-o", str(dep)]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"nvcc -M failed on {s.name}:\n{r.stderr[-3000:]}")
            deps = dep.read_text().replace("\\\n", " ").split()[1:]
            n_deps += len(deps)
            for d in deps:
                p = Path(d)
                if p.is_relative_to(site) and not p.exists():
                    raise RuntimeError(f"{s.name}: dependency {p} missing")
    return len(srcs), n_deps, time.perf_counter() - t0


def cmd_verify(a) -> int:
    site = a.site.resolve()
    full = json.loads(a.manifest.read_text())
    _setup_env()
    fi = _import_flashinfer(site)
    for name in ("BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                 "BatchDecodeWithPagedKVCacheWrapper"):
        if not hasattr(fi, name):
            raise SystemExit(f"flashinfer.{name} missing")
    print(f"verify: import flashinfer {fi.__version__} from {site} OK (wrappers present)")
    keep, specs, stats = _scan(site)
    skipped = [s["label"] for s in specs if "skipped" in s]
    full_skipped = [s["label"] for s in full["specs"] if "skipped" in s]
    if skipped != full_skipped:
        raise SystemExit(f"specs fail to generate on the trimmed site: {skipped} (full: {full_skipped})")
    lost = sorted(stats["unresolved"] - set(full["unresolved_includes"]))
    if lost:
        raise SystemExit(f"includes resolved in the full package but not the trimmed one: {lost[:20]}")
    print(f"verify: {len(specs) - len(skipped)} specs regenerate from the trimmed site; include "
          f"closure complete ({len(keep)} data files, none lost)")
    if a.nvcc:
        total_tu, total_s = 0, 0.0
        for label, spec, err in _specs():
            if spec is None:
                continue
            n, nd, s = _nvcc_check(spec, site, a.cpath)
            total_tu, total_s = total_tu + n, total_s + s
            print(f"verify: nvcc -M {label}: {n} TUs, {nd} header deps, {s:.1f} s", flush=True)
        print(f"verify: nvcc -M OK on {total_tu} TUs ({total_s:.0f} s)")
    return 0


def cmd_prebuild(a) -> int:
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", ARCH)
    t0 = time.perf_counter()
    import flashinfer  # noqa: F401
    from flashinfer.jit.core import build_jit_specs

    labels = [s for s in a.specs.split(",") if s]
    specs = [_make_spec(lb) for lb in labels]
    t1 = time.perf_counter()
    build_jit_specs(specs, verbose=a.verbose)
    t2 = time.perf_counter()
    if not a.no_load:
        for spec in specs:
            spec.build_and_load()
    t3 = time.perf_counter()
    print(json.dumps({"prebuild": labels, "import_s": round(t1 - t0, 2),
                      "build_s": round(t2 - t1, 2), "load_s": round(t3 - t2, 2),
                      "flashinfer": flashinfer.__version__,
                      "modules": [spec.name for spec in specs],
                      "jit_dir": str(specs[0].build_dir.parent) if specs else None}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("closure")
    c.add_argument("--site", required=True, type=Path)
    c.add_argument("--out", required=True, type=Path)
    v = sub.add_parser("verify")
    v.add_argument("--site", required=True, type=Path)
    v.add_argument("--manifest", required=True, type=Path)
    v.add_argument("--nvcc", action="store_true")
    v.add_argument("--cpath", action="append", default=[])
    p = sub.add_parser("prebuild")
    p.add_argument("--specs", default=PREBUILD_DEFAULT)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--no-load", action="store_true", help="build only (no GPU driver needed)")
    a = ap.parse_args(argv)
    return {"closure": cmd_closure, "verify": cmd_verify, "prebuild": cmd_prebuild}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
