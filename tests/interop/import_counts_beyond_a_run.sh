#!/usr/bin/env bash
# A DeepSpeed checkpoint whose counters no run reaches (global_steps 2^62,
# written by torch.save as DeepSpeed would write any integer) is refused by
# `zero-ckpt import` naming the file and the counter, before any arithmetic
# on it, and leaves no output folder.
# Usage: import_counts_beyond_a_run.sh ZERO_CKPT PYTHON FIXTURE WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import torch.
set -euo pipefail
zero_ckpt="$1" python="$2" fixture="$3" work="$4"
if ! why="$("$python" -c "import torch" 2>&1)"; then
  echo "SKIPPED: $python cannot import torch (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
cp -r "$fixture/ckpt" "$work/ckpt"
tag=$(cat "$work/ckpt/latest")
for steps in 4611686018427387904 9007199254740993; do  # 2^62, and 2^53 + 1
  "$python" - "$work/ckpt/$tag/mp_rank_00_model_states.pt" "$steps" << 'EOF_PY'
import sys
import torch
path, steps = sys.argv[1], int(sys.argv[2])
state = torch.load(path, weights_only=True)
state["global_steps"] = steps
torch.save(state, path)
EOF_PY
  if "$zero_ckpt" import --from deepspeed "$work/ckpt" "$work/out" > "$work/out.log" 2>&1; then
    echo "FAIL: global_steps $steps was imported"; exit 1
  fi
  grep -q "mp_rank_00_model_states.pt: global_steps $steps x gradient_accumulation_steps 1 is beyond 2^53 micro steps" "$work/out.log" \
    || { echo "FAIL: global_steps $steps: not named:"; cat "$work/out.log"; exit 1; }
  [ ! -e "$work/out" ] || { echo "FAIL: global_steps $steps left $work/out"; exit 1; }
  echo "global_steps $steps refused: $(tail -1 "$work/out.log")"
done
