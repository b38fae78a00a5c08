#!/usr/bin/env bash
# checkpoint.in_memory across 2 emulated nodes x 2 ranks (Note [In-memory
# copies] in engine/memory_copies.h): each node keeps its ranks' copies and
# the other node's. Rank 1 is killed in step 7 (disk: step 5, memory: step
# 6); then
#   1. node 1's memory folder is lost (its reboot): the job resumes from the
#      copy of step 6, node 0 sending node 1 the 5 files it lacks;
#   2. both folders lost: the disk's step 5.
# Both end with the uninterrupted run's parameters (the same program without
# copies), byte for byte.
#
#   cluster_in_memory.sh ZERO_RUN FAULT_INJECTION
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -euo pipefail
run="$1" program="$2"
. "$(dirname "$0")/lib.sh"
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_cluster_memory.XXXXXX")"
trap 'rm -rf "$work"' EXIT
steps=12 save_every=5 stage=2
# Each node's own memory folder, kept between the launches (zero-run's own
# would go with each job).
node_folder='export ZERO_MEMORY_CHECKPOINTS='"$work"'/memory-node$GROUP_RANK; exec "$0" "$@"'

cluster_run "$work/reference.log" 60 "$program" train "$work/reference" "$steps" "$save_every" "$stage" 0

status=0
bash "$root/tools/netns-cluster.sh" --zero-run "$run" --nodes 2 --nproc 2 --time-limit 60 -- \
  env ZERO_FAULT=step.reduced:1:7 bash -c "$node_folder" "$program" train "$work/killed" "$steps" "$save_every" "$stage" 1 \
  >"$work/killed.log" 2>&1 || status=$?
if [ "$status" = 77 ]; then grep -m1 SKIP "$work/killed.log" >&2; exit 77; fi
[ "$status" != 0 ] || { cat "$work/killed.log"; fail "the run with rank 1 killed succeeded"; }
for n in 0 1; do
  [ -f "$work/memory-node$n/global_step6/manifest.json" ] || { ls -R "$work" >&2; fail "node $n holds no copy of step 6"; }
  [ "$(ls "$work/memory-node$n/global_step6" | grep -c '^rank')" = 4 ] || { ls -R "$work" >&2; fail "node $n does not hold all 4 ranks' files"; }
done
cp -a "$work/killed" "$work/both_lost"

# 1. Node 1 lost its memory.
rm -rf "$work/memory-node1"
cluster_run "$work/node_lost.log" 60 bash -c "$node_folder" "$program" train "$work/killed" "$steps" "$save_every" "$stage" 1
says() { grep -qF "$2" "$1" || { cat "$1"; fail "the log does not say: $2"; }; }
says "$work/node_lost.log" "resuming from the in-memory copy of step 6 (the newest checkpoint in $work/killed is step 5; 5 file(s) sent to the nodes that had lost them)"
cmp -s "$work/reference/final.bin" "$work/killed/final.bin" || fail "node lost: the final parameters differ from the uninterrupted run's"

# 2. Both nodes lost their memory.
rm -rf "$work/memory-node0" "$work/memory-node1"
cluster_run "$work/both_lost.log" 60 bash -c "$node_folder" "$program" train "$work/both_lost" "$steps" "$save_every" "$stage" 1
! grep -qF "in-memory copy" "$work/both_lost.log" || { cat "$work/both_lost.log"; fail "a copy was read after both folders were removed"; }
says "$work/both_lost.log" "loaded $work/both_lost/global_step5"
cmp -s "$work/reference/final.bin" "$work/both_lost/final.bin" || fail "both lost: the final parameters differ from the uninterrupted run's"
echo "cluster_in_memory: with node 1's memory lost the job resumed from step 6's copies on node 0; with both lost from the disk's step 5; both ended with the uninterrupted run's parameters, byte for byte"
