#!/usr/bin/env bash
# A named cluster whose script was killed with SIGKILL (no trap runs) leaves
# its namespaces; the next run of that name sweeps them and runs, instead
# of failing to make them (issue 64): tools/netns-cluster.sh --name.
#
#   cluster_sweep.sh ZERO_RUN
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$1"
name="zsweep$$"
log="$(mktemp)"
trap 'rm -f "$log"; for ns in $(ip netns list 2>/dev/null | awk "{print \$1}" | grep "^$name-"); do ip netns del "$ns"; done' EXIT
namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -c "^$name-" ; }

bash "$root/tools/netns-cluster.sh" --name "$name" --zero-run "$run" --nodes 2 --nproc 1 -- sleep 60 >"$log" 2>&1 &
cluster=$!
for _ in $(seq 1 200); do
  if ! kill -0 "$cluster" 2>/dev/null; then
    wait "$cluster"; status=$?
    if [ "$status" = 77 ]; then grep -m1 SKIP "$log" >&2; exit 77; fi
    cat "$log" >&2; echo "FAIL: the first cluster ended (status $status) before it was killed"; exit 1
  fi
  grep -q "node(s) x" "$log" && [ "$(namespaces)" = 3 ] && break
  sleep 0.1
done
[ "$(namespaces)" = 3 ] || { cat "$log" >&2; echo "FAIL: the first cluster never made its 3 namespaces"; exit 1; }
kill -KILL "$cluster"; wait "$cluster" 2>/dev/null
[ "$(namespaces)" = 3 ] || { echo "FAIL: SIGKILL left $(namespaces) namespaces, not the 3 this test sweeps"; exit 1; }

if ! bash "$root/tools/netns-cluster.sh" --name "$name" --zero-run "$run" --nodes 2 --nproc 1 -- true >"$log" 2>&1; then
  cat "$log" >&2; echo "FAIL: the next run of cluster $name did not sweep and run"; exit 1
fi
grep -q "removing the namespaces of cluster $name" "$log" || { cat "$log" >&2; echo "FAIL: the sweep was not said"; exit 1; }
[ "$(namespaces)" = 0 ] || { echo "FAIL: $(namespaces) namespaces of $name are left after the second run"; exit 1; }
echo "ok: a SIGKILLed cluster $name was swept by the next run of that name"
