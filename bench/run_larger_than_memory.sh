#!/usr/bin/env bash
# Larger than memory: trains a GPT whose training state is R times this
# machine's RAM on 2 CPU ranks, at stage 3 with offload_param and
# offload_optimizer on NVMe and activation checkpointing (bench/
# larger_than_memory.cpp). The disk's sequential bandwidth is measured
# first with fio (O_DIRECT, 1 MiB requests), for the I/O bound.
# Usage: bench/run_larger_than_memory.sh [build dir] --state-vs-ram R --steps N [--nvme DIR]
#   e.g. bench/run_larger_than_memory.sh build --state-vs-ram 2 --steps 3 --nvme /local_nvme/zero
# Environment: NPROC (ranks, default 2), RESULTS (default bench/results).
# --nvme defaults to <build dir>/larger_than_memory_nvme. The last line
# printed is the run's JSON, with zero-config --estimate's prediction of its
# host and NVMe bytes per rank beside what it measured; it is also appended
# to $RESULTS/larger_than_memory.jsonl (the config it ran:
# $RESULTS/larger_than_memory.ds_config.json).
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
nvme="$build/larger_than_memory_nvme"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nvme) nvme="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
mkdir -p "$nvme"
if ! command -v fio > /dev/null; then
  echo "run_larger_than_memory.sh: fio measures the disk's bandwidth for the I/O bound; install it (apt-get install fio)" >&2
  exit 2
fi
bandwidth() {  # $1: read | write; bytes per second, from fio's JSON
  fio --name=disk --directory="$nvme" --rw="$1" --bs=1M --direct=1 --ioengine=libaio --iodepth=8 --size=1G \
      --output-format=json 2> /dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(int(j['$1']['bw_bytes']))"
}
write_bps="$(bandwidth write)"
read_bps="$(bandwidth read)"
rm -f "$nvme"/disk.*
echo "disk under $nvme: read $((read_bps / 1000000)) MB/s, write $((write_bps / 1000000)) MB/s (fio, O_DIRECT, 1 MiB)" >&2
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); $(nproc) cores; kernels: $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo AVX2)" >&2
config="$results/larger_than_memory.ds_config.json"
"$build/tools/launcher/zero-run" --nproc "${NPROC:-2}" "$build/bench/bench_larger_than_memory" --nvme "$nvme" \
  --disk-read-bps "$read_bps" --disk-write-bps "$write_bps" --out "$results/larger_than_memory.jsonl" \
  --config-out "$config" "${args[@]}"

# The estimate of the same config and model (zero-config --estimate, CPU
# ranks) against what the run measured: host memory per rank (the model
# states, the gathered units and the activations) and NVMe files per rank.
run_json="$(tail -n 1 "$results/larger_than_memory.jsonl")"
shape="$(python3 -c "import json,sys; m=json.loads(sys.argv[1])['model']; print(' '.join('--%s %d' % (k, m[k]) for k in ('micro','context','width','depth','heads','vocab')))" "$run_json")"
# shellcheck disable=SC2086  # $shape is a list of flags
estimate="$("$build/tools/config/zero-config" "$config" --estimate --world-size "${NPROC:-2}" --cpu-ranks $shape --json)"
merged="$(python3 - "$run_json" "$estimate" << 'EOF_PY'
import json, sys
run, est = json.loads(sys.argv[1]), json.loads(sys.argv[2])
row = next(r for r in est["stages"] if r["selected"])
host = row["host"]["total"] + row["gathered_params_max"] + est["activations"]["configured"]
nvme = row["nvme"]["total"]
run["estimate_host_bytes_per_rank"] = host
run["estimate_nvme_bytes_per_rank"] = nvme
run["estimate_host_ratio"] = host / run["host_bytes_per_rank"]
run["estimate_nvme_ratio"] = nvme / run["nvme_bytes_per_rank"] if run["nvme_bytes_per_rank"] else None
print("estimate (zero-config --estimate --cpu-ranks): host %.2f GB, NVMe %.2f GB per rank; "
      "measured %.2f and %.2f GB: ratios %.3f and %.3f" % (host / 1e9, nvme / 1e9, run["host_bytes_per_rank"] / 1e9,
      run["nvme_bytes_per_rank"] / 1e9, run["estimate_host_ratio"], run["estimate_nvme_ratio"] or 0), file=sys.stderr)
print(json.dumps(run, sort_keys=True))
EOF_PY
)"
# The run's line in the results, with the estimate beside it.
sed -i '$d' "$results/larger_than_memory.jsonl"
echo "$merged" >> "$results/larger_than_memory.jsonl"
echo "$merged"  # the run's JSON, last
