#!/usr/bin/env bash
# `zero-run config` writes a launch config that zero-run and the Accelerator
# read: write one for 2 ranks at stage 3, check that it is not overwritten
# without --force, then train with it.
#   config_command.sh ZERO_RUN PROGRAM WORK
set -euo pipefail
run=$1 program=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
file="$work/launch.yaml"
"$run" config --output "$file" --num-processes 2 --zero-stage 3 --gradient-accumulation-steps 2
grep -q '^distributed_type: DEEPSPEED$' "$file" || { echo "FAIL: no DEEPSPEED in"; cat "$file"; exit 1; }
grep -q '^  zero_stage: 3$' "$file" || { echo "FAIL: no zero_stage 3 in"; cat "$file"; exit 1; }
cp "$file" "$work/before.yaml"
if "$run" config --output "$file" --num-processes 4 2>"$work/refused.txt"; then
  echo "FAIL: an existing file was overwritten without --force"; exit 1
fi
grep -q "exists and is kept" "$work/refused.txt" || { echo "FAIL: no reason given"; cat "$work/refused.txt"; exit 1; }
cmp -s "$file" "$work/before.yaml" || { echo "FAIL: the file changed"; exit 1; }
"$run" --config-file "$file" "$program" parity | tee "$work/parity.txt"
grep -q "parity: 2 rank(s), stage 3, accumulation 2" "$work/parity.txt"
