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
#
# NODES=N (default 1) runs the same on N emulated nodes of RANKS/N ranks
# (tools/netns-cluster.sh; root), each node's link limited to LINK_RATE
# each way (default 1gbit): a tensor-parallel group of up to RANKS/N ranks
# stays on its node (shared memory) while dp and pp cross the link (gloo),
# as on a real cluster. Writes $RESULTS/hybrid_layouts_nodes<N>_<rate>.md,
# with the bytes each node's link carried over the whole run.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
ranks="${RANKS:-4}" nodes="${NODES:-1}"
if [ "$nodes" = 1 ]; then
  "$build/tools/launcher/zero-run" --nproc "$ranks" "$build/bench/bench_hybrid_layouts" "$@" 2>/dev/null |
    sed -n '/^\[rank 0\] zero\./d; s/^\[rank 0\] //p' | tee "$results/hybrid_layouts.md"
  exit
fi
[ $((ranks % nodes)) = 0 ] || { echo "run_hybrid_layouts: RANKS=$ranks is not a multiple of NODES=$nodes" >&2; exit 2; }
rate="${LINK_RATE:-1gbit}"
out="$results/hybrid_layouts_nodes${nodes}_${rate}.md"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
bash "$here/../tools/netns-cluster.sh" --zero-run "$build/tools/launcher/zero-run" --nodes "$nodes" \
  --nproc $((ranks / nodes)) --rate "$rate" -- "$build/bench/bench_hybrid_layouts" "$@" >"$log" 2>&1 || status=$?
[ "$status" = 77 ] && { grep -m1 SKIP "$log" >&2; exit 77; }
[ "$status" = 0 ] || { cat "$log" >&2; echo "run_hybrid_layouts: the run on $nodes nodes failed (status $status)" >&2; exit 1; }
{
  echo "On $nodes emulated nodes x $((ranks / nodes)) ranks (tools/netns-cluster.sh), links of $rate each way."
  echo
  sed -n '/^\[rank 0\] zero\./d; s/^\[rank 0\] //p' "$log"
  echo
  sed -n 's/^netns-cluster: \(node [0-9]* link: .*\)/- \1 (the whole run, every layout)/p' "$log"
} | tee "$out"
