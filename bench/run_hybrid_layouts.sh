#!/usr/bin/env bash
# Rank layouts on one GPT and global batch, one run on 4 local CPU ranks:
# DP only (ZeRO stage 1 and 3) against tensor parallelism by AutoTP (tp x dp)
# and pipeline parallelism (pp x dp, tp x pp; 1F1B), stage 1: tokens/s and
# the ratio to DP-only stage 1 measured in the same run, model states and
# activations per rank, bytes per step on the tp, dp and pipeline links
# against the theory, and the pipeline bubble (see bench/hybrid_layouts.cpp).
# Usage: bench/run_hybrid_layouts.sh [build dir] [bench_hybrid_layouts options...]
# Environment: RANKS (default 4), RESULTS (default bench/results).
# Writes $RESULTS/hybrid_layouts.md.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
"$build/tools/launcher/zero-run" --nproc "${RANKS:-4}" "$build/bench/bench_hybrid_layouts" "$@" 2>/dev/null |
  sed -n '/^\[rank 0\] zero\./d; s/^\[rank 0\] //p' | tee "$results/hybrid_layouts.md"
