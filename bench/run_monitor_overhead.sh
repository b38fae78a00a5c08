#!/usr/bin/env bash
# What the monitors cost (bench/monitor_overhead.cpp): one GPT trained on 2
# local CPU ranks with everything off and with csv_monitor, tensorboard,
# comms_logger and flops_profiler on, in alternating blocks; the ratio of
# the median step times (goal: at most 1.01).
# Usage: bench/run_monitor_overhead.sh [build dir] [bench_monitor_overhead options...]
# Environment: RANKS (default 2), RESULTS (default bench/results).
# Writes $RESULTS/monitor_overhead.md.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
"$build/tools/launcher/zero-run" --nproc "${RANKS:-2}" "$build/bench/bench_monitor_overhead" "$@" 2>/dev/null |
  sed -n 's/^\[rank 0\] \(|.*\)/\1/p' | tee "$results/monitor_overhead.md"
