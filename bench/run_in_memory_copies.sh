#!/usr/bin/env bash
# What checkpoint.in_memory costs (Note [In-memory copies] in
# engine/memory_copies.h): bench_step_time's GPT (42.6 M parameters by
# default) at stages 2 and 3 on 2 ranks, with a copy in memory after every
# K-th step and without, alternating ROUNDS times, each row the mean of its
# steps (the slowest rank's per step; a median would not see a copy every
# K > 2 steps), pooled over the rounds.
# Usage: bench/run_in_memory_copies.sh [build dir] [bench_step_time options...]
# Environment: K (default 1), ROUNDS (default 3), NPROC (default 2), RESULTS.
# Prints one line per stage and a last-line JSON with the ratios
# (goal: <= 1.05 at K = 1); keeps the lines in $RESULTS/in_memory_copies.jsonl.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
lines="$results/in_memory_copies.jsonl"
rm -f "$lines"
k="${K:-1}" nproc="${NPROC:-2}"
run="$build/tools/launcher/zero-run"
bin="$build/bench/bench_step_time"
[ -x "$bin" ] || { echo "run_in_memory_copies.sh: $bin is missing; build the project first" >&2; exit 1; }

for round in $(seq "${ROUNDS:-3}"); do
  for stage in 2 3; do
    for interval in 0 "$k"; do
      "$run" --nproc "$nproc" "$bin" --mode engine --stage "$stage" --in-memory "$interval" --out "$lines" "$@" >/dev/null
    done
  done
done

# The mean of one row's step times over every round (the lines' "step_times").
mean_of() {
  grep "\"stage\":$1," "$lines" | grep "\"in_memory_interval\":$2," |
    grep -o '"step_times":\[[^]]*\]' | sed 's/.*\[//; s/\]//' | tr ',' '\n' |
    awk '{ sum += $1 } END { printf "%.6f\n", sum / NR }'
}
blas=$(grep -o '"blas":"[^"]*"' "$lines" | head -1 | sed 's/"blas":"//; s/"//')
json="{\"bench\": \"in_memory_copies\", \"k\": $k, \"ranks\": $nproc, \"blas\": \"$blas\""
for stage in 2 3; do
  without=$(mean_of "$stage" 0) with=$(mean_of "$stage" "$k")
  ratio=$(awk -v a="$with" -v b="$without" 'BEGIN { printf "%.3f", a / b }')
  echo "stage $stage, $nproc ranks: step $(awk -v x="$without" 'BEGIN { printf "%.1f", x * 1000 }') ms without copies," \
    "$(awk -v x="$with" 'BEGIN { printf "%.1f", x * 1000 }') ms with a copy every $k step(s): ${ratio}x (goal <= 1.05 at K = 1)"
  json+=", \"stage${stage}_without_s\": $without, \"stage${stage}_with_s\": $with, \"stage${stage}_ratio\": $ratio"
done
echo "$json}"
