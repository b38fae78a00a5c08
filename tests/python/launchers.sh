#!/usr/bin/env bash
# A Python training script under both launchers: `zero-run --nproc 2 python
# train.py` and `torchrun --nproc_per_node 2 train.py` train
# examples/python/train_llama.py (stage 3) to the same losses, digit for
# digit (the same ranks, data and weights; only the launcher differs).
# Usage: launchers.sh ZERO_RUN PYTHON PACKAGE_DIR CONFIG
# Exits 77 (skipped) with the reason when PYTHON has no transformers or torchrun.
set -euo pipefail
zero_run="$1" python="$2" package="$3" config="$4"
example="$(cd "$(dirname "$0")/../../examples/python" && pwd)/train_llama.py"
torchrun="$(dirname "$python")/torchrun"
if ! why="$("$python" -c "import transformers" 2>&1)" || [ ! -x "$torchrun" ]; then
  echo "SKIPPED: $python cannot import transformers or has no $torchrun (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"
by_zero_run="$("$zero_run" --nproc 2 "$python" "$example" --config "$config" --steps 4 | sed -n 's/^\[rank 0\] \(step .*\)/\1/p')"
by_torchrun="$("$torchrun" --standalone --nproc_per_node 2 "$example" --config "$config" --steps 4 2>/dev/null | grep '^step ')"
echo "zero-run:"; echo "$by_zero_run"; echo "torchrun:"; echo "$by_torchrun"
[ "$(echo "$by_zero_run" | wc -l)" = 4 ] || { echo "FAIL: zero-run's run printed no 4 steps"; exit 1; }
[ "$by_zero_run" = "$by_torchrun" ] || { echo "FAIL: the two launchers' runs differ"; exit 1; }
echo "the same 4 steps under zero-run and torchrun"
