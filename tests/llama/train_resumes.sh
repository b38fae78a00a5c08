#!/usr/bin/env bash
# zero-llama train fine-tunes a Hugging Face Llama fixture on 2 ranks and
# resumes exactly: 6 steps in one run against 4 steps, --save, and a run
# that --load's the checkpoint and goes on to step 6. Steps 5 and 6 must
# print the same loss, gradient norm and lr, digit for digit, and the
# losses must fall (the fine-tuning learns).
# Usage: train_resumes.sh ZERO_RUN ZERO_LLAMA FIXTURE TOKENS CONFIG WORK
set -euo pipefail
zero_run="$1" llama="$2" fixture="$3" tokens="$4" config="$5" work="$6"
rm -rf "$work" && mkdir -p "$work"
run() { "$zero_run" --nproc 2 "$llama" train --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 "$@" |
  sed -n 's/^\[rank 0\] \(step .*\)/\1/p'; }
run --steps 6 > "$work/whole.txt"
run --steps 4 --save "$work/ckpt" > "$work/first.txt"
run --steps 6 --load "$work/ckpt" > "$work/resumed.txt"
cat "$work/whole.txt"
if ! diff <(sed -n 5,6p "$work/whole.txt") "$work/resumed.txt"; then
  echo "FAIL: the resumed steps 5-6 (right) differ from the uninterrupted run's (left)"
  exit 1
fi
diff <(sed -n 1,4p "$work/whole.txt") "$work/first.txt" > /dev/null || { echo "FAIL: the first 4 steps differ between runs"; exit 1; }
first="$(sed -n '1s/.* loss \([^ ]*\) .*/\1/p' "$work/whole.txt")" last="$(sed -n '6s/.* loss \([^ ]*\) .*/\1/p' "$work/whole.txt")"
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else f'FAIL: the loss went from {sys.argv[1]} to {sys.argv[2]}')" "$first" "$last"
echo "resumed at step 4: steps 5-6 identical; loss $first -> $last"
