#!/usr/bin/env bash
# ZeRO++ against plain stage 3 on 2 emulated nodes x 2 ranks
# (tools/netns-cluster.sh; root), with 1 Gbit/s and 10 Gbit/s links each
# way: stage 3, qwZ (zero_quantized_weights), hpZ (zero_hpz_partition_size
# = ranks per node), qgZ (zero_quantized_gradients) each alone, and all
# three; zero_quantization_block_size at its default (4096). Every run has
# "stage3_max_reuse_distance": 0, so that each unit is gathered again for
# its backward, as in a model larger than the reuse distance (Note [Reuse
# distance] in partition/units.cpp); else a model this small is gathered
# once a step and hpZ has nothing to do. Each run is a fresh cluster and
# bench_zeropp (bench/zeropp.cpp) measures the link's bytes from the
# namespaces' own counters over the steps after the warm-up only, so the
# start-up traffic is left out; the hub's counts of the whole run (start-up
# included) follow the table.
# Usage: bench/run_zeropp.sh [build dir] [bench_zeropp options...]
# Environment: RATES (default "1gbit 10gbit"), VARIANTS (default all five),
# NODES (2), NPROC (ranks per node, 2), RESULTS (default bench/results).
# Writes $RESULTS/zeropp.md and $RESULTS/zeropp.jsonl; the last line of
# both the output and zeropp.md is one JSON object of the ratios.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
nodes="${NODES:-2}" nproc="${NPROC:-2}"
rates="${RATES:-1gbit 10gbit}"
variants="${VARIANTS:-stage3 qwZ hpZ qgZ qwZ+hpZ+qgZ}"
regather='"stage3_max_reuse_distance": 0'
extra_for() {
  case "$1" in
    stage3) echo "$regather" ;;
    qwZ) echo "$regather, \"zero_quantized_weights\": true" ;;
    hpZ) echo "$regather, \"zero_hpz_partition_size\": $nproc" ;;
    qgZ) echo "$regather, \"zero_quantized_gradients\": true" ;;
    qwZ+hpZ+qgZ) echo "$regather, \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": $nproc, \"zero_quantized_gradients\": true" ;;
    *) echo "run_zeropp: unknown variant $1" >&2; exit 2 ;;
  esac
}
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_bench_zeropp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
jsonl="$work/zeropp.jsonl"
: >"$jsonl"
: >"$work/whole_run.txt"
for rate in $rates; do
  for variant in $variants; do
    log="$work/$rate.$variant.log" status=0
    bash "$here/../tools/netns-cluster.sh" --zero-run "$build/tools/launcher/zero-run" --nodes "$nodes" --nproc "$nproc" \
      --rate "$rate" -- "$build/bench/bench_zeropp" --variant "$variant" --zero-extra "$(extra_for "$variant")" \
      --link-rate "$rate" --out "$jsonl" "$@" >"$log" 2>&1 || status=$?
    [ "$status" = 77 ] && { grep -m1 SKIP "$log" >&2; exit 77; }
    [ "$status" = 0 ] || { cat "$log" >&2; echo "run_zeropp: $variant at $rate failed (status $status)" >&2; exit 1; }
    grep -h '^\(\[rank 0\] \)\{0,1\}zeropp ' "$log" | sed 's/^\[rank 0\] //' >&2 || true
    sed -n "s/^netns-cluster: \(node [0-9]* link: .*\)/- $rate $variant: \1/p" "$log" >>"$work/whole_run.txt"
  done
done
cp "$jsonl" "$results/zeropp.jsonl"
"$build/bench/bench_zeropp" --report "$jsonl" >"$work/report.md"
{
  sed '$d' "$work/report.md"
  echo "The whole run of each (start-up, warm-up and the final collectives included), as the hub counted each link:"
  echo
  cat "$work/whole_run.txt"
  echo
  tail -1 "$work/report.md"
} | tee "$results/zeropp.md"
