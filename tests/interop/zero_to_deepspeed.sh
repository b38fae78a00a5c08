#!/usr/bin/env bash
# A run that zero trained, continued by DeepSpeed: zero trains STEPS steps
# from scratch on WORLD ranks and saves; zero resumes its own checkpoint
# for RESUME more steps; the checkpoint is exported with zero-ckpt export
# --to deepspeed for DS_WORLD ranks at stage DS_STAGE (CONFIG otherwise,
# the micro-batch rescaled to keep the global batch), and DeepSpeed
# 0.19 (bench/deepspeed_peer.py --load) resumes it for the same steps on
# the same data. Every loss must agree within TOLERANCE (relative, 1e-5:
# the two sides' Adam kernels round differently, as in
# tests/peers/same_curve.sh), gradient norms within NORM_TOLERANCE (1e-4).
# Usage: zero_to_deepspeed.sh ZERO_RUN DEEPSPEED_TRAIN ZERO_CKPT PYTHON CONFIG NAME_MAP WORLD DS_WORLD DS_STAGE WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import deepspeed.
set -euo pipefail
zero_run="$1" train="$2" zero_ckpt="$3" python="$4" config="$5" name_map="$6" world="$7" ds_world="$8" ds_stage="$9"
work="${10}"
tolerance="${TOLERANCE:-1e-5}" norm_tolerance="${NORM_TOLERANCE:-1e-4}" steps=3 resume=5
shape=(--vocab 29 --context 15 --width 10 --depth 1 --heads 2)
here="$(cd "$(dirname "$0")" && pwd)"
# CPU ranks whatever the shell exports (the peer scripts only default it).
export DS_ACCELERATOR=cpu
if ! why="$("$python" -c "import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import deepspeed" 2>&1)"; then
  echo "SKIPPED: $python cannot import deepspeed (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
ds_config="$work/ds_config.json"
"$python" - "$config" "$ds_config" "$world" "$ds_world" "$ds_stage" << 'EOF_PY'
import json, sys
config, world, ds_world = json.load(open(sys.argv[1])), int(sys.argv[3]), int(sys.argv[4])
config["train_micro_batch_size_per_gpu"] = config["train_micro_batch_size_per_gpu"] * world // ds_world
config["zero_optimization"] = {"stage": int(sys.argv[5]), "stage3_param_persistence_threshold": 0}
json.dump(config, open(sys.argv[2], "w"), indent=1)
EOF_PY
"$zero_run" --nproc "$world" "$train" --config "$config" --out "$work/first.json" --steps "$steps" --save "$work/zero" "${shape[@]}"
"$zero_run" --nproc "$world" "$train" --config "$config" --out "$work/zero.json" --steps "$resume" --load "$work/zero" "${shape[@]}"
"$zero_ckpt" export --to deepspeed "$work/zero" "$work/deepspeed" --config "$ds_config" --world-size "$ds_world" \
  --name-map "$name_map"
(cd "$here/../../bench" && "$zero_run" --nproc "$ds_world" "$python" deepspeed_peer.py --config "$ds_config" \
  --load "$work/deepspeed" --out "$work/deepspeed.json" --steps "$resume" --threads 1 "${shape[@]}")
"$python" - "$work/zero.json" "$work/deepspeed.json" "$tolerance" "$norm_tolerance" << 'EOF_PY'
import json, sys
zero, ds, tol, norm_tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3]), float(sys.argv[4])
print(f"zero resuming itself against DeepSpeed {ds['deepspeed']} resuming zero's export on {ds['world']} ranks")
worst = worst_norm = 0.0
for i, (a, b) in enumerate(zip(zero["losses"], ds["losses"])):
    na, nb = zero["grad_norms"][i], ds["grad_norms"][i]
    rl, rn = abs(a - b) / max(abs(b), 1e-12), abs(na - nb) / max(abs(nb), 1e-12)
    worst, worst_norm = max(worst, rl), max(worst_norm, rn)
    print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rl:>9.1e} {na:>12.7f} {nb:>12.7f} {rn:>9.1e}")
if len(zero["losses"]) != len(ds["losses"]) or worst > tol or worst_norm > norm_tol:
    sys.exit(f"FAIL: largest relative differences {worst:.2e} (losses, tolerance {tol:g}), "
             f"{worst_norm:.2e} (norms, tolerance {norm_tol:g})")
print(f"the same curve: {worst:.2e} (losses), {worst_norm:.2e} (norms)")
EOF_PY
