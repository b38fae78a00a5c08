#!/usr/bin/env bash
# zero-llama train against transformers + DeepSpeed (bench/llama_peer.py) on
# one ds_config, the same Hugging Face weights and the same batches, 2 CPU
# ranks: every step's loss within TOLERANCE (relative, 1e-5) and gradient
# norm within NORM_TOLERANCE (1e-4; the two Adam kernels round differently,
# see tests/peers/same_curve.sh).
# PEER_CONFIG gives DeepSpeed another config with the same global batch and
# optimizer (zero's layout with pipeline stages, DeepSpeed's without).
# NPROC: ranks on each side (2). With "sequence_parallel_size" in the
# config, DeepSpeed runs its own Ulysses (bench/llama_peer.py says how).
# NORM_SCALE: DeepSpeed's norm is divided by it before the comparison. At
# ZeRO stages 0-2 with sequence parallelism P, DeepSpeed 0.19.8 averages
# gradients over the data-parallel ranks only, not sp x dp as its stage 3
# does (deepspeedai/DeepSpeed#5248): its gradients, and so their norm, are
# P times one process's, which zero's equal; clipping and Adam take out
# the factor, so the losses still agree.
# Usage: same_curve.sh ZERO_RUN ZERO_LLAMA PYTHON FIXTURE TOKENS CONFIG STEPS WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import deepspeed and transformers.
set -euo pipefail
zero_run="$1" llama="$2" python="$3" fixture="$4" tokens="$5" config="$6" steps="$7" work="$8"
tolerance="${TOLERANCE:-1e-5}" norm_tolerance="${NORM_TOLERANCE:-1e-4}" peer_config="${PEER_CONFIG:-$6}" nproc="${NPROC:-2}" norm_scale="${NORM_SCALE:-1}"
here="$(cd "$(dirname "$0")" && pwd)"
# CPU ranks whatever the shell exports (the peer scripts only default it).
export DS_ACCELERATOR=cpu
if ! why="$("$python" -c "import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import deepspeed, transformers" 2>&1)"; then
  echo "SKIPPED: $python cannot import deepspeed and transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$zero_run" --nproc "$nproc" "$llama" train --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 --steps "$steps" |
  sed -n 's/^\[rank 0\] \(step .*\)/\1/p' > "$work/zero.txt"
"$zero_run" --nproc "$nproc" "$python" "$here/../../bench/llama_peer.py" --hf-dir "$fixture" --config "$peer_config" \
  --tokens "$tokens" --ctx 16 --steps "$steps" --out "$work/deepspeed.json"
"$python" - "$work/zero.txt" "$work/deepspeed.json" "$tolerance" "$norm_tolerance" "$norm_scale" << 'EOF_PY'
import json, sys
zero = [dict(zip(l.split()[0::2], l.split()[1::2])) for l in open(sys.argv[1]) if l.strip()]
ds, tol, norm_tol = json.load(open(sys.argv[2])), float(sys.argv[3]), float(sys.argv[4])
ds["grad_norms"] = [n / float(sys.argv[5]) for n in ds["grad_norms"]]
print(f"zero-llama train against transformers {ds['transformers']} + DeepSpeed {ds['deepspeed']}, {ds['world']} ranks")
worst = worst_norm = 0.0
for i, (z, a, na) in enumerate(zip(zero, ds["losses"], ds["grad_norms"])):
    l, n = float(z["loss"]), float(z["grad_norm"])
    rl, rn = abs(l - a) / abs(a), abs(n - na) / abs(na)
    worst, worst_norm = max(worst, rl), max(worst_norm, rn)
    print(f"{i + 1:>4} {l:>12.7f} {a:>12.7f} {rl:>9.1e} {n:>12.7f} {na:>12.7f} {rn:>9.1e}")
if len(zero) != len(ds["losses"]) or worst > tol or worst_norm > norm_tol:
    sys.exit(f"FAIL: {len(zero)} steps against {len(ds['losses'])}; largest relative differences {worst:.2e} "
             f"(losses, tolerance {tol:g}), {worst_norm:.2e} (norms, tolerance {norm_tol:g})")
print(f"the same curve: {worst:.2e} (losses), {worst_norm:.2e} (norms)")
EOF_PY
