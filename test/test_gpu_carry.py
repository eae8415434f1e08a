"""The FlashInfer carry bundle for the GPU machine (tools/gpu_bundle/build_gpu_carry.sh, tools/gpu_bundle/README.md).

Skips unless the bundle was built here (``tools/gpu_bundle/build_gpu_carry.sh``); it is not built in CI.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "gpu_carry"
WORK = ROOT / "build" / "gpu_carry_work"
TAR = OUT / "site.tar.xz"
CARRY_LIMIT = 64 * 2**20
MARGIN = 8 * 2**20  # as tools/gpu_bundle/build_gpu_carry.sh (MARGIN_MIB)

pytestmark = pytest.mark.skipif(
    not TAR.is_file(), reason="GPU carry bundle not built (run tools/gpu_bundle/build_gpu_carry.sh)")

# what the FA3/FA2 batch-prefill + page JIT needs on the device, beyond the manifest's keep-list
NEEDED = [
    "site/flashinfer/__init__.py",
    "site/flashinfer/prefill.py",
    "site/flashinfer/jit/attention/modules.py",
    "site/flashinfer/data/csrc/batch_prefill_sm90.cu",
    "site/flashinfer/data/csrc/batch_prefill_sm90_jit_binding.cu",
    "site/flashinfer/data/csrc/batch_prefill_sm90_customize_config.jinja",
    "site/flashinfer/data/csrc/batch_prefill_ragged_sm90_kernel_inst.jinja",
    "site/flashinfer/data/csrc/batch_prefill_paged_sm90_kernel_inst.jinja",
    "site/flashinfer/data/csrc/batch_prefill.cu",
    "site/flashinfer/data/csrc/page.cu",
    "site/flashinfer/data/csrc/tvm_ffi_utils.h",
    "site/flashinfer/data/include/flashinfer/attention/hopper/prefill_sm90.cuh",
    "site/flashinfer/data/cutlass/include/cute/tensor.hpp",
    "site/tvm_ffi/__init__.py",
    "site/tvm_ffi/include/tvm/ffi/function.h",
    "cuda_extra/include/curand_kernel.h",
]


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _tree_bytes() -> int:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / os.fsdecode(n)).stat().st_size
               for n in out.split(b"\0") if n and (ROOT / os.fsdecode(n)).is_file())


@pytest.fixture(scope="module")
def members():
    with tarfile.open(TAR) as t:
        return {m.name for m in t.getmembers() if m.isfile()}


@pytest.fixture(scope="module")
def manifest():
    return json.loads((OUT / "manifest.json").read_text())


def test_bundle_fits_budget():
    size = _dir_bytes(OUT)
    try:
        tree = _tree_bytes()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout to measure the working tree")
    budget = CARRY_LIMIT - tree - MARGIN
    assert size <= budget, f"bundle {size / 2**20:.2f} MiB > budget {budget / 2**20:.2f} MiB"


def test_stamp_matches_archive():
    digest = hashlib.sha256(TAR.read_bytes()).hexdigest()
    assert (OUT / "site.tar.xz.sha256").read_text().strip() == digest


def test_archive_has_package_and_kernel_sources(members, manifest):
    missing = [n for n in NEEDED if n not in members]
    assert not missing, missing
    keep = [f"site/{k}" for k in manifest["keep"]]
    assert len(keep) > 100
    missing = [k for k in keep if k not in members]
    assert not missing, f"{len(missing)} closure files not in the archive, e.g. {missing[:5]}"
    # the cp312 binaries the GPU machine's Python 3.12 loads
    assert any(n.startswith("site/tvm_ffi/core.cpython-312-x86_64") for n in members)
    assert any(n.startswith("site/tvm_ffi/lib/libtvm_ffi") for n in members)
    # trimmed: none of the other kernels' sources (e.g. fused MoE, comm, gemm)
    assert not any(n.startswith("site/flashinfer/data/csrc/fused_moe/") for n in members)
    assert not any(n.endswith(".cu") and "/data/" not in n for n in members)


def test_aot_modules_in_archive(members):
    aot = OUT / "aot.json"
    if not aot.is_file():
        pytest.skip("bundle built without --aot (kernels JIT-compile on the device)")
    files = json.loads(aot.read_text())["files"]
    assert files and all(f in members for f in files), files


def test_manifest_closure_is_complete(manifest):
    labels = {s["label"]: s for s in manifest["specs"]}
    for required in ("fa3", "fa2", "page"):
        assert required in labels and "skipped" not in labels[required], required
    assert labels["fa3"]["name"].endswith("_sm90")
    assert manifest["arch"] == "9.0a"
    assert manifest["computed_includes_unhandled"] == []
    # every include of the package's own libraries resolved inside the kept tree; what is left
    # is the CUDA toolkit's and the C/C++ library's headers
    own = ("flashinfer/", "cute/", "cutlass/", "tvm/ffi/", "spdlog/")
    assert not [n for n in manifest["unresolved_includes"] if n.startswith(own)]


def test_env_sh():
    env = (OUT / "env.sh").read_text()
    for needle in ("PYTHONPATH", "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST=",
                   "TORCH_CUDA_ARCH_LIST=", "TVM_FFI_CACHE_DIR", "9.0a", "return 1"):
        assert needle in env, needle
    # sourced: must never exit the caller's shell
    assert not re.search(r"^\s*exit\b|[;&|{]\s*exit\b", env, re.M)
    subprocess.run(["bash", "-n", str(OUT / "env.sh")], check=True)


@pytest.mark.skipif(not (WORK / "stage" / "site" / "flashinfer" / "__init__.py").is_file()
                    or not (WORK / "tools" / "tvm").is_dir(), reason="no staged site / local tools")
def test_trimmed_site_imports():
    """import flashinfer from the trimmed site (tvm_ffi for this interpreter shadows the cp312 one)."""
    pp = os.pathsep.join(str(p) for p in (WORK / "tools" / "tvm", WORK / "stage" / "site",
                                          WORK / "tools" / "py"))
    env = dict(os.environ, PYTHONPATH=pp, TVM_FFI_DISABLE_TORCH_C_DLPACK="1",
               FLASHINFER_WORKSPACE_BASE=str(WORK / "ws_test"))
    r = subprocess.run([sys.executable, "-c", "import flashinfer; print(flashinfer.__file__); "
                        "flashinfer.BatchPrefillWithRaggedKVCacheWrapper"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(WORK / "stage" / "site") in r.stdout
