#!/usr/bin/env bash
# An uncaught Python exception on rank 0, the other rank blocked in a
# collective rank 0 will never join: the job ends on the error at once
# (Note [Exiting on an error]), with the traceback, not after the comm
# timeout (60 s here) that rank 0 used to spend keeping the store up.
# Usage: error_exits_fast.sh ZERO_RUN PYTHON
set -euo pipefail
zero_run="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" python="$2"
cd "$(dirname "$0")"
log="$(mktemp "${TMPDIR:-/tmp}/error_exits_fast.XXXXXX")"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
if ZERO_COMM_TIMEOUT=60 OMP_NUM_THREADS=1 "$zero_run" --nproc 2 "$python" error_on_rank0.py > "$log" 2>&1; then
  cat "$log"; echo "FAIL: the job succeeded"; exit 1
fi
took=$(( $(date +%s) - start ))
grep -q "RuntimeError: a mistake on rank 0, after step 2" "$log" || { cat "$log"; echo "FAIL: no traceback"; exit 1; }
echo "the job ended on rank 0's error in $took s (comm timeout 60 s)"
[ "$took" -lt 30 ] || { echo "FAIL: it waited for the comm timeout"; exit 1; }
