#!/usr/bin/env bash
# Runs a rank test as two "nodes" of N ranks on this machine: two zero-run
# launches with --nnodes 2, joined at one master port, as on a cluster.
# Usage: two_nodes.sh ZERO_RUN NPROC PROGRAM [ARGS...]
set -euo pipefail
zero_run="$1" nproc="$2"
shift 2
# A port nothing listens on (bash's /dev/tcp connects only to a listener).
port=$((20000 + RANDOM % 30000))
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((20000 + RANDOM % 30000)); done
"$zero_run" --nproc "$nproc" --nnodes 2 --node-rank 1 --master-port "$port" "$@" &
second=$!
status=0
"$zero_run" --nproc "$nproc" --nnodes 2 --node-rank 0 --master-port "$port" "$@" || status=$?
wait "$second" || status=$?
exit "$status"
