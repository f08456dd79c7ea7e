#!/usr/bin/env bash
# Start-up times of `cofr` commands: the first call (cold: caches of this shell's first
# run) and the median of 3 more (warm), wall seconds. Usage, from the repository root
# after `make install` and `cofr data prepare` (the demo data):
#   bash scripts/startup_times.sh [OUT.md]
# "first step" is a whole `cofr fit` of the demo config stopped after one step, without
# validation or checkpoint: start-up, the first optimizer step, and the exit.
set -euo pipefail
cd "$(dirname "$0")/.."
COFR=.venv/bin/cofr
OUT=${1:-/dev/stdout}
bad=$(mktemp --suffix=.yaml)
printf 'trainer:\n  max_stepz: 3\n' > "$bad"
runs=$(mktemp -d)
# An empty CLI cache (cofrgenet/cli_cache.py): "first" is a cold call, as after a pip
# upgrade (`make install` itself warms the cache); the warm calls answer --help and key
# typos from the cache.
COFR_CACHE_DIR=$(mktemp -d)
export COFR_CACHE_DIR
trap 'rm -rf "$bad" "$runs" "$COFR_CACHE_DIR"' EXIT

measure() {  # name, then the command; prints "| name | first | warm median |"
  local name=$1; shift
  local times=()
  for _ in 1 2 3 4; do
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
  done
  local warm
  warm=$(printf '%s\n' "${times[@]:1}" | sort -n | sed -n 2p)
  printf '| %s | %.2f | %.2f |\n' "$name" "${times[0]}" "$warm"
}

{
  echo "| command | first (s) | warm median of 3 (s) |"
  echo "|---|---:|---:|"
  measure "cofr --help" $COFR --help
  measure "cofr fit --help" $COFR fit --help
  measure "cofr validate --help" $COFR validate --help
  measure "cofr data prepare --help" $COFR data prepare --help
  measure "cofr sweep run --help" $COFR sweep run --help
  measure "cofr eval --help" $COFR eval --help
  measure "cofr compare --help" $COFR compare --help
  measure "cofr models list" $COFR models list
  measure "config error (typo in a YAML key)" $COFR fit --config conf/experiment/demo-gpt2.yaml --config "$bad"
  measure "sweep file error (no such file)" $COFR sweep run /nonexistent.yaml
  measure "demo fit, first step" $COFR fit --config conf/experiment/demo-gpt2.yaml \
    --trainer.max_steps 1 --trainer.limit_val_batches 0 --run.runs_dir "$runs" \
    --run.mlflow false --trainer.enable_progress_bar false
} > "$OUT"
