#!/usr/bin/env bash
# Step time, minor page faults, peak RSS and bytes per step at ZeRO stages
# 0-3 on 2 and 4 local CPU ranks, against PyTorch DDP over gloo on the same
# model (bench/ddp_peer.py; and PyTorch FSDP2 when the peers' torch has it,
# >= 2.6), stage 0, and plain single-process LibTorch and
# PyTorch loops, and N plain LibTorch loops side by side with no
# communication (the floor for N ranks on these cores), all measured in this run with the same threads per process
# (cores / ranks). Everything starts through zero-run, so that every row
# runs with zero-run's allocator (tcmalloc when installed; ZERO_ALLOCATOR
# chooses another); DDP also runs with glibc's malloc, as users start it.
# Usage: bench/run_step_time.sh [build dir] [bench_step_time options...]
#   e.g. bench/run_step_time.sh build --depth 4 --width 512 --steps 6
# Environment: RANKS (default "2 4"), ROUNDS (default 3), RESULTS (default bench/results),
# PYTHON (default: the python of the build's torch, ZERO_TORCH_PYTHON in its
# CMakeCache.txt, else /usr/bin/python3 with Debian's python3-torch; see
# bench/peer_python.sh). Installs Debian's python3-torch for the PyTorch rows
# when that python lacks it (as root; otherwise the table is printed without
# them). tcmalloc comes with tools/setup-deps.sh.
# Writes $RESULTS/step_time.jsonl, prints one table per world size and keeps
# the tables in $RESULTS/step_time.md.
# Always exits 0 when the runs complete: the goals are information.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
source "$here/peer_python.sh"
peer_python "$build"
mkdir -p "$results"
lines="$results/step_time.jsonl"
rm -f "$lines"
cores=$(nproc)
bin="$build/bench/bench_step_time"
run="$build/tools/launcher/zero-run"

peer_check

# The bench's flags the Python peer understands too (the model and the loop).
peer_flags=()
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i += 2)); do
  case "${args[i]}" in
    --depth|--width|--heads|--context|--micro|--warmup|--steps) peer_flags+=("${args[i]}" "${args[i+1]}") ;;
  esac
done

# ROUNDS rounds of every row, alternating, so that the machine's drift
# reaches all rows alike; the report pools each row's steps over the rounds.
for round in $(seq "${ROUNDS:-3}"); do
  declare -A measured=()
  for n in ${RANKS:-2 4}; do
    threads=$(( cores / n )); [ "$threads" -ge 1 ] || threads=1
    if [ -z "${measured[$threads]:-}" ]; then
      "$run" --nproc 1 "$bin" --mode plain --threads "$threads" --out "$lines" "$@"
      measured[$threads]=1
      if [ "$peers" = 1 ]; then
        if [ "$round" = 1 ]; then
          read -r vocab params < <("$python" -c 'import json,sys; j=[json.loads(l) for l in open(sys.argv[1])][-1]; print(j["vocab"], j["params"])' "$lines")
          peer_flags+=(--vocab "$vocab" --expect-params "$params")
        fi
        "$run" --nproc 1 "$python" "$here/ddp_peer.py" --mode plain --threads "$threads" --out "$lines" "${peer_flags[@]}"
      fi
    fi
    "$run" --nproc "$n" "$bin" --mode plain --threads "$threads" --out "$lines" "$@"
    if [ "$peers" = 1 ]; then
      for allocator in "${ZERO_ALLOCATOR:-tcmalloc}" system; do
        "$run" --nproc "$n" --allocator "$allocator" "$python" "$here/ddp_peer.py" --mode ddp --threads "$threads" \
          --out "$lines" "${peer_flags[@]}"
      done
      # FSDP2 under zero-run's allocator only, as the stages run.
      if [ "$fsdp2" = 1 ]; then
        "$run" --nproc "$n" "$python" "$here/ddp_peer.py" --mode fsdp2 --threads "$threads" --out "$lines" "${peer_flags[@]}"
      fi
    fi
    for stage in 0 1 2 3; do
      "$run" --nproc "$n" "$bin" --mode engine --stage "$stage" --threads "$threads" --out "$lines" "$@"
    done
  done
  unset measured
done
for n in ${RANKS:-2 4}; do
  "$bin" --mode report --in "$lines" --world "$n" "$@"
done | tee "$results/step_time.md"
