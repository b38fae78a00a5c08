#!/usr/bin/env bash
# Every shipped config runs the main job briefly on 2 CPU ranks: it trains
# to the end, or it is refused with one line per rank that says what to use
# instead; never a C++ frame dump.
# Usage: every_config.sh ZERO_RUN ZERO_MAIN CONFIG_DIR
set -u
run=$1 main=$2 configs=$3
mkdir -p /tmp/zero_nvme  # nvme_path of configs/zero3_offload_nvme.json
failed=0
for config in "$configs"/*.json; do
  out=$(mktemp) err=$(mktemp)
  "$run" --nproc 2 "$main" --config "$config" --steps 2 --depth 1 --width 32 --context 16 --expect-learning 0 >"$out" 2>"$err"
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q "zero-main: validation loss" "$out"; then
    verdict="trains"
  elif grep -qE "frame #|Exception raised from|terminate called" "$err"; then
    verdict="FAILED: a frame dump"
  elif [ "$(grep -cE '^\[rank [01]\] zero-main: .*(instead| use )' "$err")" -ge 1 ]; then
    verdict="refused: $(grep -m1 -E '^\[rank [01]\] zero-main:' "$err")"
  else
    verdict="FAILED: exit $rc without a line that says what to use"
  fi
  echo "$(basename "$config"): $verdict"
  case "$verdict" in FAILED*) failed=1; sed 's/^/    /' "$err" | head -20 ;; esac
  rm -f "$out" "$err"
done
exit "$failed"
