#!/usr/bin/env bash
# 2 emulated nodes x 2 ranks (tools/netns-cluster.sh) against 1 node x 4
# ranks: the same stage-3 run (cluster_train) must give the same losses and
# final weights bit for bit. Both sum every reduction in rank order (the
# shared-memory transport by construction; gloo's reduce-scatter is an
# all-to-all and a local sum in rank order, comm/gloo.cpp), so
# nothing but a change of order could make them differ; see tests/cluster/
# CMakeLists.txt for the measurement. Also checks the node layout each rank
# reports (Mesh::dp_intra_node_group, dp_inter_node_group and their
# transports; also at tp 2, where the dp groups span the nodes one rank
# each) and that the run's traffic crossed the emulated links.
#
#   cluster_parity.sh ZERO_RUN CLUSTER_TRAIN
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -euo pipefail
run="$1" program="$2"
. "$(dirname "$0")/lib.sh"
steps=20
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_cluster.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cluster_run "$work/cluster.log" 80 "$program" --steps "$steps" --out "$work/cluster.bin"
"$run" --nproc 4 "$program" --steps "$steps" --out "$work/reference.bin" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the 1-node run failed"; }

# The layout each rank reports: node n holds ranks 2n, 2n+1; the world and
# the inter-node groups cross the link over gloo, a node's ranks share memory.
for r in 0 1 2 3; do
  n=$((r / 2)) j=$((r % 2))
  want="layout: rank $r node $n of 2; world gloo; dp intra [$((2 * n)),$((2 * n + 1))] shm; dp inter [$j,$((j + 2))] gloo"
  grep -qF "$want" "$work/cluster.log" || { cat "$work/cluster.log"; fail "2 nodes: no line '$want'"; }
  want="layout: rank $r node 0 of 1; world shm; dp intra [0,1,2,3] shm; dp inter none"
  grep -qF "$want" "$work/reference.log" || { cat "$work/reference.log"; fail "1 node: no line '$want'"; }
done

# With tp 2 (a tensor-parallel pair on each node) the dp groups {0, 2} and
# {1, 3} hold one rank per node: intra-node groups of one, and the
# inter-node group is the dp group itself (Note [Node groups]).
cluster_run "$work/tp2.log" 60 "$program" --layout-tp 2
for r in 0 1 2 3; do
  want="layout: rank $r node $((r / 2)) of 2; world gloo; dp intra [$r] local; dp inter [$((r % 2)),$((r % 2 + 2))] gloo"
  grep -qF "$want" "$work/tp2.log" || { cat "$work/tp2.log"; fail "2 nodes, tp 2: no line '$want'"; }
done

# Stage 3 gathers the parameters and reduce-scatters the gradients over
# the world: at the least, each node sends the other its half of the 3,217
# fp32 parameters for the gather and its partial sums of the other half of
# the gradients, 6,434 bytes each, every step: 257,360 bytes in 20 steps.
for n in 0 1; do
  sent=$(sed -n "s/^netns-cluster: node $n link: sent \([0-9]*\) bytes.*/\1/p" "$work/cluster.log")
  [ -n "$sent" ] && [ "$sent" -ge 257360 ] || { cat "$work/cluster.log"; fail "node $n sent ${sent:-?} bytes over its link, expected >= 257360"; }
done

losses "$work/reference.log" >"$work/reference.losses"
losses "$work/cluster.log" >"$work/cluster.losses"
[ "$(wc -l <"$work/reference.losses")" = "$steps" ] || { cat "$work/reference.log"; fail "the 1-node run printed no $steps losses"; }
if ! cmp -s "$work/reference.losses" "$work/cluster.losses" || ! cmp -s "$work/reference.bin" "$work/cluster.bin"; then
  paste "$work/reference.losses" "$work/cluster.losses" >&2
  python3 - "$work/reference.bin" "$work/cluster.bin" <<'PY' >&2 || true
import struct, sys
a, b = (open(p, 'rb').read() for p in sys.argv[1:3])
if len(a) != len(b): print(f"final weights: {len(a)} vs {len(b)} bytes"); sys.exit()
x, y = (struct.unpack(f'{len(a) // 4}f', v) for v in (a, b))
print("final weights: max |difference|", max(abs(p - q) for p, q in zip(x, y)))
PY
  fail "2 nodes x 2 ranks differ from 1 node x 4 ranks (above: 1 node | 2 nodes)"
fi
echo "2 nodes x 2 ranks equal 1 node x 4 ranks bit for bit: $steps losses (last: $(tail -1 "$work/cluster.losses")) and $(stat -c %s "$work/cluster.bin") bytes of final weights"
