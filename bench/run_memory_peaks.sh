#!/usr/bin/env bash
# Memory per rank at ZeRO stages 0-3, fp32 and bf16, each stage in processes
# of its own (peak RSS is per process), stage 3 both at DeepSpeed's default
# stage3_max_reuse_distance and at 0, then a markdown table and an SVG chart;
# then PyTorch DDP and FSDP2 (bench/ddp_peer.py; FSDP2 when the peers' torch
# has it, >= 2.6) on the same model, batch and steps in fp32, for their peak RSS.
# Usage: bench/run_memory_peaks.sh [build dir] [bench_memory_peaks options...]
#   e.g. bench/run_memory_peaks.sh build --depth 12 --width 384
# Environment: RANKS (default 2), RESULTS (default bench/results), PYTHON
# (default: the python of the build's torch, see bench/peer_python.sh).
# Writes $RESULTS/memory_peaks.{jsonl,md,svg} and memory_peaks_peers.jsonl,
# and prints the tables.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
ranks="${RANKS:-2}"
source "$here/peer_python.sh"
peer_python "$build"
mkdir -p "$results"
lines="$results/memory_peaks.jsonl"
rm -f "$lines"
for dtype in fp32 bf16; do
  for stage in 0 1 2 3; do
    "$build/tools/launcher/zero-run" --nproc "$ranks" "$build/bench/bench_memory_peaks" \
      --stage "$stage" --dtype "$dtype" --out "$lines" "$@"
  done
  # Stage 3 again with stage3_max_reuse_distance 0: each unit let go after
  # use instead of kept from forward for backward (the default row above).
  "$build/tools/launcher/zero-run" --nproc "$ranks" "$build/bench/bench_memory_peaks" \
    --stage 3 --reuse 0 --dtype "$dtype" --out "$lines" "$@"
done
echo
"$build/bench/bench_memory_report" --in "$lines" --md "$results/memory_peaks.md" --svg "$results/memory_peaks.svg"

# The peers write a file of their own: bench_memory_report reads every line
# of memory_peaks.jsonl as a stage's.
peer_check
peer_lines="$results/memory_peaks_peers.jsonl"
rm -f "$peer_lines"
if [ "$peers" = 1 ]; then
  # The model the stages trained (the vocabulary is the corpus's, ddp_peer.py's
  # default; --expect-params stops a mismatch); the lines do not hold heads.
  read -r depth width context micro steps params < <("$python" -c 'import json, sys
j = json.loads(open(sys.argv[1]).readlines()[-1])
print(*(j[k] for k in ("depth", "width", "context", "micro", "steps", "params")))' "$lines")
  heads=4 args=("$@")
  for ((i = 0; i + 1 < ${#args[@]}; i += 2)); do
    if [ "${args[i]}" = --heads ]; then heads="${args[i+1]}"; fi
  done
  modes=(ddp)
  if [ "$fsdp2" = 1 ]; then modes+=(fsdp2); fi
  for mode in "${modes[@]}"; do
    "$build/tools/launcher/zero-run" --nproc "$ranks" "$python" "$here/ddp_peer.py" --mode "$mode" --out "$peer_lines" \
      --depth "$depth" --width "$width" --heads "$heads" --context "$context" --micro "$micro" \
      --warmup 0 --steps "$steps" --expect-params "$params"
  done
  "$python" - "$peer_lines" <<'EOF' | tee -a "$results/memory_peaks.md"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
mib = 1024.0 * 1024.0
print(f"\nPyTorch peers, fp32, {rows[0]['world']} ranks, the same model, batch and steps (MiB per rank, max over "
      "ranks; RSS increase: over the rank's own peak before the model, which holds the interpreter and torch):\n")
print("| run | peak RSS | RSS increase |\n|---|---:|---:|")
for r in rows:
    name = {"ddp": "DDP", "fsdp2": "FSDP2 (fully_shard per block)"}[r["mode"]]
    print(f"| PyTorch {r['torch']} {name} over gloo, {r['allocator']}, BLAS {r['blas'] or 'unknown'} "
          f"| {r['peak_rss'] / mib:.1f} | {(r['peak_rss'] - r['rss_baseline']) / mib:.1f} |")
EOF
fi
echo
echo "wrote $results/memory_peaks.md and $results/memory_peaks.svg"
