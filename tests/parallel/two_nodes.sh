#!/usr/bin/env bash
# Runs a rank test as two "nodes" of N ranks on this machine: two zero-run
# launches with --nnodes 2, joined at one master port, as on a cluster.
# Usage: two_nodes.sh ZERO_RUN NPROC PROGRAM [ARGS...]
set -euo pipefail
zero_run="$1" nproc="$2"
shift 2
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$zero_run" --nproc "$nproc" --nnodes 2 --node-rank 1 --master-port "$port" "$@" &
second=$!
status=0
"$zero_run" --nproc "$nproc" --nnodes 2 --node-rank 0 --master-port "$port" "$@" || status=$?
wait "$second" || status=$?
exit "$status"
