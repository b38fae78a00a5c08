#!/usr/bin/env bash
# Step time and bytes per step at ZeRO stages 0-3 on 2 and 4 local CPU ranks,
# against stage 0, a plain single-process LibTorch loop measured in the same
# run (as many threads as each rank gets: cores / ranks) and the theory.
# Usage: bench/run_step_time.sh [build dir] [bench_step_time options...]
#   e.g. bench/run_step_time.sh build --depth 4 --width 512 --steps 6
# Environment: RANKS (default "2 4"), RESULTS (default bench/results).
# Writes $RESULTS/step_time.jsonl, prints one table per world size and keeps
# the tables in $RESULTS/step_time.md.
# Always exits 0 when the runs complete: the targets are information.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
lines="$results/step_time.jsonl"
rm -f "$lines"
cores=$(nproc)
bin="$build/bench/bench_step_time"
declare -A measured=()
for n in ${RANKS:-2 4}; do
  threads=$(( cores / n )); [ "$threads" -ge 1 ] || threads=1
  if [ -z "${measured[$threads]:-}" ]; then
    "$bin" --mode plain --threads "$threads" --out "$lines" "$@"
    measured[$threads]=1
  fi
  for stage in 0 1 2 3; do
    "$build/tools/launcher/zero-run" --nproc "$n" "$bin" --mode engine --stage "$stage" --threads "$threads" \
      --out "$lines" "$@"
  done
done
for n in ${RANKS:-2 4}; do
  threads=$(( cores / n )); [ "$threads" -ge 1 ] || threads=1
  "$bin" --mode report --in "$lines" --world "$n" --threads "$threads" "$@"
done | tee "$results/step_time.md"
