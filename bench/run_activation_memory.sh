#!/usr/bin/env bash
# Activation memory, peak RSS and step time with and without activation
# checkpointing on the example GPT (depth 8 by default) across context
# lengths, on CPU ranks through zero-run; the table and an SVG chart.
# Usage: bench/run_activation_memory.sh [build dir] [bench_activation_memory options...]
#   e.g. bench/run_activation_memory.sh build --depth 8 --width 256
# Environment: CONTEXTS (default "128 256 512 1024 2048"), NPROC (default 2),
# BUDGET_MB (default 256: the activation budget per rank the longest-context
# goal is read against), CHECKPOINTED (default "0 8": how many of the blocks
# recompute in each run, 0 for none; the depth for all), ROUNDS (default 1:
# the whole grid again, pooled), RESULTS (default bench/results).
# Writes $RESULTS/activation_memory.jsonl, .md and .svg. Exits 0 when the
# runs complete: the goals are information.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
lines="$results/activation_memory.jsonl"
rm -f "$lines"
bin="$build/bench/bench_activation_memory"
for _round in $(seq "${ROUNDS:-1}"); do
  for context in ${CONTEXTS:-128 256 512 1024 2048}; do
    for checkpoint in ${CHECKPOINTED:-0 8}; do  # alternating, so that drift reaches every variant alike
      "$build/tools/launcher/zero-run" --nproc "${NPROC:-2}" "$bin" --context "$context" --checkpoint "$checkpoint" \
        --out "$lines" "$@" | grep -E 'context [0-9]+, checkpointing' || true
    done
  done
done
"$bin" --mode report --in "$lines" --budget-mb "${BUDGET_MB:-256}" --svg "$results/activation_memory.svg" | tee "$results/activation_memory.md"
