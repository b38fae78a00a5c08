#!/usr/bin/env bash
# zero-run --max-restarts across 2 emulated nodes x 2 ranks (Note [Restarts
# across nodes] in tools/launcher/node_link.h), with checkpoint.in_memory
# every step and a disk checkpoint every 5:
#   1. rank 2 (node 1) killed in step 7 on the first start: node 1 tells
#      node 0, both stop their ranks and start them again, and the job
#      resumes from the in-memory copy of step 6 to the uninterrupted run's
#      parameters, byte for byte;
#   2. a fault on every start with --max-restarts 1: both nodes end after
#      one restart with the killed rank's status, node 0 saying why;
#   3. node 1's zero-run killed: node 0 ends the job, naming node 1.
#
#   cluster_restarts.sh ZERO_RUN FAULT_INJECTION
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -euo pipefail
run="$1" program="$2"
. "$(dirname "$0")/lib.sh"
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_cluster_restarts.XXXXXX")"
trap 'rm -rf "$work"' EXIT
steps=12 save_every=5 stage=2
says() { grep -qF "$2" "$1" || { cat "$1"; fail "the log does not say: $2"; }; }

cluster_run "$work/reference.log" 60 "$program" train "$work/reference" "$steps" "$save_every" "$stage" 0

status=0
bash "$root/tools/netns-cluster.sh" --zero-run "$run" --nodes 2 --nproc 2 --time-limit 120 \
  --launcher-arg --max-restarts --launcher-arg 2 -- \
  bash -c '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && export ZERO_FAULT=step.reduced:2:7; exec "$0" "$@"' \
  "$program" train "$work/restarted" "$steps" "$save_every" "$stage" 1 >"$work/restarted.log" 2>&1 || status=$?
if [ "$status" = 77 ]; then grep -m1 SKIP "$work/restarted.log" >&2; exit 77; fi
[ "$status" = 0 ] || { cat "$work/restarted.log"; fail "the restarted job ended with status $status"; }
says "$work/restarted.log" "rank 2 was killed by SIGKILL"
says "$work/restarted.log" "a rank on node 1 failed; stopping the ranks of node 0"
says "$work/restarted.log" "restart 1 of 2: starting the 2 ranks of node 0 again, with every other node's"
says "$work/restarted.log" "restart 1 of 2: starting the 2 ranks of node 1 again, with every other node's"
says "$work/restarted.log" "resuming from the in-memory copy of step 6 (the newest checkpoint in $work/restarted is step 5)"
! grep -qF "restart 2 of 2" "$work/restarted.log" || { cat "$work/restarted.log"; fail "a second restart with one failure"; }
cmp -s "$work/reference/final.bin" "$work/restarted/final.bin" ||
  fail "the restarted job's final parameters differ from the uninterrupted run's"

status=0
bash "$root/tools/netns-cluster.sh" --zero-run "$run" --nodes 2 --nproc 2 --time-limit 120 \
  --launcher-arg --max-restarts --launcher-arg 1 -- \
  env ZERO_FAULT=step.reduced:2:3 "$program" train "$work/doomed" "$steps" "$save_every" "$stage" 1 \
  >"$work/doomed.log" 2>&1 || status=$?
[ "$status" = 137 ] || { cat "$work/doomed.log"; fail "the job with a fault on every start ended with status $status, not 137"; }
[ "$(grep -c "rank 2 was killed by SIGKILL" "$work/doomed.log")" = 2 ] || { cat "$work/doomed.log"; fail "not two starts"; }
says "$work/doomed.log" "the ranks failed after 1 restart(s), all that --max-restarts 1 allows"
for n in 0 1; do
  says "$work/doomed.log" "netns-cluster: node $n exited with status 137"
done
# 3. Node 1's zero-run killed (its machine lost): node 0 stops its ranks and
#    ends the job naming it, restarts left or not.
name="zcr$$"
bash "$root/tools/netns-cluster.sh" --zero-run "$run" --nodes 2 --nproc 2 --time-limit 120 --name "$name" \
  --launcher-arg --max-restarts --launcher-arg 2 -- \
  "$program" train "$work/node_lost" 100000 5 "$stage" 1 >"$work/node_lost.log" 2>&1 &
cluster=$!
for _ in $(seq 600); do [ -e "$work/node_lost/latest" ] && break; sleep 0.1; done
[ -e "$work/node_lost/latest" ] || { kill "$cluster"; wait "$cluster" || true; cat "$work/node_lost.log"; fail "no checkpoint within 60 s"; }
launcher=""
for pid in $(ip netns pids "$name-n1"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = zero-run ] && launcher="$pid"
done
[ -n "$launcher" ] || { kill "$cluster"; wait "$cluster" || true; fail "no zero-run in node 1's namespace"; }
kill -9 "$launcher"
status=0
wait "$cluster" || status=$?
[ "$status" != 0 ] || { cat "$work/node_lost.log"; fail "the job that lost node 1 succeeded"; }
says "$work/node_lost.log" "node 1's zero-run is gone (its link to node 0 closed); stopping the ranks of node 0"
says "$work/node_lost.log" "node(s) 1 left the job"
! grep -qF "restart 1 of 2" "$work/node_lost.log" || { cat "$work/node_lost.log"; fail "a restart without node 1"; }

echo "cluster_restarts: rank 2 on node 1 killed, both nodes restarted and resumed from the in-memory copy of step 6 to the uninterrupted run's parameters, byte for byte; a fault on every start ended both nodes after the one restart allowed; node 1's zero-run killed ended the job, naming it"
