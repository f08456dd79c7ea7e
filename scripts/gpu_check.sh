#!/usr/bin/env bash
# The one prepared GPU check, under 9 minutes cold on one H200:
#   1. the Triton, custom-op, decoding and compile tests on the GPU (the device fixture
#      picks CUDA), at most 100 s;
#   2. `cofr bench train` at gpt2-small width (12 x 768, block 1024, batch 8) for gpt2,
#      cofrgenet-f, cofrgenet-a and cofrgenet, bf16 autocast, eager and whole-model
#      compiled (the Triton kernels inside the graph), in one run: tokens/s, compiled vs
#      eager, MFU, memory, at most 300 s;
#   3. `cofr bench ops` at the ops issue's sizes (continued_fraction (2^20, d), ladders
#      (8192, 2304), the elementwise Cffn ensemble (8192, 768) L=3 d=5; literal,
#      continuant, compiled, triton; fwd and fwd+bwd) with the GPU targets, at most 100 s;
#   4. larger op sizes (bandwidth) and whole Cffn layers, with what time is left.
#
# Run from anywhere: bash scripts/gpu_check.sh [--dry-run]
# Results under docs/benchmarks/: gpu-tests-<gpu>-<date>.log, train-<gpu>-<date>.{md,json},
# ops-<gpu>-<date>.{md,json}, ops-<gpu>-<date>-extra.{md,json}; also copied to $OUT when
# it is set (the device tool brings back what is there).
#
# --dry-run: every step on this machine's CPU at tiny sizes, results in a temporary folder
# (tests: collection only). CI runs it (tests/test_scripts.py) so the script cannot rot.
#
# Python: a .venv whose torch sees the GPU (`make install` on a machine with a package
# index), else the machine's python3 if its torch sees the GPU (the workplace's H200 image
# has CUDA torch, triton, pytest, pytest-xdist and rich, and reaches no package index),
# else `make install`. The project runs from src/ (PYTHONPATH): nothing else is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DATE=$(date -u +%F)
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1

elapsed() { echo $(($(date +%s) - START)); }
sees_gpu() {
  "$1" -c 'import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1
}

if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-.venv/bin/python}
  RESULTS=$(mktemp -d)
  DEVICE=cpu
elif [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then
  PY=.venv/bin/python
elif command -v python3 >/dev/null && sees_gpu python3; then
  PY=python3
else
  echo "no Python whose torch sees a GPU: trying make install (needs a package index)"
  make install || exit 1
  PY=.venv/bin/python
  sees_gpu "$PY" || { echo "torch sees no GPU after make install"; exit 1; }
fi
if [ "$DRY" = 0 ]; then
  RESULTS=docs/benchmarks
  DEVICE=cuda
  unset TRITON_INTERPRET  # compiled kernels, not the interpreter
fi
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [ "$DRY" = 1 ]; then
  GPU=cpu
else
  GPU=$("$PY" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-"))')
fi
TEST_LOG="$RESULTS/gpu-tests-$GPU-$DATE.log"
{
  echo "# gpu_check $(date -u +%FT%TZ) on $(hostname)$([ "$DRY" = 1 ] && echo ' (dry run)')"
  nvidia-smi -L 2>/dev/null || true
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")'
} | tee "$TEST_LOG"

# 1. Tests on the GPU: every kernel compiled for real (the CPU suite runs Triton's
#    interpreter). pytest-xdist spreads the Triton compiles over the cores.
TESTS=(tests/ops tests/test_decoding.py tests/test_bench_train.py)
XDIST=()
if [ "$DRY" = 0 ] && "$PY" -c 'import xdist' >/dev/null 2>&1; then XDIST=(-n 8); fi
COLLECT=()
[ "$DRY" = 1 ] && COLLECT=(--collect-only)
echo "== tests (t=$(elapsed)s)" | tee -a "$TEST_LOG"
timeout 100 "$PY" -m pytest -q -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} \
  ${COLLECT[@]+"${COLLECT[@]}"} "${TESTS[@]}" 2>&1 | tail -n 30 | tee -a "$TEST_LOG"
TESTS_RC=${PIPESTATUS[0]}
echo "== tests exit status $TESTS_RC (t=$(elapsed)s)" | tee -a "$TEST_LOG"

# 2. Training speed at gpt2-small width, compiled, bf16, Triton inside the graph.
echo "== train benchmark (t=$(elapsed)s)" | tee -a "$TEST_LOG"
if [ "$DRY" = 1 ]; then
  SHAPE=(--n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --batch-size 2 --steps 1
         --rounds 1 --warmup 1 --modes eager --dtype float32 --gen-tokens 2)
else
  SHAPE=(--n-layer 12 --n-embd 768 --n-head 12 --block-size 1024 --batch-size 8 --steps 5
         --rounds 2 --warmup 2 --modes eager,compiled --dtype bfloat16 --no-generation)
fi
timeout 300 "$PY" -m cofrgenet.cli bench train --device "$DEVICE" --out-dir "$RESULTS" \
  --variants gpt2,cofrgenet-f,cofrgenet-a,cofrgenet "${SHAPE[@]}" 2>&1 | tail -n 30
TRAIN_RC=${PIPESTATUS[0]}

# 3. The op benchmark at the issue's sizes, with the GPU targets.
BENCH=("$PY" -m cofrgenet.cli bench ops --device "$DEVICE" --out "$RESULTS")
echo "== ops benchmark (t=$(elapsed)s)" | tee -a "$TEST_LOG"
if [ "$DRY" = 1 ]; then
  timeout 100 "${BENCH[@]}" --quick --impls literal,continuant 2>&1 | tail -n 20
else
  timeout 100 "${BENCH[@]}" --impls literal,continuant,compiled,triton --repeats 10 --warmup 3 \
    --time-budget 70 --sizes 2^20 --depths 3,5,8 --ladder-sizes 8192x2304 \
    --ladder-depths 3,5,8 --ensemble-sizes 8192x768 --ensemble-ladders 3 \
    --ensemble-depths 5 --cffn-sizes '' 2>&1 | tail -n 60
fi
BENCH_RC=${PIPESTATUS[0]}

# 4. Larger sizes (bandwidth) and whole Cffn layers, in the time left (8.5 min in all).
LEFT=$((510 - $(elapsed)))
if [ "$DRY" = 0 ] && [ "$LEFT" -gt 40 ]; then
  echo "== extra benchmark, ${LEFT}s left (t=$(elapsed)s)" | tee -a "$TEST_LOG"
  timeout "$LEFT" "${BENCH[@]}" --impls literal,continuant,compiled,triton --repeats 10 \
    --warmup 3 --time-budget $((LEFT - 30)) --suffix=-extra \
    --sizes 2^24 --depths 5 --ladder-sizes 32768x4096 --ladder-depths 5 \
    --ensemble-sizes 65536x768 --ensemble-ladders 3 --ensemble-depths 5 \
    --cffn-sizes 8192x768 2>&1 | tail -n 40
fi

echo "== done: tests $TESTS_RC, train $TRAIN_RC, ops $BENCH_RC (t=$(elapsed)s)" | tee -a "$TEST_LOG"
if [ -n "${OUT:-}" ]; then
  cp "$TEST_LOG" "$RESULTS"/*-"$GPU"-"$DATE"*.md "$RESULTS"/*-"$GPU"-"$DATE"*.json "$OUT"/ \
    2>/dev/null || true
  ls -l "$OUT"
fi
if [ "$DRY" = 1 ]; then
  ls "$RESULTS"
  rm -rf "$RESULTS"
fi
[ "$TESTS_RC" -eq 0 ] && [ "$TRAIN_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
