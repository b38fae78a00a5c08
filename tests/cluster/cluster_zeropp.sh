#!/usr/bin/env bash
# ZeRO++ on 2 emulated nodes x 2 ranks (tools/netns-cluster.sh), against
# plain stage 3 on the same nodes and data (cluster_train):
#  - hpZ alone trains bit for bit as plain stage 3 (its secondary partition
#    holds the exact gathered weights) and sends fewer bytes over the links
#    (backward's gathers stay in the node);
#  - qwZ + hpZ + qgZ ends within 1.1x of plain stage 3's loss (DeepSpeed's
#    criterion for ZeRO++) and sends fewer bytes over the links than hpZ
#    alone (on this small model, packets' headers, the loss's and the
#    norm's all-reduces and the persistent head weigh as much as the units;
#    bench/run_zeropp.sh measures the ratios on a model where they do not).
#
#   cluster_zeropp.sh ZERO_RUN CLUSTER_TRAIN
# Exit 77 (skipped) where network namespaces cannot be made, saying why.
set -euo pipefail
run="$1" program="$2"
. "$(dirname "$0")/lib.sh"
steps=30
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_cluster_zeropp.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# train NAME [ZERO_EXTRA]: a 2 x 2 run; its losses in NAME.losses, the bytes
# both nodes sent over their links in NAME.sent.
train() {
  local name="$1" extra="${2:-}"
  local args=("$program" --steps "$steps" --out "$work/$name.bin")
  [ -n "$extra" ] && args+=(--zero-extra "$extra")
  cluster_run "$work/$name.log" 80 "${args[@]}"
  losses "$work/$name.log" >"$work/$name.losses"
  [ "$(wc -l <"$work/$name.losses")" = "$steps" ] || { cat "$work/$name.log"; fail "$name: no $steps losses"; }
  sed -n 's/^netns-cluster: node [0-9]* link: sent \([0-9]*\) bytes.*/\1/p' "$work/$name.log" |
    awk '{ s += $1 } END { print s }' >"$work/$name.sent"
}
last_loss() { tail -1 "$work/$1.losses" | awk '{ print $5 }'; }

# Reuse distance 0: every unit is gathered again for its backward, as in a
# model larger than stage3_max_reuse_distance (Note [Reuse distance]).
regather='"stage3_max_reuse_distance": 0'
train plain "$regather"
train hpz "$regather"', "zero_hpz_partition_size": 2'
train all "$regather"', "zero_hpz_partition_size": 2, "zero_quantized_weights": true, "zero_quantized_gradients": true, "zero_quantization_block_size": 64'
plain=$(cat "$work/plain.sent") hpz=$(cat "$work/hpz.sent") all=$(cat "$work/all.sent")

cmp -s "$work/plain.losses" "$work/hpz.losses" && cmp -s "$work/plain.bin" "$work/hpz.bin" ||
  { paste "$work/plain.losses" "$work/hpz.losses" >&2; fail "hpZ alone differs from plain stage 3"; }
[ "$hpz" -lt "$plain" ] || fail "hpZ sent $hpz bytes over the links, plain stage 3 $plain"
python3 - "$(last_loss plain)" "$(last_loss all)" "$plain" "$all" "$hpz" <<'PY' || fail "qwZ + hpZ + qgZ (above)"
import sys
plain_loss, all_loss, plain_bytes, all_bytes, hpz_bytes = (float(v) for v in sys.argv[1:6])
print(f"final loss: plain stage 3 {plain_loss:.6g}, qwZ + hpZ + qgZ {all_loss:.6g} ({all_loss / plain_loss:.4f}x); "
      f"bytes over the links: {all_bytes:.0f} against {plain_bytes:.0f} ({all_bytes / plain_bytes:.3f}x)")
sys.exit(0 if all_loss <= 1.1 * plain_loss and all_bytes < hpz_bytes else 1)
PY
echo "hpZ alone: bit for bit plain stage 3, $hpz bytes over the links against $plain"
