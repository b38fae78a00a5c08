#!/usr/bin/env bash
# The fused CPU Adam against torch::optim::AdamW and the STREAM-triad bound,
# REPEAT times (default 3; the figures move with whatever else the machine
# runs), into one markdown file.
# Usage: bench/run_cpu_adam.sh [build dir] [bench_cpu_adam options...]
#   e.g. bench/run_cpu_adam.sh build --params 16777216 --threads 1
# Environment: REPEAT (default 3), RESULTS (default bench/results).
# Writes $RESULTS/cpu_adam.md and prints it. Exits 0 when the runs complete.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
out="$results/cpu_adam.md"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# bench_cpu_adam"
  echo
  echo "$(date -u +%Y-%m-%d), ${cpu}, $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "Command: \`REPEAT=${REPEAT:-3} bash bench/run_cpu_adam.sh $build${*:+ $*}\`"
  for i in $(seq 1 "${REPEAT:-3}"); do
    echo
    echo "## run $i"
    echo
    "$build/bench/bench_cpu_adam" "$@"
  done
} > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
