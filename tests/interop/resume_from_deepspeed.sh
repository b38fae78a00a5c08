#!/usr/bin/env bash
# A zero run resumed from an imported DeepSpeed checkpoint continues
# DeepSpeed's own resumed run: zero-ckpt import turns FIXTURE/ckpt
# (tests/fixtures/deepspeed, DeepSpeed 0.19) into a zero checkpoint, then
# zero trains from it on WORLD ranks for the steps of FIXTURE/resume.json,
# which is DeepSpeed resuming the same folder on its own world size. The
# batches are the same whatever the world size (sample s of a step is row
# s - r * micro of rank r), and WORLD ranks get the micro-batch size that
# keeps the global batch DeepSpeed's. Every loss must agree within TOLERANCE
# (relative; 1e-5, the fp32 bar), gradient norms within NORM_TOLERANCE.
# Usage: resume_from_deepspeed.sh ZERO_RUN DEEPSPEED_TRAIN ZERO_CKPT FIXTURE NAME_MAP WORLD WORK
set -euo pipefail
zero_run="$1" train="$2" zero_ckpt="$3" fixture="$4" name_map="$5" world="$6" work="$7"
tolerance="${TOLERANCE:-1e-5}" norm_tolerance="${NORM_TOLERANCE:-1e-4}"
rm -rf "$work" && mkdir -p "$work"
"$zero_ckpt" import --from deepspeed "$fixture/ckpt" "$work/imported" --name-map "$name_map"
python3 - "$fixture/config.json" "$work/config.json" "$world" "$fixture/ckpt" << 'EOF_PY'
import json, os, re, sys
config, world = json.load(open(sys.argv[1])), int(sys.argv[3])
tag = open(os.path.join(sys.argv[4], "latest")).read().strip()
saved = len([f for f in os.listdir(os.path.join(sys.argv[4], tag)) if re.match(r"(bf16_)?zero_pp_rank_\d+_mp_rank_00_optim", f)])
global_batch = config["train_micro_batch_size_per_gpu"] * saved
if global_batch % world:
    sys.exit(f"resume_from_deepspeed.sh: a global batch of {global_batch} does not split over {world} ranks")
config["train_micro_batch_size_per_gpu"] = global_batch // world
json.dump(config, open(sys.argv[2], "w"), indent=1)
EOF_PY
steps="$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))['losses']))" "$fixture/resume.json")"
"$zero_run" --nproc "$world" "$train" --config "$work/config.json" --load "$work/imported" --out "$work/zero.json" \
  --steps "$steps" --vocab 29 --context 15 --width 10 --depth 1 --heads 2
python3 - "$work/zero.json" "$fixture/resume.json" "$tolerance" "$norm_tolerance" "$(basename "$fixture")" "$world" << 'EOF_PY'
import json, sys
zero, ds, tol, norm_tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3]), float(sys.argv[4])
print(f"{sys.argv[5]} resumed by zero on {sys.argv[6]} ranks, by DeepSpeed {ds['deepspeed']} on {ds['world']}")
print(f"{'step':>4} {'zero loss':>12} {'DeepSpeed':>12} {'rel':>9} {'zero norm':>12} {'DeepSpeed':>12} {'rel':>9}")
worst = worst_norm = 0.0
for i, (a, b) in enumerate(zip(zero["losses"], ds["losses"])):
    na, nb = zero["grad_norms"][i], ds["grad_norms"][i]
    rl, rn = abs(a - b) / max(abs(b), 1e-12), abs(na - nb) / max(abs(nb), 1e-12)
    worst, worst_norm = max(worst, rl), max(worst_norm, rn)
    print(f"{i:>4} {a:>12.7f} {b:>12.7f} {rl:>9.1e} {na:>12.7f} {nb:>12.7f} {rn:>9.1e}")
if len(zero["losses"]) != len(ds["losses"]):
    sys.exit(f"FAIL: zero ran {len(zero['losses'])} steps, DeepSpeed {len(ds['losses'])}")
if worst > tol or worst_norm > norm_tol:
    sys.exit(f"FAIL: the largest relative differences are {worst:.2e} (losses, tolerance {tol:g}) and "
             f"{worst_norm:.2e} (gradient norms, tolerance {norm_tol:g})")
print(f"the same curve: largest relative differences {worst:.2e} in the losses, {worst_norm:.2e} in the norms")
EOF_PY
