#!/usr/bin/env bash
# ZeRO++'s convergence criterion (DeepSpeed's own for ZeRO++): on 2 emulated
# nodes x 2 ranks (tools/netns-cluster.sh), examples/gpt's GPT trained 300
# steps at stage 3 with qwZ, hpZ and qgZ each alone and all three together
# ends within 1.1x of plain stage 3's final loss on the same data
# (cluster_gpt). Checkpoints are unchanged by ZeRO++ (the masters stay
# exact): plain stage 3's checkpoint at step 150 resumes with all three on,
# and all three's resumes without them, each ending within 1.1x too.
#
#   cluster_zeropp_convergence.sh ZERO_RUN CLUSTER_GPT WORK VARIANT
#
# VARIANT: stage3 (the reference: its losses and its checkpoint at step 150
# go into WORK, which it empties first), qwZ, hpZ, qgZ, all (which also
# leaves its checkpoint at step 150), or resume (both checkpoints, resumed
# the other way). ctest runs stage3 and all as fixtures, so each test is
# one run. Exit 77 (skipped) where network namespaces cannot be made.
set -euo pipefail
run="$1" program="$2" work="$3" variant="$4"
. "$(dirname "$0")/lib.sh"
steps=300 half=150

# train NAME ZERO_EXTRA [cluster_gpt options...]: a 2 x 2 run; its losses in WORK/NAME.losses.
train() {
  local name="$1" extra="$2"
  shift 2
  local args=("$program" --steps "$steps" "$@")
  [ -n "$extra" ] && args+=(--zero-extra "$extra")
  cluster_run "$work/$name.log" 150 "${args[@]}"
  losses "$work/$name.log" >"$work/$name.losses"
  [ "$(tail -1 "$work/$name.losses" | awk '{ print $2 }')" = "$steps" ] ||
    { cat "$work/$name.log"; fail "$name: did not reach step $steps"; }
}
last_loss() { tail -1 "$work/$1.losses" | awk '{ print $5 }'; }
# within NAME WHAT: NAME's final loss within 1.1x of stage 3's.
within() {
  python3 - "$(last_loss stage3)" "$(last_loss "$1")" "$2" <<'PY' || fail "$2 (above)"
import sys
plain, loss, what = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(f"{what}: final loss {loss:.4f}, {loss / plain:.4f}x plain stage 3's {plain:.4f} (at most 1.1x)")
sys.exit(0 if loss <= 1.1 * plain else 1)
PY
}

qwz='"zero_quantized_weights": true'
hpz='"zero_hpz_partition_size": 2'
qgz='"zero_quantized_gradients": true'
all="$qwz, $hpz, $qgz"
if [ "$variant" != stage3 ]; then
  [ -s "$work/stage3.losses" ] || fail "no reference in $work: run the stage3 variant first (ctest's fixture)"
fi
case "$variant" in
  stage3)
    rm -rf "$work"
    mkdir -p "$work"
    train stage3 "" --save-at "$half" --save "$work/stage3.ckpt"
    python3 - "$(head -1 "$work/stage3.losses" | awk '{ print $5 }')" "$(last_loss stage3)" <<'PY' || fail "plain stage 3 did not learn"
import sys
first, last = float(sys.argv[1]), float(sys.argv[2])
print(f"plain stage 3: loss {first:.4f} at step 1, {last:.4f} at step 300")
sys.exit(0 if last < 0.8 * first else 1)
PY
    ;;
  qwZ) train qwZ "$qwz" && within qwZ "qwZ" ;;
  hpZ) train hpZ "$hpz" && within hpZ "hpZ" ;;
  qgZ) train qgZ "$qgz" && within qgZ "qgZ" ;;
  all) train all "$all" --save-at "$half" --save "$work/all.ckpt" && within all "qwZ + hpZ + qgZ" ;;
  resume)
    [ -d "$work/all.ckpt" ] || fail "no checkpoint of all three in $work: run the all variant first (ctest's fixture)"
    # Each resumed run goes from step 151 to 300.
    train all_from_stage3 "$all" --load "$work/stage3.ckpt"
    train stage3_from_all "" --load "$work/all.ckpt"
    for resumed in all_from_stage3 stage3_from_all; do
      [ "$(head -1 "$work/$resumed.losses" | awk '{ print $2 }')" = $((half + 1)) ] ||
        fail "$resumed did not resume at step $((half + 1))"
    done
    within all_from_stage3 "plain stage 3's checkpoint resumed with all three"
    within stage3_from_all "all three's checkpoint resumed without them"
    ;;
  *) echo "cluster_zeropp_convergence: unknown variant $variant" >&2; exit 2 ;;
esac
