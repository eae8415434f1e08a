#!/usr/bin/env bash
# The one prepared device check of the GPU fast path, run from the repository root on a lent GPU machine:
#
#   bash tools/gpu_bundle/device_check.sh          # results in $OUT (the device tool's folder), else out/device_check
#
# with `carry: ["build/gpu_carry"]` (FlashInfer, made on the CPU machine by tools/gpu_bundle/build_gpu_carry.sh).
#
# The machine has python3 3.12 with torch 2.11 (CUDA 13), transformers 5.17, tokenizers, numpy, safetensors and
# pillow preinstalled and reaches no registry: nothing is pip-installed, the repository goes on PYTHONPATH.
# Imported there: torch, transformers (Qwen3-VL classes, DynamicCache), tokenizers, numpy, safetensors, PIL
# (wamdiff_ros/__init__.py imports nothing else; no ROS, no highway-env, no tqdm on this path).
#
# Steps, each under `timeout`, all inside BUDGET_S (default 235 s):
#   1. machine and versions; our imports must load, else stop (exit 2)
#   2. FlashInfer: `source build/gpu_carry/env.sh` (PYTHONPATH, JIT cache dir, arch list), then
#      `wamdiff-bench gpu --probe-flashinfer`: loads the fa2 batch-prefill module precompiled into the carry for
#      sm_90a (JIT-builds it with the machine's nvcc only if that fails; cached for step 3), checks it against SDPA
#   3. wamdiff-bench gpu (Qwen3-VL-2B dimensions, random bf16 weights): --attention flashinfer if step 2 passed,
#      else the fallback, --attention sdpa (SDPA + CUDA Graph), with the reason in the JSON (attention.note)
#   4. wamdiff-bench plan --model random-2b: Planner.plan end to end (AR and block, the plan grammar on), merged
#      into gpu_bench.json under "plan"
# Outputs in $OUT: gpu_bench.json (written as it goes; "complete": true at the end), gpu_bench.md,
# device_check.log, flashinfer_probe.json (when probed).
# Knobs (environment): BUDGET_S, BENCH_RESERVE_S (default 100: the probe gets the rest), RUNS (6), PY (python3),
# BENCH_ARGS (appended to the benchmark's options; `--tiny --device cpu` dry-runs the script on a CPU machine).
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/device_check}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-235}
BENCH_RESERVE_S=${BENCH_RESERVE_S:-100}
RUNS=${RUNS:-6}
BENCH_ARGS=${BENCH_ARGS:-}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

left() { echo $((BUDGET_S - SECONDS)); }

main() {
  echo "== 1. machine ($(date -u +%FT%TZ))"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
    || echo "nvidia-smi failed"
  timeout 60 "$PY" - <<'EOF' || { echo "our imports do not load here: stopping"; return 2; }
import platform, torch, transformers, tokenizers, numpy, safetensors, PIL
import wamdiff_ros.bench.gpu  # the whole benchmark path
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| tokenizers", tokenizers.__version__,
      "| numpy", numpy.__version__, "| safetensors", safetensors.__version__, "| pillow", PIL.__version__)
print("gpu:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CUDA unavailable)")
EOF

  echo "== 2. flashinfer ($(left) s left)"
  local attn=sdpa note
  if [ ! -f build/gpu_carry/env.sh ]; then
    note="fallback to SDPA + CUDA Graph: no FlashInfer carry (build/gpu_carry/env.sh missing)"
  elif ! source build/gpu_carry/env.sh; then
    note="fallback to SDPA + CUDA Graph: build/gpu_carry/env.sh failed"
  else
    local probe_s=$(($(left) - BENCH_RESERVE_S)) rc
    if [ "$probe_s" -lt 20 ]; then
      note="fallback to SDPA + CUDA Graph: no time left to build FlashInfer's kernel"
    else
      echo "probing FlashInfer (fa2 batch prefill: precompiled in the carry, else JIT-built; timeout ${probe_s} s)"
      timeout -k 5 "$probe_s" "$PY" -m wamdiff_ros.bench gpu --probe-flashinfer --json "$OUT/flashinfer_probe.json"
      rc=$?
      if [ "$rc" -eq 0 ]; then
        attn=flashinfer
        note="flashinfer probe passed"
      else
        note="fallback to SDPA + CUDA Graph: FlashInfer probe failed (rc $rc; 3 = not loadable or wrong results,"
        note="$note 124 = timed out after ${probe_s} s)"
      fi
    fi
  fi
  echo "attention: $attn ($note)"

  local bench_s=$(($(left) - 5))
  echo "== 3. benchmark, --attention $attn, $RUNS rounds (timeout ${bench_s} s)"
  timeout -k 5 "$bench_s" "$PY" -m wamdiff_ros.bench gpu --attention "$attn" --note "$note" --runs "$RUNS" \
    --json "$OUT/gpu_bench.json" --md "$OUT/gpu_bench.md" $BENCH_ARGS
  local rc=$?
  local plan_s=$(($(left) - 5)) plan_rc=124
  echo "== 4. Planner.plan end to end at 2B dimensions, bf16, AR vs block (timeout ${plan_s} s)"
  if [ "$plan_s" -ge 30 ]; then
    timeout -k 5 "$plan_s" "$PY" -m wamdiff_ros.bench plan --model random-2b --device cuda --dtype bfloat16 \
      --runs "$RUNS" --json "$OUT/plan_bench.json"
    plan_rc=$?
    # one JSON: the plan figures join the per-forward ones
    "$PY" - "$OUT/gpu_bench.json" "$OUT/plan_bench.json" <<'EOF' || true
import json, pathlib, sys
bench, plan = (pathlib.Path(p) for p in sys.argv[1:])
if bench.is_file() and plan.is_file():
    data = json.loads(bench.read_text())
    data["plan"] = json.loads(plan.read_text())
    bench.write_text(json.dumps(data, indent=1) + "\n")
EOF
  fi
  echo "== done: benchmark rc $rc, plan rc $plan_rc, ${SECONDS} s in all"
  return $rc
}

main 2>&1 | tee "$OUT/device_check.log"
