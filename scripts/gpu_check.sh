#!/usr/bin/env bash
# The one prepared GPU check of the Triton kernels (issue 5), under 8 minutes on an H200:
#   1. the Triton and custom-op tests on the GPU (tests/test_triton_ops.py,
#      tests/test_custom_ops.py: the device fixture picks CUDA), ~3 min at most;
#   2. `cofr bench ops` at the issue's sizes (continued_fraction (2^20, d), ladders
#      (8192, 2304), the elementwise Cffn ensemble (8192, 768) L=3 d=5; literal,
#      continuant, compiled, triton; fwd and fwd+bwd) with the GPU targets, ~3 min;
#   3. larger sizes for bandwidth and whole Cffn layers (p = 768), with what time is left.
#
# Run from anywhere: bash scripts/gpu_check.sh
# Results: docs/benchmarks/ops-<gpu>-<date>.{md,json} (step 2), ...-extra.{md,json}
# (step 3) and gpu-tests-<gpu>-<date>.log; also copied to $OUT when it is set (the
# device tool brings back what is there).
#
# Python: a .venv whose torch sees the GPU (`make install` on a machine with a package
# index), else the machine's python3 if its torch sees the GPU (the workplace's H200 image
# has CUDA torch, triton, pytest, pytest-xdist and rich, and reaches no package index),
# else `make install`. The project runs from src/ (PYTHONPATH): nothing else is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DATE=$(date -u +%F)
RESULTS=docs/benchmarks
mkdir -p "$RESULTS"

elapsed() { echo $(($(date +%s) - START)); }
sees_gpu() {
  "$1" -c 'import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1
}

if [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then
  PY=.venv/bin/python
elif command -v python3 >/dev/null && sees_gpu python3; then
  PY=python3
else
  echo "no Python whose torch sees a GPU: trying make install (needs a package index)"
  make install || exit 1
  PY=.venv/bin/python
  sees_gpu "$PY" || { echo "torch sees no GPU after make install"; exit 1; }
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels, not the interpreter

GPU=$("$PY" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-"))')
TEST_LOG="$RESULTS/gpu-tests-$GPU-$DATE.log"
{
  echo "# gpu_check $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi -L 2>/dev/null || true
  "$PY" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "| triton", triton.__version__, "|", torch.cuda.get_device_name())'
} | tee "$TEST_LOG"

# 1. Tests on the GPU: every kernel compiled for real (the CPU suite runs Triton's
#    interpreter). pytest-xdist spreads the Triton compiles over the cores.
XDIST=()
if "$PY" -c 'import xdist' >/dev/null 2>&1; then XDIST=(-n 8); fi
echo "== tests (t=$(elapsed)s)" | tee -a "$TEST_LOG"
timeout 200 "$PY" -m pytest -q -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} \
  tests/test_triton_ops.py tests/test_custom_ops.py 2>&1 | tee -a "$TEST_LOG"
TESTS_RC=${PIPESTATUS[0]}
echo "== tests exit status $TESTS_RC (t=$(elapsed)s)" | tee -a "$TEST_LOG"

# 2. The benchmark at the issue's sizes, with the GPU targets.
BENCH=("$PY" -m cofrgenet.cli bench ops --device cuda --repeats 10 --warmup 3 --out "$RESULTS")
IMPLS=literal,continuant,compiled,triton
echo "== benchmark (t=$(elapsed)s)" | tee -a "$TEST_LOG"
timeout 220 "${BENCH[@]}" --impls "$IMPLS" --time-budget 150 \
  --sizes 2^20 --depths 3,5,8 --ladder-sizes 8192x2304 --ladder-depths 3,5,8 \
  --ensemble-sizes 8192x768 --ensemble-ladders 3 --ensemble-depths 5 --cffn-sizes '' 2>&1 | tail -n 60
BENCH_RC=${PIPESTATUS[0]}

# 3. Larger sizes (bandwidth) and whole Cffn layers, in the time left (8 min in all).
LEFT=$((450 - $(elapsed)))
if [ "$LEFT" -gt 40 ]; then
  echo "== extra benchmark, ${LEFT}s left (t=$(elapsed)s)" | tee -a "$TEST_LOG"
  timeout "$LEFT" "${BENCH[@]}" --impls "$IMPLS" --time-budget $((LEFT - 30)) --suffix=-extra \
    --sizes 2^24 --depths 5 --ladder-sizes 32768x4096 --ladder-depths 5 \
    --ensemble-sizes 65536x768 --ensemble-ladders 3 --ensemble-depths 5 \
    --cffn-sizes 8192x768 2>&1 | tail -n 40
fi

echo "== done: tests $TESTS_RC, benchmark $BENCH_RC (t=$(elapsed)s)" | tee -a "$TEST_LOG"
if [ -n "${OUT:-}" ]; then
  cp "$TEST_LOG" "$RESULTS"/ops-"$GPU"-"$DATE"*.md "$RESULTS"/ops-"$GPU"-"$DATE"*.json "$OUT"/ \
    2>/dev/null || true
  ls -l "$OUT"
fi
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
