#!/usr/bin/env bash
# Checkpoint save/load throughput per rank against plain sequential
# write()+fsync / read() of the same bytes in the same folder, same run
# (bench/checkpoint_io.cpp says exactly what is timed).
# Usage: bench/run_checkpoint_io.sh [build dir] [bench_checkpoint_io options...]
#   e.g. bench/run_checkpoint_io.sh build --dir /mnt/nvme/tmp --reps 7
# Environment: NPROC (ranks, default 2), VARIANTS (default "2:fp32 2:bf16":
# stage:dtype pairs, one run each), RESULTS (default bench/results).
# Writes $RESULTS/checkpoint_io.md: the command, the date and one table per
# variant; anything after the line "<!-- kept by run_checkpoint_io.sh -->"
# in an existing file (notes written by hand) is kept.
# Always exits 0 when the runs complete: the 0.8 goal is information.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
out="$results/checkpoint_io.md"
marker="<!-- kept by run_checkpoint_io.sh -->"
kept=""
if [ -f "$out" ] && grep -qF -- "$marker" "$out"; then
  kept="$(sed -n "/^$marker\$/,\$p" "$out")"
fi
nproc_ranks="${NPROC:-2}"
bin="$build/bench/bench_checkpoint_io"
tables="$(mktemp)"
trap 'rm -f "$tables"' EXIT
for variant in ${VARIANTS:-2:fp32 2:bf16}; do
  stage="${variant%%:*}"
  dtype="${variant##*:}"
  cmd=("$build/tools/launcher/zero-run" --nproc "$nproc_ranks" "$bin" --stage "$stage" --dtype "$dtype" "$@")
  echo "\$ ${cmd[*]}"
  # Engine info lines (one per save/load) would drown the table.
  run_out="$(ZERO_LOG_LEVEL=warn "${cmd[@]}" 2>&1 | sed -e 's/^\[rank 0\] //' | tee /dev/stderr)"
  {
    echo "## stage $stage, $dtype, $nproc_ranks ranks"
    echo
    echo '```'
    echo "\$ ${cmd[*]}"
    grep -v '^|' <<<"$run_out" | grep -v '^$' || true
    echo '```'
    echo
    grep '^|' <<<"$run_out" || true
    echo
  } >>"$tables"
done
{
  echo "# checkpoint_io: save/load throughput per rank against plain file I/O"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -r)), folder file system: $(df -PT "${build}" | awk 'NR==2 {print $2}'),"
  echo "with \`NPROC=$nproc_ranks VARIANTS=\"${VARIANTS:-2:fp32 2:bf16}\" bash bench/run_checkpoint_io.sh $build${*:+ $*}\`."
  echo "MB = 1e6 bytes; each time is the slowest rank's, median over the repetitions;"
  echo "ratio = reference time / engine time (same bytes); goal 0.8 (information only)."
  echo
  cat "$tables"
  if [ -n "$kept" ]; then
    echo
    echo "$kept"
  fi
} >"$out"
echo "wrote $out"
