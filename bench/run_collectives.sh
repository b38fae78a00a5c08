#!/usr/bin/env bash
# Collective bandwidth on 2 and 4 local ranks. Usage: bench/run_collectives.sh [build dir] [max MiB]
set -euo pipefail
build="${1:-build}"
max="${2:-256}"
for n in 2 4; do
  "$build/tools/launcher/zero-run" --nproc "$n" "$build/bench/bench_collectives" --max-mib "$max"
done
