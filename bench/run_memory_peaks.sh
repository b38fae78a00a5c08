#!/usr/bin/env bash
# Memory per rank at ZeRO stages 0-3, fp32 and bf16, each stage in processes
# of its own (peak RSS is per process), then a markdown table and an SVG chart.
# Usage: bench/run_memory_peaks.sh [build dir] [bench_memory_peaks options...]
#   e.g. bench/run_memory_peaks.sh build --depth 12 --width 384
# Environment: RANKS (default 2), RESULTS (default bench/results).
# Writes $RESULTS/memory_peaks.{jsonl,md,svg} and prints the table.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
ranks="${RANKS:-2}"
mkdir -p "$results"
lines="$results/memory_peaks.jsonl"
rm -f "$lines"
for dtype in fp32 bf16; do
  for stage in 0 1 2 3; do
    "$build/tools/launcher/zero-run" --nproc "$ranks" "$build/bench/bench_memory_peaks" \
      --stage "$stage" --dtype "$dtype" --out "$lines" "$@"
  done
done
echo
"$build/bench/bench_memory_report" --in "$lines" --md "$results/memory_peaks.md" --svg "$results/memory_peaks.svg"
echo
echo "wrote $results/memory_peaks.md and $results/memory_peaks.svg"
