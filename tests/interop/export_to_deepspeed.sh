#!/usr/bin/env bash
# zero-ckpt export --to deepspeed, checked by DeepSpeed itself: a DeepSpeed
# fixture (tests/fixtures/deepspeed) is imported into zero's format, then
# exported for WORLD ranks, and
#  - DeepSpeed 0.19 (bench/deepspeed_peer.py --load) resumes the export on
#    WORLD ranks and must continue with the losses DeepSpeed gave resuming
#    the original folder (the fixture's resume.json): within TOLERANCE
#    (relative, 1e-5) and gradient norms within NORM_TOLERANCE (1e-4);
#  - DeepSpeed's zero_to_fp32 must consolidate the export to the weights
#    zero-ckpt consolidate gives, bit for bit.
# The round trip covers both directions, and the export at another world
# size (or stage: CONFIG_STAGE) the layouts import never sees.
# Usage: export_to_deepspeed.sh ZERO_RUN ZERO_CKPT PYTHON FIXTURE NAME_MAP WORLD WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import deepspeed.
set -euo pipefail
zero_run="$1" zero_ckpt="$2" python="$3" fixture="$4" name_map="$5" world="$6" work="$7"
tolerance="${TOLERANCE:-1e-5}" norm_tolerance="${NORM_TOLERANCE:-1e-4}" stage="${CONFIG_STAGE:-}"
here="$(cd "$(dirname "$0")" && pwd)"
# CPU ranks whatever the shell exports (the peer scripts only default it).
export DS_ACCELERATOR=cpu
if ! why="$("$python" -c "import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import deepspeed" 2>&1)"; then
  echo "SKIPPED: $python cannot import deepspeed (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$zero_ckpt" import --from deepspeed "$fixture/ckpt" "$work/imported" --name-map "$name_map"
"$python" - "$fixture/config.json" "$work/config.json" "$world" "$fixture/ckpt" "$stage" << 'EOF_PY'
import json, os, re, sys
config, world = json.load(open(sys.argv[1])), int(sys.argv[3])
tag = open(os.path.join(sys.argv[4], "latest")).read().strip()
saved = len([f for f in os.listdir(os.path.join(sys.argv[4], tag)) if re.match(r"(bf16_)?zero_pp_rank_\d+_mp_rank_00_optim", f)])
config["train_micro_batch_size_per_gpu"] = config["train_micro_batch_size_per_gpu"] * saved // world
if sys.argv[5]:
    config["zero_optimization"] = {"stage": int(sys.argv[5]), "stage3_param_persistence_threshold": 0}
json.dump(config, open(sys.argv[2], "w"), indent=1)
EOF_PY
"$zero_ckpt" export --to deepspeed "$work/imported" "$work/deepspeed" --config "$work/config.json" --world-size "$world" \
  --name-map "$name_map"
steps="$("$python" -c "import json, sys; print(len(json.load(open(sys.argv[1]))['losses']))" "$fixture/resume.json")"
(cd "$here/../../bench" && "$zero_run" --nproc "$world" "$python" deepspeed_peer.py --config "$work/config.json" \
  --load "$work/deepspeed" --out "$work/resumed.json" --steps "$steps" --threads 1 \
  --vocab 29 --context 15 --width 10 --depth 1 --heads 2)
"$zero_ckpt" consolidate "$work/imported" --out "$work/zero.safetensors"
DS_ACCELERATOR=cpu "$python" - "$work" "$fixture/resume.json" "$tolerance" "$norm_tolerance" "$name_map" << 'EOF_PY'
import json, os, sys
from safetensors.torch import load_file
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
work, tol, norm_tol = sys.argv[1], float(sys.argv[3]), float(sys.argv[4])
ours, theirs = json.load(open(os.path.join(work, "resumed.json"))), json.load(open(sys.argv[2]))
print(f"DeepSpeed {ours['deepspeed']} resumed the export on {ours['world']} ranks, the original on {theirs['world']}")
worst = worst_norm = 0.0
for i, (a, b) in enumerate(zip(ours["losses"], theirs["losses"])):
    na, nb = ours["grad_norms"][i], theirs["grad_norms"][i]
    rl, rn = abs(a - b) / max(abs(b), 1e-12), abs(na - nb) / max(abs(nb), 1e-12)
    worst, worst_norm = max(worst, rl), max(worst_norm, rn)
    print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rl:>9.1e} {na:>12.7f} {nb:>12.7f} {rn:>9.1e}")
if len(ours["losses"]) != len(theirs["losses"]) or worst > tol or worst_norm > norm_tol:
    sys.exit(f"FAIL: {len(ours['losses'])} steps against {len(theirs['losses'])}; largest relative differences "
             f"{worst:.2e} (losses, tolerance {tol:g}), {worst_norm:.2e} (norms, tolerance {norm_tol:g})")
names = json.load(open(sys.argv[5]))
consolidated = get_fp32_state_dict_from_zero_checkpoint(os.path.join(work, "deepspeed"))
zero = load_file(os.path.join(work, "zero.safetensors"))
if set(names[k] for k in consolidated) != set(zero):
    sys.exit(f"FAIL: zero_to_fp32 gives {sorted(consolidated)}, zero-ckpt consolidate {sorted(zero)}")
for k, v in consolidated.items():
    if not v.dtype == zero[names[k]].dtype or not v.shape == zero[names[k]].shape or not (v.view(-1).view(torch_int := __import__("torch").int32) == zero[names[k]].view(-1).view(torch_int)).all():
        sys.exit(f"FAIL: zero_to_fp32's {k} differs from zero-ckpt consolidate's {names[k]}")
print(f"the same curve: {worst:.2e} (losses), {worst_norm:.2e} (norms); zero_to_fp32 equals zero-ckpt consolidate "
      f"bit for bit on {len(zero)} tensors")
EOF_PY
