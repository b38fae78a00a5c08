#!/usr/bin/env bash
# zero and DeepSpeed on one ds_config, 2 CPU ranks: zero trains first and
# writes the weights it starts from; DeepSpeed (bench/deepspeed_peer.py)
# starts from them and sees the same batches. Every step's loss must agree
# within TOLERANCE (relative, 1e-5: the issue's fp32 bar) and every step's
# gradient norm within NORM_TOLERANCE (1e-4). The norm sums every
# parameter's gradient, and the two sides' Adam updates round differently
# in fp32 (zero's fused kernel, torch's addcdiv): with beta2 0.999 its
# differences grow to about 2e-5 over 20 steps while the losses stay
# within 2e-6; with beta2 0.95 both stay within 1e-6.
# In bf16 the bar is wider (the bf16 tests set it): the weights are rounded
# to 8 significant bits after every step, so a last-bit difference in an
# fp32 update flips a weight's rounding now and then, and the flips grow
# over the steps. DeepSpeed differs from itself that way: the same bf16
# config at stage 2 and at stage 3 gives losses up to 4.0e-3 apart over 20
# steps (gradient norms 9.3e-3), and with torch's Adam in place of its own
# 1.2e-3 (6.4e-3); zero's differ from DeepSpeed's by 1.9e-3 at stage 2 and
# 4.0e-3 at stage 3. So bf16 takes 1e-2 on losses and 3e-2 on norms over 20
# steps, and EARLY_TOLERANCE (3e-4) on the first EARLY_STEPS (3) losses,
# before the flips grow: there the two sides are within 1.1e-4 (stage 3,
# on the batches of sample-indexed rows; 1e-5 on the earlier batches).
# Usage: same_curve.sh ZERO_RUN DEEPSPEED_TRAIN PYTHON CONFIG WORKDIR
# Exits 77 (skipped) with the reason when PYTHON cannot import deepspeed.
set -euo pipefail
zero_run="$1" train="$2" python="$3" config="$4" work="$5"
steps="${STEPS:-20}" tolerance="${TOLERANCE:-1e-5}" norm_tolerance="${NORM_TOLERANCE:-1e-4}"
early_steps="${EARLY_STEPS:-0}" early_tolerance="${EARLY_TOLERANCE:-$tolerance}"
here="$(cd "$(dirname "$0")" && pwd)"
peer="$here/../../bench/deepspeed_peer.py"
# CPU ranks whatever the shell exports (deepspeed_peer.py only defaults it).
export DS_ACCELERATOR=cpu
if ! why="$("$python" -c "import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import deepspeed" 2>&1)"; then
  echo "SKIPPED: $python cannot import deepspeed (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel, or set ZERO_PEER_PYTHON"
  exit 77
fi
# bf16 compares like with like: with Debian's LibTorch 1.13 against the
# peer's torch 2.x the bf16 kernels themselves round differently (8.8e-4
# apart in the losses by step 2, 0.13 in the norms), beyond the bar.
if [ -n "${SAME_TORCH:-}" ]; then
  peer_torch="$("$python" -c "import torch; print(torch.__version__.split('+')[0])")"
  if [ "${peer_torch%.*}" != "${SAME_TORCH%.*}" ]; then
    echo "SKIPPED: zero is built against LibTorch $SAME_TORCH and the peer runs torch $peer_torch; the bf16 bar holds between the same torch (ZERO_TORCH=wheel builds run it)"
    exit 77
  fi
fi
rm -rf "$work" && mkdir -p "$work"
"$zero_run" --nproc 2 "$train" --config "$config" --weights-out "$work/init.safetensors" --out "$work/zero.json" \
  --steps "$steps"
"$zero_run" --nproc 2 "$python" "$peer" --config "$config" --weights "$work/init.safetensors" \
  --out "$work/deepspeed.json" --steps "$steps" --threads 1
"$python" - "$work/zero.json" "$work/deepspeed.json" "$tolerance" "$config" "$norm_tolerance" "$early_steps" "$early_tolerance" << 'EOF_PY'
import json, sys
zero, ds, tol, norm_tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3]), float(sys.argv[5])
early_steps, early_tol = int(sys.argv[6]), float(sys.argv[7])
print(f"{sys.argv[4]}: DeepSpeed {ds['deepspeed']}, torch {ds['torch']}, {ds['world']} ranks x {ds['threads']} thread")
print(f"{'step':>4} {'zero loss':>12} {'DeepSpeed':>12} {'rel':>9} {'zero norm':>12} {'DeepSpeed':>12} {'rel':>9}")
worst = worst_norm = worst_early = 0.0
for i, (a, b) in enumerate(zip(zero["losses"], ds["losses"])):
    na, nb = zero["grad_norms"][i], ds["grad_norms"][i]
    rl = abs(a - b) / max(abs(b), 1e-12)
    rn = abs(na - nb) / max(abs(nb), 1e-12) if nb is not None else float("inf")
    worst, worst_norm = max(worst, rl), max(worst_norm, rn)
    if i < early_steps:
        worst_early = max(worst_early, rl)
    print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rl:>9.1e} {na:>12.7f} {nb if nb is not None else float('nan'):>12.7f} {rn:>9.1e}")
if len(zero["losses"]) != len(ds["losses"]):
    sys.exit(f"FAIL: zero ran {len(zero['losses'])} steps, DeepSpeed {len(ds['losses'])}")
if worst_early > early_tol:
    sys.exit(f"FAIL: over the first {early_steps} steps the losses differ by up to {worst_early:.2e} "
             f"(tolerance {early_tol:g})")
if worst > tol or worst_norm > norm_tol:
    sys.exit(f"FAIL: the largest relative differences are {worst:.2e} (losses, tolerance {tol:g}) and "
             f"{worst_norm:.2e} (gradient norms, tolerance {norm_tol:g})")
print(f"the same curve: largest relative differences {worst:.2e} in the losses (tolerance {tol:g}), "
      f"{worst_norm:.2e} in the gradient norms (tolerance {norm_tol:g})")
EOF_PY
