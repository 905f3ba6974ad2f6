#!/usr/bin/env bash
# The GPU check: everything a lent GPU machine should confirm, in one script (under 6 minutes on one
# H200 with only the project and its wheels installed; see /work/shared/tools/offline_wheels.sh).
#
#   usage: benchmarks/gpu_check.sh [--cpu] [OUTDIR]
#
# Steps, each under its own time limit, each reported as "[gpu_check] NAME: ok|FAILED (rc) in S s":
#   1. perfscope doctor
#   2. perfscope devices --device cuda --refresh              (measured roofs)
#   3. perfscope profile of the engine: llama-3.2-1b, bf16, prompt 2048, 64 tokens; its summary
#      prints the warm unprofiled (headline) and the profiled phase metrics side by side
#   4. benchmarks/engine_gpu.py: tokens/s and decode MBU of llama-3.2-1b and llama-3-8b, batch sweep
#   5. benchmarks/ncu_topn_workload.py, when that file exists (the ncu top-N check)
#   6. pytest tests/gpu                                         (when pytest is installed)
# Without a CUDA GPU it stops at once with a message and exit code 2. --cpu is the dry run: the same
# commands with --device cpu, the tiny model and short lengths (checks the script, not the GPU).
# perfscope is imported from the installed package: the script runs from a scratch folder, never
# from the source tree. PYTHON selects the interpreter (default python3). Exit code: failed steps.
set -uo pipefail

MODE=gpu
if [ "${1:-}" = "--cpu" ]; then MODE=cpu; shift; fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${1:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$OUT" || exit 1
export PERFSCOPE_CACHE_DIR=${PERFSCOPE_CACHE_DIR:-$OUT/cache}

if [ "$MODE" = gpu ]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA GPU is visible to torch on this machine (or torch is missing): nothing to check." >&2
    echo "gpu_check: run it on a GPU machine, or 'benchmarks/gpu_check.sh --cpu' for a dry run of the same commands." >&2
    exit 2
  fi
  DEV=cuda; MODEL=llama-3.2-1b; DTYPE=bfloat16; PROMPT=2048; GEN=64
  BENCH=(--device cuda --cached-roofs --budget-s 100)
  LIMITS=(30 60 120 170 60 120)
else
  DEV=cpu; MODEL=tiny; DTYPE=float32; PROMPT=64; GEN=8
  BENCH=(--device cpu --dtype float32 --models tiny --batches 1,2 --prompt-len 32 --gen-len 16 --cached-roofs)
  LIMITS=(60 300 300 300 120 600); TOTAL_S=${GPU_CHECK_TOTAL_S:-3000}
fi

FAILED=0
START=$(date +%s)
TOTAL_S=${TOTAL_S:-${GPU_CHECK_TOTAL_S:-350}}  # the whole check stays under 6 minutes: a step gets what is left
step() {  # step NAME LIMIT_S CMD...
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$(( TOTAL_S - ($(date +%s) - START) ))
  if [ "$left" -lt 15 ]; then
    echo; echo "[gpu_check] $name: SKIPPED (the ${TOTAL_S} s total is spent)"; FAILED=$((FAILED + 1)); return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo; echo "[gpu_check] ---- $name (limit ${limit} s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "[gpu_check] $name: ok in $(( $(date +%s) - t0 )) s"
  else
    FAILED=$((FAILED + 1))
    [ $rc -eq 124 ] && echo "[gpu_check] $name: FAILED (timed out after ${limit} s)" \
      || echo "[gpu_check] $name: FAILED (exit $rc) in $(( $(date +%s) - t0 )) s"
  fi
}

echo "[gpu_check] mode $MODE, output in $OUT, $("$PY" -c 'import perfscope, torch; print("perfscope", perfscope.__version__, "from", perfscope.__file__, "| torch", torch.__version__)' 2>&1)"
step doctor "${LIMITS[0]}" "$PY" -m perfscope doctor
step devices "${LIMITS[1]}" "$PY" -m perfscope devices --device "$DEV" --refresh
step profile "${LIMITS[2]}" "$PY" -m perfscope profile --device "$DEV" --model "$MODEL" --dtype "$DTYPE" \
  --prompt-len "$PROMPT" --gen-len "$GEN" --out "$OUT/engine.perfscope" --force --no-html
step engine_gpu "${LIMITS[3]}" "$PY" "$REPO/benchmarks/engine_gpu.py" "${BENCH[@]}"
if [ -f "$REPO/benchmarks/ncu_topn_workload.py" ]; then
  if [ "$MODE" = gpu ]; then
    step ncu_topn "${LIMITS[4]}" "$PY" "$REPO/benchmarks/ncu_topn_workload.py"
  else
    echo; echo "[gpu_check] ncu_topn: skipped (needs a GPU and ncu)"
  fi
else
  echo; echo "[gpu_check] ncu_topn: skipped (benchmarks/ncu_topn_workload.py is not in this checkout)"
fi
if "$PY" -c 'import pytest' 2>/dev/null; then
  if [ "$MODE" = gpu ]; then
    step pytest_gpu "${LIMITS[5]}" "$PY" -m pytest -q -p no:cacheprovider -m gpu "$REPO/tests/gpu"
  else  # no GPU: the GPU tests skip themselves; this checks that they collect and skip cleanly
    step pytest_gpu "${LIMITS[5]}" "$PY" -m pytest -q -p no:cacheprovider "$REPO/tests/gpu"
  fi
else
  echo; echo "[gpu_check] pytest_gpu: skipped (pytest is not installed: $PY -m pip install pytest)"
  FAILED=$((FAILED + 1))
fi
echo
echo "[gpu_check] done in $(( $(date +%s) - START )) s, $FAILED step(s) failed; reports in $OUT"
exit "$FAILED"
