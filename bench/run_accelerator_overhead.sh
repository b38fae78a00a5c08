#!/usr/bin/env bash
# What the Accelerator costs (bench/accelerator_overhead.cpp): one GPT trained on 2
# local CPU ranks through zero::Accelerator and through the engine called
# directly, in alternating blocks; the ratio of the median step times (goal:
# at most 1.02), and the loader's batches per second against the step rate.
# Usage: bench/run_accelerator_overhead.sh [build dir] [bench_accelerator_overhead options...]
# Environment: RANKS (default 2), RESULTS (default bench/results).
# Writes $RESULTS/accelerator_overhead.md.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
"$build/tools/launcher/zero-run" --nproc "${RANKS:-2}" "$build/bench/bench_accelerator_overhead" "$@" 2>/dev/null |
  sed -n 's/^\[rank 0\] \(|.*\)\{0,1\}$/\1/p' | tee "$results/accelerator_overhead.md"
