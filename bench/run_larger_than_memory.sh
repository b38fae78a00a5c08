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
# printed is the run's JSON; it is also appended to $RESULTS/larger_than_memory.jsonl.
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
"$build/tools/launcher/zero-run" --nproc "${NPROC:-2}" "$build/bench/bench_larger_than_memory" --nvme "$nvme" \
  --disk-read-bps "$read_bps" --disk-write-bps "$write_bps" --out "$results/larger_than_memory.jsonl" "${args[@]}"
tail -n 1 "$results/larger_than_memory.jsonl"  # the run's JSON, without the launcher's rank prefix
