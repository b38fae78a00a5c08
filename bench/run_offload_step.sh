#!/usr/bin/env bash
# Offload step: time per step split into forward, backward, reduce, step
# (host kernels, NVMe waits, the rest: the gradient copy to the host
# optimizer, norm, clip) and gather, for stage 2/3 with offload_optimizer
# cpu/nvme and offload_param nvme, against the same stage without offload,
# all variants in one run on 2 local ranks (same model, same batches).
# Usage: bench/run_offload_step.sh [build dir] [bench_offload_step options...]
#   e.g. bench/run_offload_step.sh build --dtype both --nvme /local_nvme/zero
#        bench/run_offload_step.sh build --variants s3,s3-opt-nvme --steps 4
# Environment: NPROC (ranks, default 2), RESULTS (default bench/results).
# nvme_path defaults to <build dir>/offload_step_nvme (--nvme DIR changes it:
# point it at the drive you would offload to).
# Prints the tables and keeps them, with the command, in $RESULTS/offload_step.md.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
nproc_ranks="${NPROC:-2}"
mkdir -p "$results"
out="$results/offload_step.md"
tables="$(mktemp)"
trap 'rm -f "$tables"' EXIT
cmd=("$build/tools/launcher/zero-run" --nproc "$nproc_ranks" "$build/bench/bench_offload_step" --out "$tables" "$@")
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
"${cmd[@]}"   # the launcher prefixes each line with its rank; rank 0 also writes the plain tables
{
  echo "# Offload step"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) core(s), $(( $(date +%s) - start )) s in all (load average"
  echo "before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)); CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-);"
  echo "the fused optimizer's kernels: $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo AVX2) (chosen at run time"
  echo "for this CPU, the same in every variant); with:"
  echo
  echo '```sh'
  echo "bash bench/run_offload_step.sh $build${*:+ $*}"
  echo "# i.e. ${cmd[*]/$tables/TABLES.md}"
  echo '```'
  cat "$tables"
} > "$out"
echo
cat "$out"
