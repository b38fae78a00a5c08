#!/usr/bin/env bash
# Collective bandwidth and CPU time on 2 and 4 local ranks, over shared
# memory (the default for ranks of one host) and over gloo (TCP loopback).
# Usage: bench/run_collectives.sh [build dir] [max MiB]
set -euo pipefail
build="${1:-build}"
max="${2:-256}"
for n in 2 4; do
  for transport in shm gloo; do
    ZERO_HOST_TRANSPORT="$transport" "$build/tools/launcher/zero-run" --nproc "$n" "$build/bench/bench_collectives" --max-mib "$max"
  done
done
