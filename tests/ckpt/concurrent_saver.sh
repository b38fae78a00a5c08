#!/usr/bin/env bash
# One job (2 ranks) saves and loads `latest` in a loop while another job
# (1 rank) keeps saving into the same folder: every load is whole and
# agreed on by every rank (ckpt_concurrent_saver.cpp says how that is
# checked), the other job really saved meanwhile, and afterwards every tag
# in the folder is whole and `latest` names one.
#   bash tests/ckpt/concurrent_saver.sh ZERO_RUN PROGRAM [ROUNDS]
set -uo pipefail
run="$1" program="$2" rounds="${3:-40}"
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_concurrent_saver.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$run" --nproc 1 "$program" save "$work/ckpt" "$work/stop" >"$work/saver.log" 2>&1 &
saver=$!
# Let the saver's first checkpoint land, so the loop's first load can find either job's.
for _ in $(seq 100); do [ -f "$work/ckpt/latest" ] && break; sleep 0.1; done
"$run" --nproc 2 "$program" loop "$work/ckpt" "$rounds" >"$work/loop.log" 2>&1
loop_status=$?
touch "$work/stop"
wait "$saver"
saver_status=$?
"$program" audit "$work/ckpt" - >"$work/audit.log" 2>&1
audit_status=$?
cat "$work/loop.log" "$work/saver.log" "$work/audit.log"
[ "$audit_status" = 0 ] || { echo "FAIL: the folder holds broken checkpoints afterwards"; exit 1; }
[ "$loop_status" = 0 ] || { echo "FAIL: the looping job ended with status $loop_status"; exit 1; }
[ "$saver_status" = 0 ] || { echo "FAIL: the other saver ended with status $saver_status"; exit 1; }
saves=$(sed -n 's/^\(\[rank 0\] \)\{0,1\}saver: \([0-9]*\) saves.*/\2/p' "$work/saver.log")
[ "${saves:-0}" -ge "$rounds" ] || { echo "FAIL: the other job saved ${saves:-0} times, fewer than the $rounds rounds: not concurrent enough"; exit 1; }
echo "concurrent_saver: passed"
