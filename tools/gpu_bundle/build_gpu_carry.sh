#!/usr/bin/env bash
# Build the FlashInfer "carry bundle" for the GPU machine (one H200, sm_90, Python 3.12,
# torch 2.11+cu130, nvcc 13.0 and ninja installed, no package registry), on this CPU
# machine.  See tools/gpu_bundle/README.md, section "carry bundle".
#
#   tools/gpu_bundle/build_gpu_carry.sh [--force] [--no-nvcc] [--check] [--aot LABELS|none]
#
#   --force        rebuild even if the inputs are unchanged
#   --no-nvcc      skip the `nvcc -M` proof that the trimmed sources preprocess
#   --check        only re-measure the bundle against the budget (no download, no build)
#   --aot LABELS   compile these kernel modules here (nvcc 13.0 -> sm_90a; labels of
#                  tools/gpu_bundle/gpu_carry.py SPECS, comma-separated) and ship them in
#                  flashinfer/data/aot/, which flashinfer loads without building.  Default: fa2
#                  (the engine's kernel: 10 TUs, ~2 min CPU here, 2 MiB; cached in
#                  build/gpu_carry_work/aot_ws).  fa3 costs ~1 min CPU and 3.6 GB RAM per kernel
#                  TU (8 of them).  AOT_JOBS (default 1) parallel nvcc jobs.  --aot none: JIT all
#                  kernels on the device instead.
#
# Output (the only thing to carry, ≤ budget):  build/gpu_carry/
#   site.tar.xz          trimmed flashinfer + apache-tvm-ffi (cp312) + fallback curand headers
#   site.tar.xz.sha256   unpack stamp
#   env.sh               `source build/gpu_carry/env.sh` on the device: unpacks to /tmp, sets env
#   manifest.json        include-closure manifest (specs, kept data files)
#   aot.json             with --aot: the modules shipped prebuilt, build time here
#   SIZES.txt            per-part sizes, bundle size, budget
# Scratch (not carried): build/gpu_carry_work/  (wheels, full unpack, local tools, stage)
#
# Approach A (trimmed JIT package): keep all of flashinfer's Python (its __init__ imports
# most modules; 120 MiB raw, ~11 MiB in xz), and of flashinfer/data only the #include
# closure of the prefill/decode/page kernels' JIT sources (tools/gpu_bundle/gpu_carry.py closure), so
# the device's own nvcc 13.0 can JIT any of them (sm_90a).  Plus B for the engine's kernel:
# the fa2 batch-prefill module compiled here (--aot), loaded there without nvcc.
set -euo pipefail

FI_VER=${FI_VER:-0.7.4}                   # flashinfer-python (pure-Python wheel, JIT sources)
TVM_FFI_VER=${TVM_FFI_VER:-0.1.15.post2}  # apache-tvm-ffi: flashinfer needs >=0.1.11,<0.2; absent there
CURAND_VER=${CURAND_VER:-10.4.5.25}       # nvidia-curand (CUDA 13): headers only, fallback if the
                                          # device toolkit lacks curand_kernel.h (cutlass util includes it)
CARRY_LIMIT_MIB=64
MARGIN_MIB=${MARGIN_MIB:-8}               # room for the tree to grow + other carried paths

FORCE=0; NVCC_CHECK=1; CHECK_ONLY=0; AOT=fa2
while [ $# -gt 0 ]; do
  case $1 in
    --force) FORCE=1 ;; --no-nvcc) NVCC_CHECK=0 ;; --check) CHECK_ONLY=1 ;;
    --aot) AOT=${2:?--aot needs labels}; shift ;;
    -h|--help) sed -n 2,36p "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$AOT" = none ] && AOT=

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
OUT=build/gpu_carry
WORK=build/gpu_carry_work
PY=${PYTHON:-$ROOT/.venv/bin/python}
PIP=(pip_quiet)
pip_quiet() {  # pip, minus this machine's notes about absent local index folders
  "$PY" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2)
}
HELPER=tools/gpu_bundle/gpu_carry.py
mib() { awk -v b="$1" 'BEGIN{printf "%.2f", b/1048576}'; }
bytes_of() { if [ -e "$1" ]; then du -sb "$1" | cut -f1; else echo 0; fi; }

# ---- budget: 64 MiB minus what travels anyway (tracked + untracked-not-ignored, shared/) --
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -r stat -c %s 2>/dev/null || true; } | awk '{s+=$1} END{print s+0}')  # deleted files: skipped
if [ -d shared ] && git check-ignore -q shared; then
  tree_bytes=$((tree_bytes + $(bytes_of shared)))
fi
budget_bytes=$(( CARRY_LIMIT_MIB*1048576 - tree_bytes - MARGIN_MIB*1048576 ))
echo "budget: carry limit ${CARRY_LIMIT_MIB} MiB - working tree $(mib "$tree_bytes") MiB" \
     "- margin ${MARGIN_MIB} MiB = $(mib "$budget_bytes") MiB for $OUT"

report() {  # per-part sizes + bundle size vs budget; fails if over
  local stage=$WORK/stage s=$WORK/stage/site/flashinfer rep=$OUT/SIZES.txt tmp=$WORK/SIZES.txt.tmp
  {
    echo "flashinfer-python $FI_VER, apache-tvm-ffi $TVM_FFI_VER (cp312), nvidia-curand $CURAND_VER headers"
    if [ -d "$s" ]; then
      echo "raw (unpacked on the device):"
      printf '  %-34s %8s MiB\n' "flashinfer python (all but data/)" \
        "$(mib $(( $(bytes_of "$s") - $(bytes_of "$s/data") )))"
      for d in csrc include cutlass cccl spdlog; do
        printf '  %-34s %8s MiB\n' "flashinfer/data/$d (closure)" "$(mib "$(bytes_of "$s/data/$d")")"
      done
      printf '  %-34s %8s MiB\n' "tvm_ffi (cp312)" "$(mib "$(bytes_of "$stage/site/tvm_ffi")")"
      printf '  %-34s %8s MiB\n' "cuda_extra (curand headers)" "$(mib "$(bytes_of "$stage/cuda_extra")")"
      printf '  %-34s %8s MiB\n' "flashinfer/data/aot (--aot)" "$(mib "$(bytes_of "$s/data/aot")")"
      printf '  %-34s %8s MiB\n' "total raw" "$(mib "$(bytes_of "$stage")")"
    fi
    echo "carried ($OUT):"
    for f in "$OUT"/*; do printf '  %-34s %8s MiB\n' "$(basename "$f")" "$(mib "$(bytes_of "$f")")"; done
    printf '  %-34s %8s MiB\n' "BUNDLE" "$(mib "$(bytes_of "$OUT")")"
    printf '  %-34s %8s MiB\n' "budget" "$(mib "$budget_bytes")"
    printf '  %-34s %8s MiB\n' "working tree (travels anyway)" "$(mib "$tree_bytes")"
  } > "$tmp"
  mv "$tmp" "$rep"
  cat "$rep"
  local b; b=$(bytes_of "$OUT")
  if [ "$b" -gt "$budget_bytes" ]; then
    echo "FAIL: bundle $(mib "$b") MiB exceeds budget $(mib "$budget_bytes") MiB" >&2
    return 1
  fi
  echo "OK: bundle $(mib "$b") MiB <= budget $(mib "$budget_bytes") MiB"
}

if [ "$CHECK_ONLY" = 1 ]; then
  [ -f "$OUT/site.tar.xz" ] || { echo "no bundle at $OUT: run $0" >&2; exit 1; }
  report; exit $?
fi

key=$( { cat "$0" "$HELPER"; echo "$FI_VER $TVM_FFI_VER $CURAND_VER $NVCC_CHECK aot=$AOT"; } | sha256sum | cut -c1-16)
if [ "$FORCE" = 0 ] && [ -f "$OUT/site.tar.xz" ] && [ "$(cat "$WORK/.key" 2>/dev/null)" = "$key" ]; then
  echo "bundle up to date (key $key); --force to rebuild"
  report; exit $?
fi

# flashinfer guesses CUDA_HOME as `which nvcc`/../..: wrong where nvcc is a wrapper (here /usr/local/bin)
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  top=$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1 || true)
  if [ -n "$top" ] && [ -f "$top/include/cuda_runtime.h" ]; then export CUDA_HOME; CUDA_HOME=$(cd "$top" && pwd -P); fi
fi
echo "CUDA_HOME=${CUDA_HOME:-unset}"

mkdir -p "$WORK/wheels" "$WORK/tools" "$OUT"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)

# ---- 1. wheels for the device (pip skips files already in the folder) ----------------------
echo "== download"
"${PIP[@]}" download -q --no-deps "${PLAT[@]}" -d "$WORK/wheels" \
  "flashinfer-python==$FI_VER" "apache-tvm-ffi==$TVM_FFI_VER" "nvidia-curand==$CURAND_VER"
FI_WHL=$(ls "$WORK"/wheels/flashinfer_python-"$FI_VER"-*.whl)
TVM_WHL=$(ls "$WORK"/wheels/apache_tvm_ffi-"$TVM_FFI_VER"-cp312-*.whl)
CURAND_WHL=$(ls "$WORK"/wheels/nvidia_curand-"$CURAND_VER"-*.whl)
unzip -p "$FI_WHL" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
  | sed 's/^/  wheel needs: /'

# ---- 2. local tools to run flashinfer's Python here (not carried) -------------------------
# apache-tvm-ffi for *this* interpreter, and the import-time deps the GPU machine already has
# (requests, einops, tabulate, nvidia-ml-py, ...) but this repo's venv may not.
TOOLS=$WORK/tools
TOOLS_PKGS=(requests charset-normalizer idna urllib3 certifi einops tabulate nvidia-ml-py typing-extensions ninja)
tools_key="$TVM_FFI_VER ${TOOLS_PKGS[*]} $("$PY" -c 'import sys;print(sys.version_info[:2])')"
if [ "$(cat "$TOOLS/.key" 2>/dev/null)" != "$tools_key" ]; then
  echo "== local tools"
  rm -rf "$TOOLS"; mkdir -p "$TOOLS"
  "${PIP[@]}" install -q --no-deps --no-compile --target "$TOOLS/tvm" "apache-tvm-ffi==$TVM_FFI_VER"
  "${PIP[@]}" install -q --no-deps --no-compile --target "$TOOLS/py" "${TOOLS_PKGS[@]}"
  echo "$tools_key" > "$TOOLS/.key"
fi
LOCAL_PP="$TOOLS/tvm:$TOOLS/py"

# ---- 3. full unpack + include closure -----------------------------------------------------
FULL=$WORK/full
if [ "$(cat "$FULL/.wheel" 2>/dev/null)" != "$(basename "$FI_WHL")" ]; then
  echo "== unpack $(basename "$FI_WHL")"
  rm -rf "$FULL"; mkdir -p "$FULL"
  "$PY" -m zipfile -e "$FI_WHL" "$FULL"
  basename "$FI_WHL" > "$FULL/.wheel"
fi
echo "== include closure"
PYTHONPATH="$FULL:$LOCAL_PP" "$PY" "$HELPER" closure --site "$FULL" --out "$WORK/closure.json"

# ---- 4. assemble the trimmed site ---------------------------------------------------------
echo "== assemble"
STAGE=$WORK/stage
rm -rf "$STAGE"; mkdir -p "$STAGE/site" "$STAGE/cuda_extra/include"
( cd "$FULL"
  # flashinfer's Python and its data files (json, ...), without C/CUDA sources and docs
  # outside data/ (those belong to other kernels: cake_*/moe/gdn/... backends)
  find flashinfer -path flashinfer/data -prune -o -type f ! \( -name '*.cu' -o -name '*.cuh' \
    -o -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' -o -name '*.inl' \
    -o -name '*.ptx' -o -name '*.md' -o -name '*.rst' \) -print
  find b12x -type f 2>/dev/null || true
  find flashinfer_python-*.dist-info -type f ! -name RECORD
  # flashinfer/data: the include closure of the kept kernels only
  "$PY" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["keep"]))' \
    "$ROOT/$WORK/closure.json"
) > "$WORK/keep.txt"
tar -C "$FULL" -cf - -T "$WORK/keep.txt" | tar -C "$STAGE/site" -xf -
"$PY" -m zipfile -e "$TVM_WHL" "$STAGE/site"
rm -rf "$STAGE"/site/apache_tvm_ffi-*.dist-info/RECORD
"$PY" - "$CURAND_WHL" "$STAGE/cuda_extra/include" <<'EOF'
import sys, zipfile, pathlib
whl, dst = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if "/include/" in n and not n.endswith("/"):
            (dst / pathlib.Path(n).name).write_bytes(z.read(n))
EOF
echo "  kept $(wc -l < "$WORK/keep.txt") flashinfer files; stage $(mib "$(bytes_of "$STAGE")") MiB raw"

# ---- 5. verify the trimmed site here ------------------------------------------------------
echo "== verify"
# import: flashinfer from the trimmed site; tvm_ffi for this interpreter shadows the cp312 copy
PYTHONPATH="$TOOLS/tvm:$STAGE/site:$TOOLS/py" "$PY" -c 'import flashinfer, tvm_ffi
print("  import flashinfer", flashinfer.__version__, "from", flashinfer.__file__, "| tvm_ffi", tvm_ffi.__version__)'
# the carried cp312 tvm_ffi binary loads under a Python 3.12, if one is here
PY312=
for p in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
  if [ -x "$p" ] && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    PY312=$p; break
  fi
done
if [ -n "$PY312" ]; then
  PYTHONPATH="$STAGE/site:$TOOLS/py" "$PY312" -s -c 'import tvm_ffi, sys
print("  python", sys.version.split()[0], "imports carried tvm_ffi", tvm_ffi.__version__, "from", tvm_ffi.__file__)'
else
  echo "  (no python3.12 here: carried cp312 tvm_ffi not import-tested)"
fi
VERIFY=(verify --site "$STAGE/site" --manifest "$WORK/closure.json")
if [ "$NVCC_CHECK" = 1 ] && command -v nvcc >/dev/null; then
  nvcc --version | tail -1 | sed 's/^/  local /'
  VERIFY+=(--nvcc --cpath "$STAGE/cuda_extra/include")
elif [ "$NVCC_CHECK" = 1 ]; then
  echo "  (no nvcc here: nvcc -M check skipped)"
fi
PYTHONPATH="$TOOLS/tvm:$STAGE/site:$TOOLS/py" nice -n 5 "$PY" "$HELPER" "${VERIFY[@]}"

# ---- 5b. optional: compile kernel modules ahead here (Option B) ----------------------------
# flashinfer 0.7 builds its modules against TVM-FFI's C ABI, not torch's: a module built here
# needs only libcudart.so.13 (+ libstdc++), so torch 2.13-CPU here vs 2.11+cu130 there does not
# matter.  flashinfer loads flashinfer/data/aot/<name>/<name>.so before trying to JIT.
if [ -n "$AOT" ]; then
  echo "== aot: $AOT"
  command -v nvcc >/dev/null || { echo "--aot needs nvcc here" >&2; exit 1; }
  mkdir -p "$WORK/libstub"   # the JIT links with -lcuda; its modules use no libcuda symbol
  [ -e "$WORK/libstub/libcuda.so" ] || echo 'void wamdiff_libcuda_stub(void){}' \
    | gcc -x c -shared -fPIC -o "$WORK/libstub/libcuda.so" -
  aot_json=$(PATH="$ROOT/$TOOLS/py/bin:$PATH" LIBRARY_PATH="$ROOT/$WORK/libstub${LIBRARY_PATH:+:$LIBRARY_PATH}" \
    FLASHINFER_WORKSPACE_BASE="$ROOT/$WORK/aot_ws" FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS="${AOT_JOBS:-1}" \
    PYTHONPATH="$TOOLS/tvm:$STAGE/site:$TOOLS/py" nice -n 10 "$PY" "$HELPER" prebuild --specs "$AOT" --no-load \
    | tail -1)
  echo "  $aot_json"
  "$PY" - "$aot_json" "$STAGE/site/flashinfer/data/aot" "$WORK/aot.json" <<'EOF'
import json, shutil, sys, pathlib
r, dst = json.loads(sys.argv[1]), pathlib.Path(sys.argv[2])
for name in r["modules"]:
    so = pathlib.Path(r["jit_dir"]) / name / f"{name}.so"
    (dst / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(so, dst / name / f"{name}.so")
    print(f"  aot {name}.so {so.stat().st_size / 2**20:.2f} MiB")
r["files"] = [f"site/flashinfer/data/aot/{n}/{n}.so" for n in r["modules"]]
pathlib.Path(sys.argv[3]).write_text(json.dumps(r, indent=1) + "\n")
EOF
else
  rm -f "$WORK/aot.json"
fi

# ---- 6. pack + env.sh ---------------------------------------------------------------------
echo "== pack"
rm -f "$OUT"/*
tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - site cuda_extra \
  | xz -T2 -6 > "$OUT/site.tar.xz"
sha256sum "$OUT/site.tar.xz" | cut -c1-64 > "$OUT/site.tar.xz.sha256"
cp "$WORK/closure.json" "$OUT/manifest.json"; : > "$OUT/SIZES.txt"
if [ -f "$WORK/aot.json" ]; then cp "$WORK/aot.json" "$OUT/aot.json"; fi   # modules shipped prebuilt
cat > "$OUT/env.sh" <<EOF
# source build/gpu_carry/env.sh  -- on the GPU machine (bash).  Made by tools/gpu_bundle/build_gpu_carry.sh:
# flashinfer-python $FI_VER (trimmed JIT sources), apache-tvm-ffi $TVM_FFI_VER cp312.
# Unpacks site.tar.xz once per content into \$WAMDIFF_CARRY_ROOT (default /tmp/wamdiff_gpu_carry),
# puts it on PYTHONPATH and points flashinfer's JIT cache, tvm-ffi's cache and the arch list at
# sm_90a.  Returns non-zero (never exits the shell) if anything is missing: fall back to SDPA.
_wgc_src=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export WAMDIFF_CARRY_ROOT=\${WAMDIFF_CARRY_ROOT:-/tmp/wamdiff_gpu_carry}
_wgc_want=\$(cat "\$_wgc_src/site.tar.xz.sha256" 2>/dev/null || true)   # safe under set -eu
if [ "\$(cat "\$WAMDIFF_CARRY_ROOT/.stamp" 2>/dev/null)" != "\$_wgc_want" ]; then
  # new content: drop the old site and our default JIT cache (sources unpack with mtime 0, so
  # ninja would not notice changed headers)
  rm -rf "\$WAMDIFF_CARRY_ROOT/site" "\$WAMDIFF_CARRY_ROOT/cuda_extra" "\$WAMDIFF_CARRY_ROOT/ws"
  mkdir -p "\$WAMDIFF_CARRY_ROOT"
  if command -v xz >/dev/null 2>&1; then
    tar -C "\$WAMDIFF_CARRY_ROOT" -xJf "\$_wgc_src/site.tar.xz"
  else
    python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \\
      "\$_wgc_src/site.tar.xz" "\$WAMDIFF_CARRY_ROOT"
  fi && echo "\$_wgc_want" > "\$WAMDIFF_CARRY_ROOT/.stamp" \\
    || { echo "gpu_carry: unpack failed" >&2; return 1; }
fi
export WAMDIFF_FLASHINFER_SITE=\$WAMDIFF_CARRY_ROOT/site
case ":\${PYTHONPATH:-}:" in *":\$WAMDIFF_FLASHINFER_SITE:"*) ;;
  *) export PYTHONPATH=\$WAMDIFF_FLASHINFER_SITE\${PYTHONPATH:+:\$PYTHONPATH} ;; esac
export FLASHINFER_WORKSPACE_BASE=\${FLASHINFER_WORKSPACE_BASE:-\$WAMDIFF_CARRY_ROOT/ws}  # JIT cache: ws/.cache/flashinfer
export FLASHINFER_CUDA_ARCH_LIST=\${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export TORCH_CUDA_ARCH_LIST=\${TORCH_CUDA_ARCH_LIST:-9.0a}
export TVM_FFI_CACHE_DIR=\${TVM_FFI_CACHE_DIR:-\$WAMDIFF_CARRY_ROOT/tvm_ffi_cache}
export FLASHINFER_NO_DOWNLOAD=1                                  # no registry/CDN there: fail fast
# CUDA_HOME: flashinfer's own guess (dirname of \`which nvcc\`/..) is wrong when nvcc is a wrapper
_wgc_nvcc=\$(command -v nvcc 2>/dev/null || true)
_wgc_top=\$( { [ -n "\$_wgc_nvcc" ] && "\$_wgc_nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1; } \\
  | sed -n 's/^#\\\$ TOP=//p' | head -1 || true)
for _wgc_d in "\${CUDA_HOME:-}" "\${CUDA_PATH:-}" "\$_wgc_top" /usr/local/cuda \\
    "\$( [ -n "\$_wgc_nvcc" ] && dirname "\$(dirname "\$(readlink -f "\$_wgc_nvcc")")" || true)"; do
  if [ -n "\$_wgc_d" ] && [ -x "\$_wgc_d/bin/nvcc" ] && [ -f "\$_wgc_d/include/cuda_runtime.h" ]; then
    export CUDA_HOME=\$(cd "\$_wgc_d" && pwd -P); break
  fi
done
if [ ! -x "\${CUDA_HOME:-/nonexistent}/bin/nvcc" ]; then
  # the modules in aot.json still load; any other kernel would fail to build
  echo "gpu_carry: no CUDA toolkit (nvcc + headers) found: only the prebuilt modules (aot.json) load" >&2
  [ -f "\$_wgc_src/aot.json" ] || return 1
else
# the JIT links with -L\$CUDA_HOME/lib64/stubs -lcuda: if the toolkit has no libcuda.so stub, link
# against the driver's libcuda.so.1 instead (LIBRARY_PATH is read by the host linker)
if [ ! -e "\$CUDA_HOME/lib64/stubs/libcuda.so" ] && [ ! -e "\$CUDA_HOME/lib64/libcuda.so" ]; then
  for _wgc_l in \${WAMDIFF_LIBCUDA:-} \$(ldconfig -p 2>/dev/null | awk '/libcuda\\.so/{print \$NF}' || true) \\
      /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1; do
    if [ -e "\$_wgc_l" ]; then
      mkdir -p "\$WAMDIFF_CARRY_ROOT/libstub" && ln -sf "\$_wgc_l" "\$WAMDIFF_CARRY_ROOT/libstub/libcuda.so"
      export LIBRARY_PATH=\$WAMDIFF_CARRY_ROOT/libstub\${LIBRARY_PATH:+:\$LIBRARY_PATH}; break
    fi
  done
fi
if [ ! -f "\$CUDA_HOME/include/curand_kernel.h" ]; then
  export CPATH=\$WAMDIFF_CARRY_ROOT/cuda_extra/include\${CPATH:+:\$CPATH}   # cutlass util includes it
fi
fi
echo "gpu_carry: flashinfer $FI_VER site \$WAMDIFF_FLASHINFER_SITE, JIT cache \$FLASHINFER_WORKSPACE_BASE, CUDA_HOME=\${CUDA_HOME:-?}" >&2
EOF
echo "$key" > "$WORK/.key"

report
