#!/usr/bin/env bash
# Note [A store that never answers] (comm/rendezvous.cpp): a rank whose
# rendezvous store accepts the connection and never answers (here a plain
# listener; in the wild torch 2.x torchrun's agent store to a LibTorch 1.13
# rank) ends within ZERO_COMM_TIMEOUT and the watchdog's margin, naming the
# store, instead of waiting for ever.
#
#   bash tests/comm/silent_store.sh PROGRAM   (a program that calls zero::comm::init_process_group)
set -euo pipefail
program="$1"
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_silent_store.XXXXXX")"
listener=""
trap '[ -z "$listener" ] || kill "$listener" 2>/dev/null; rm -rf "$work"' EXIT
python3 - "$work/port" <<'EOF_PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held = []
while True:  # accepts every connection and never answers
    held.append(s.accept()[0])
EOF_PY
listener=$!
for _ in $(seq 100); do [ -f "$work/port" ] && break; sleep 0.1; done
port="$(cat "$work/port")"
start=$(date +%s)
status=0
env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 ZERO_COMM_TIMEOUT=2 \
  timeout 60 "$program" >"$work/out.log" 2>&1 || status=$?
took=$(($(date +%s) - start))
cat "$work/out.log"
[ "$status" != 0 ] || { echo "FAIL: the rank joined a store that never answers"; exit 1; }
[ "$status" != 124 ] || { echo "FAIL: the rank still waited after 60 s"; exit 1; }
grep -qE "rendezvous store at 127.0.0.1:$port (has not answered|within)" "$work/out.log" ||
  { echo "FAIL: the error does not name the store"; exit 1; }
echo "silent_store: the rank ended after $took s (status $status), naming the store"
