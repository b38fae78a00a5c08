#!/usr/bin/env bash
# A node link that drops during a step (issue 40's bad input): 2 emulated
# nodes x 2 ranks train (cluster_train), node 1's link is taken down mid-run
# (ip link set zc0 down in its namespace), and every rank must end, with a
# non-zero status on both nodes, within the bound below of the drop; each
# node's output must name a rank of the other node as the one at fault.
#
#   cluster_link_drop.sh ZERO_RUN CLUSTER_TRAIN
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$1" program="$2"
export ZERO_COMM_TIMEOUT=10
# Bound: the comm timeout, then the diagnosis of the missing peer (1.5 s of
# heartbeats, Note [Missing rank]; 4.5 s when the store on rank 0 cannot be
# reached, Note [An unreachable store]) and the ranks' exit, with room for a
# loaded machine. Measured: 14.6 s after the drop with ZERO_COMM_TIMEOUT=10
# (node 0 at 11.7 s, node 1, cut off from the store, at 14.6 s).
bound_ms=$(( (ZERO_COMM_TIMEOUT + 10) * 1000 ))
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_link_drop.XXXXXX")"
name="zc$$"  # netns-cluster.sh sweeps it if this script dies without its trap
cluster=""
cleanup() {
  if [ -n "$cluster" ]; then kill -TERM "$cluster" 2>/dev/null || true; wait "$cluster" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { cat "$work/cluster.log" >&2; echo "FAIL: $*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

bash "$root/tools/netns-cluster.sh" --name "$name" --zero-run "$run" --nodes 2 --nproc 2 --time-limit 90 -- \
  "$program" --steps 1000000 --step-sleep-ms 20 --out "$work/unused.bin" >"$work/cluster.log" 2>&1 &
cluster=$!

# Mid-run: once the job has made 5 steps.
until grep -q "^\[rank 0\] step 5 loss" "$work/cluster.log"; do
  if ! kill -0 "$cluster" 2>/dev/null; then
    status=0; wait "$cluster" || status=$?; cluster=""
    if [ "$status" = 77 ]; then grep -m1 SKIP "$work/cluster.log" >&2; exit 77; fi
    fail "the job ended (status $status) before its 5th step"
  fi
  sleep 0.1
done
ip -n "$name-n1" link set zc0 down
dropped=$(now_ms)
echo "link of node 1 down at step $(grep -c '^\[rank 0\] step' "$work/cluster.log")" >&2

status=0
wait "$cluster" || status=$?
cluster=""
took=$(( $(now_ms) - dropped ))
cat "$work/cluster.log"
echo "every rank ended $took ms after the link dropped (bound $bound_ms ms, ZERO_COMM_TIMEOUT=$ZERO_COMM_TIMEOUT)"
[ "$took" -le "$bound_ms" ] || fail "the ranks took $took ms to end after the link dropped, more than $bound_ms"
grep -q "time limit" "$work/cluster.log" && fail "netns-cluster.sh's time limit stopped the job, not the ranks"
for n in 0 1; do
  s=$(sed -n "s/^netns-cluster: node $n exited with status \([0-9]*\).*/\1/p" "$work/cluster.log")
  [ -n "$s" ] && [ "$s" != 0 ] || fail "node $n exited with status ${s:-?}, expected non-zero"
done
# Node 0's ranks (0, 1) must blame rank 2 or 3, node 1's must blame 0 or 1.
grep -E '^\[rank [01]\].*CommError|^\[rank [01]\].*rank [23] ' "$work/cluster.log" | grep -qE 'rank [23] (stopped|has|never|is)' ||
  fail "no rank of node 0 named a rank of node 1 as missing"
grep -E '^\[rank [23]\]' "$work/cluster.log" | grep -qE 'rank [01] (stopped|has|never|is)|store on rank 0' ||
  fail "no rank of node 1 named a rank of node 0"
echo "PASS"
