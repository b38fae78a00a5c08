#!/usr/bin/env bash
# NVMe swapper write/read GB/s against fio (io_uring, O_DIRECT, the same
# block size, queue depth, total size and directory), measured in the same
# run: REPEAT rounds, each running bench_nvme_swapper once (write, then read
# back) and fio write then read (a fresh file), alternating which goes first;
# medians and the ratios swapper/fio are printed (goal: at least 0.9).
# Usage: bench/run_nvme_swapper.sh [build dir] [directory]
#   directory: where the files go (default <build dir>/nvme_swapper_bench),
#   e.g. a folder on the NVMe drive nvme_path would point to.
# Environment: BS (block size, default 1048576), QD (queue depth, default 8),
# TOTAL_MIB (1024), KEY_MIB (256), REPEAT (3), RESULTS (default bench/results).
# Writes $RESULTS/nvme_swapper.md and prints the table.
set -euo pipefail
build="${1:-build}"
here="$(cd "$(dirname "$0")" && pwd)"
dir="${2:-$build/nvme_swapper_bench}"
results="${RESULTS:-$here/results}"
bs="${BS:-1048576}"
qd="${QD:-8}"
total_mib="${TOTAL_MIB:-1024}"
key_mib="${KEY_MIB:-256}"
repeat="${REPEAT:-3}"
fio="${FIO:-fio}"
command -v "$fio" >/dev/null || { echo "fio not found (tools/setup-deps.sh installs it)" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq not found" >&2; exit 1; }
mkdir -p "$dir" "$results"
dir="$(cd "$dir" && pwd)"
ref="$dir/fio_reference.dat"
trap 'rm -f "$ref"' EXIT

fio_gbps() {  # rw -> GB/s (1e9 bytes/s)
  "$fio" --name=swapper_reference --filename="$ref" --ioengine=io_uring --direct=1 --bs="$bs" \
    --iodepth="$qd" --rw="$1" --size="${total_mib}M" --output-format=json |
    jq -r --arg rw "$1" '.jobs[0][$rw].bw_bytes / 1e9'
}

ours() {  # the swapper on AlignedBuffer (huge pages), then on 4 KiB pages
  local line
  line="$("$build/bench/bench_nvme_swapper" --dir "$dir" --total-mib "$total_mib" --key-mib "$key_mib" \
    --block-size "$bs" --queue-depth "$qd" --repeat 1 --pages huge | tail -n 1)"
  direct="$(jq -r .direct_io <<<"$line")"
  ours_w+=("$(jq -r .write_gbps_median <<<"$line")")
  ours_r+=("$(jq -r .read_gbps_median <<<"$line")")
  line="$("$build/bench/bench_nvme_swapper" --dir "$dir" --total-mib "$total_mib" --key-mib "$key_mib" \
    --block-size "$bs" --queue-depth "$qd" --repeat 1 --pages small | tail -n 1)"
  small_w+=("$(jq -r .write_gbps_median <<<"$line")")
  small_r+=("$(jq -r .read_gbps_median <<<"$line")")
}
reference() {
  rm -f "$ref"
  fio_w+=("$(fio_gbps write)")
  fio_r+=("$(fio_gbps read)")
  rm -f "$ref"
}
ours_w=() ours_r=() small_w=() small_r=() fio_w=() fio_r=() direct=unknown
for ((i = 0; i < repeat; i++)); do
  # Alternate which goes first, so that drift in the disk's state (a
  # virtual disk's host cache, background writeback) hits both alike.
  if ((i % 2 == 0)); then ours; reference; else reference; ours; fi
  printf 'round %d: swapper write %.3f read %.3f GB/s (4 KiB pages: %.3f, %.3f) | fio write %.3f read %.3f GB/s\n' \
    "$i" "${ours_w[-1]}" "${ours_r[-1]}" "${small_w[-1]}" "${small_r[-1]}" "${fio_w[-1]}" "${fio_r[-1]}"
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
mw="$(median "${ours_w[@]}")" mr="$(median "${ours_r[@]}")"
sw="$(median "${small_w[@]}")" sr="$(median "${small_r[@]}")"
fw="$(median "${fio_w[@]}")" fr="$(median "${fio_r[@]}")"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
rw="$(ratio "$mw" "$fw")" rr="$(ratio "$mr" "$fr")"
srw="$(ratio "$sw" "$fw")" srr="$(ratio "$sr" "$fr")"
verdict() { awk -v r="$1" 'BEGIN {print (r >= 0.9 ? "pass (>= 0.9)" : "below 0.9")}'; }
fs="$(df -PT "$dir" | awk 'NR == 2 {print $2 " on " $1}')"
join() { local IFS=,; echo "$*"; }

report="$(cat <<EOF
## NVMe swapper vs fio: block size $bs, queue depth $qd, $total_mib MiB in keys of $key_mib MiB, median of $repeat rounds

directory: $dir ($fs), swapper O_DIRECT: $direct, $(date -u +%Y-%m-%d)
reference: fio --ioengine=io_uring --direct=1 --bs=$bs --iodepth=$qd --rw=write|read --size=${total_mib}M (one fresh file per round)

| | write GB/s | read GB/s | write / fio | read / fio |
|---|---:|---:|---:|---:|
| swapper, AlignedBuffer (huge pages) | $(printf '%.3f' "$mw") | $(printf '%.3f' "$mr") | $rw ($(verdict "$rw")) | $rr ($(verdict "$rr")) |
| swapper, 4 KiB pages | $(printf '%.3f' "$sw") | $(printf '%.3f' "$sr") | $srw ($(verdict "$srw")) | $srr ($(verdict "$srr")) |
| fio (reference) | $(printf '%.3f' "$fw") | $(printf '%.3f' "$fr") | 1 | 1 |

rounds (GB/s): swapper write $(join "${ours_w[@]}"); 4 KiB pages write $(join "${small_w[@]}"); fio write $(join "${fio_w[@]}"); swapper read $(join "${ours_r[@]}"); 4 KiB pages read $(join "${small_r[@]}"); fio read $(join "${fio_r[@]}")
EOF
)"
echo
echo "$report"
printf '# NVMe swapper benchmark\n\nCommand: `%s`\n\n%s\n' \
  "BS=$bs QD=$qd TOTAL_MIB=$total_mib KEY_MIB=$key_mib REPEAT=$repeat bash bench/run_nvme_swapper.sh $build${2:+ $2}" \
  "$report" >"$results/nvme_swapper.md"
echo
echo "wrote $results/nvme_swapper.md"
