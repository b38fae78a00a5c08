#!/usr/bin/env bash
# zero beside DeepSpeed on one ds_config file per row (bench/vs_deepspeed.py
# writes them): ZeRO stages 0-3, offload_optimizer cpu at stages 2 and 3, and
# NVMe at stage 3 where DeepSpeed's async I/O op builds here; at 2 and 4
# ranks x 1 thread on the 42.6 M GPT (depth 6, width 768, context 64, micro
# 2). Per row: step time, peak RSS per rank and bytes sent per rank per step
# on both sides; at stage 3 also the time to save and load a checkpoint.
# PyTorch DDP and FSDP2 rows (bench/ddp_peer.py) and the plain single-process
# loops (LibTorch and PyTorch) run in the same rounds; every side's overhead
# is its step less its own framework's plain loop.
#
# Usage: bench/run_vs_deepspeed.sh [build dir, default build-wheel]
# Environment: RANKS (default "2 4"), ROUNDS (default 3), STEPS (measured
# steps per run, default 5), WARMUP (default 2), RESULTS (default
# bench/results), PYTHON (default: the python of the build's torch, the
# .venv of ZERO_TORCH=wheel; bench/peer_python.sh).
# The build must use the same torch as that python (ZERO_TORCH=wheel), so
# that both sides compute with the same BLAS kernels; the table names them.
# Writes $RESULTS/vs_deepspeed.jsonl, the tables to $RESULTS/vs_deepspeed.md
# and DeepSpeed's profile at stages 0 and 3 to $RESULTS/vs_deepspeed_profile.txt.
# Exits 1 with one line when deepspeed cannot be imported: no table is
# printed with a side missing.
set -euo pipefail
build="${1:-build-wheel}"
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
source "$here/peer_python.sh"
peer_python "$build"
peer_require run_vs_deepspeed.sh deepspeed
bin="$build/bench/bench_step_time"
run="$build/tools/launcher/zero-run"
[ -x "$bin" ] || { echo "run_vs_deepspeed.sh: $bin is missing; build it (ZERO_TORCH=wheel bash tools/build.sh)" >&2; exit 1; }
peer_check
mkdir -p "$results"
lines="$results/vs_deepspeed.jsonl"
rm -f "$lines"
work="$(mktemp -d "${TMPDIR:-/tmp}/vs_deepspeed.XXXXXX")"
trap 'rm -rf "$work"' EXIT
shape=(--depth 6 --width 768 --heads 12 --context 64)
timing=(--warmup "${WARMUP:-2}" --steps "${STEPS:-5}" --threads 1)

# NVMe rows only where DeepSpeed's async I/O builds: otherwise one line says why.
nvme=()
if aio="$(DS_ACCELERATOR=cpu "$python" -c '
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("AsyncIOBuilder")
if builder is None:
    raise SystemExit(f"the {get_accelerator().device_name()} accelerator has no AsyncIOBuilder")
if not builder.is_compatible(verbose=False):
    raise SystemExit("AsyncIOBuilder is not compatible here (libaio-dev missing?)")
builder.load(verbose=False)' 2>&1)"; then
  mkdir -p "$work/nvme"
  nvme=(--nvme "$work/nvme")
else
  echo "note: DeepSpeed's async I/O does not build here (${aio##*$'\n'}): the NVMe rows are left out" >&2
fi
mapfile -t rows < <("$python" "$here/vs_deepspeed.py" configs "$work/configs" "${nvme[@]}")

# The plain loops give the Python model its vocabulary and check the counts agree.
"$run" --nproc 1 "$bin" --mode plain --out "$lines" "${shape[@]}" "${timing[@]}"
read -r vocab params < <("$python" -c 'import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][-1]; print(j["vocab"], j["params"])' "$lines")
peer_shape=("${shape[@]}" --vocab "$vocab" --expect-params "$params")

# ROUNDS rounds of every row, alternating, so that the machine's drift
# reaches all rows alike; the report pools each row's steps over the rounds.
for round in $(seq "${ROUNDS:-3}"); do
  [ "$round" = 1 ] || "$run" --nproc 1 "$bin" --mode plain --out "$lines" "${shape[@]}" "${timing[@]}"
  "$run" --nproc 1 "$python" "$here/ddp_peer.py" --mode plain --out "$lines" "${peer_shape[@]}" "${timing[@]}"
  for n in ${RANKS:-2 4}; do
    "$run" --nproc "$n" "$python" "$here/ddp_peer.py" --mode ddp --out "$lines" "${peer_shape[@]}" "${timing[@]}"
    [ "$fsdp2" = 0 ] || "$run" --nproc "$n" "$python" "$here/ddp_peer.py" --mode fsdp2 --out "$lines" "${peer_shape[@]}" "${timing[@]}"
    for row in "${rows[@]}"; do
      config="$work/configs/$row.json"
      zero_ckpt=() ds_ckpt=()
      if [ "$row" = stage3 ]; then zero_ckpt=(--checkpoint "$work/ckpt-zero") ds_ckpt=(--checkpoint "$work/ckpt-ds"); fi
      "$run" --nproc "$n" "$bin" --mode engine --config "$config" --label "$row" --out "$lines" \
        "${shape[@]}" "${timing[@]}" "${zero_ckpt[@]}"
      "$run" --nproc "$n" "$python" "$here/deepspeed_peer.py" --config "$config" --label "$row" --bench "$lines" \
        --out /dev/null "${peer_shape[@]}" "${timing[@]}" "${ds_ckpt[@]}"
      for side in zero ds; do
        if [ -d "$work/ckpt-$side" ]; then
          echo "{\"bench\": \"disk\", \"side\": \"${side/ds/deepspeed}\", \"world\": $n, \"bytes\": $(du -sb "$work/ckpt-$side" | cut -f1)}" >> "$lines"
          rm -rf "$work/ckpt-$side"
        fi
      done
    done
  done
done
# Where DeepSpeed's step goes: rank 0's profile of stage 0 and stage 3 at the
# first world size, one more run each outside the table.
profile="$results/vs_deepspeed_profile.txt"
: > "$profile"
for row in stage0 stage3; do
  "$run" --nproc "$(echo ${RANKS:-2 4} | cut -d' ' -f1)" "$python" "$here/deepspeed_peer.py" --config "$work/configs/$row.json" \
    --label "$row" --bench "$work/profiled.jsonl" --profile "$work/profile.txt" --out /dev/null "${peer_shape[@]}" "${timing[@]}"
  cat "$work/profile.txt" >> "$profile"
done
"$python" "$here/vs_deepspeed.py" report "$lines" | tee "$results/vs_deepspeed.md"
