#!/usr/bin/env bash
# save_state / load_state mid-epoch, through separate launches:
#   resume.sh ZERO_RUN PROGRAM CONFIGS WORK same|other
# same:  2 ranks with dropout on; a run stopped at micro-step 18 and resumed
#        must write exactly the lines (sample ids, losses as hex floats, the
#        final parameter checksum) of the run that never stopped.
# other: saved by 2 ranks, resumed by 4 (the same global batch): the same
#        sample ids in the same order, losses within 1e-5 relative (the sums
#        run in another order), no dropout (its masks depend on the rank).
set -euo pipefail
run=$1 program=$2 configs=$3 work=$4 mode=$5
rm -rf "$work" && mkdir -p "$work"
steps=30 save_at=18   # an epoch is 12 micro-steps; accumulation 2
if [ "$mode" = same ]; then
  dropout=0.2 second="$configs/resume_2ranks.yaml"
else
  dropout=0 second="$configs/resume_4ranks.yaml"
fi
"$run" --config-file "$configs/resume_2ranks.yaml" "$program" curve "$work/full.txt" $steps --dropout $dropout
"$run" --config-file "$configs/resume_2ranks.yaml" "$program" curve "$work/resumed.txt" $steps --dropout $dropout \
  --save-at $save_at "$work/ckpt"
"$run" --config-file "$second" "$program" curve "$work/resumed.txt" $steps --dropout $dropout --resume "$work/ckpt"
[ "$(wc -l < "$work/full.txt")" -eq $((steps + 1)) ] || { echo "FAIL: the full run wrote $(wc -l < "$work/full.txt") lines"; exit 1; }
if [ "$mode" = same ]; then
  if ! diff "$work/full.txt" "$work/resumed.txt"; then
    echo "FAIL: the resumed run differs from the run that never stopped"; exit 1
  fi
  echo "resumed bit-exactly: $(grep -c '^step' "$work/resumed.txt") micro-steps and the final checksum"
else
  # Python's float.fromhex reads the hex floats; ids must match exactly.
  /usr/bin/python3 - "$work/full.txt" "$work/resumed.txt" <<'PY'
import sys
full, resumed = (open(p).read().split("\n") for p in sys.argv[1:3])
worst = 0.0
for a, b in zip(full, resumed):
    if not a.startswith("step"):
        continue
    fa, fb = a.split(), b.split()
    if fa[:4] != fb[:4]:
        sys.exit(f"FAIL: different data after resuming at another world size:\n  {a}\n  {b}")
    la, lb = float.fromhex(fa[5]), float.fromhex(fb[5])
    worst = max(worst, abs(la - lb) / abs(la))
if len(full) != len(resumed):
    sys.exit(f"FAIL: {len(full)} lines against {len(resumed)}")
if worst >= 1e-5:
    sys.exit(f"FAIL: losses differ by {worst:.2e} relative")
print(f"resumed at another world size: same sample ids, worst relative loss difference {worst:.2e}")
PY
fi
