#!/usr/bin/env bash
# transformers' LlamaForCausalLM trained from Python by zero (python/zero,
# through bench/llama_peer.py --engine zero) against the same script on
# DeepSpeed, and against zero-llama train (zero's C++ Llama): one ds_config,
# the same Hugging Face weights and batches, 2 CPU ranks. Every step's loss
# within TOLERANCE (relative, 1e-5) of DeepSpeed's and CPP_TOLERANCE (1e-6)
# of the C++ path's; gradient norms within NORM_TOLERANCE (1e-4) of
# DeepSpeed's and CPP_NORM_TOLERANCE (1e-4) of the C++ path's. bf16 widens
# the DeepSpeed bars (tests/peers/same_curve.sh says why), not the C++ ones.
# Usage: same_curve.sh ZERO_RUN ZERO_LLAMA PYTHON PACKAGE_DIR FIXTURE TOKENS CONFIG STEPS WORK
# PACKAGE_DIR: the folder holding the built zero package (<build>/python).
# Exits 77 (skipped) with the reason when PYTHON cannot import deepspeed and transformers.
set -euo pipefail
zero_run="$1" llama="$2" python="$3" package="$4" fixture="$5" tokens="$6" config="$7" steps="$8" work="$9"
tolerance="${TOLERANCE:-1e-5}" cpp_tolerance="${CPP_TOLERANCE:-1e-6}" norm_tolerance="${NORM_TOLERANCE:-1e-4}"
cpp_norm_tolerance="${CPP_NORM_TOLERANCE:-1e-4}"
here="$(cd "$(dirname "$0")" && pwd)"
peer="$here/../../bench/llama_peer.py"
export DS_ACCELERATOR=cpu
if ! why="$("$python" -c "import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import deepspeed, transformers" 2>&1)"; then
  echo "SKIPPED: $python cannot import deepspeed and transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$zero_run" --nproc 2 "$llama" train --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 --steps "$steps" |
  sed -n 's/^\[rank 0\] \(step .*\)/\1/p' > "$work/cpp.txt"
PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}" "$zero_run" --nproc 2 "$python" "$peer" --engine zero --hf-dir "$fixture" \
  --config "$config" --tokens "$tokens" --ctx 16 --steps "$steps" --out "$work/python.json"
"$zero_run" --nproc 2 "$python" "$peer" --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 \
  --steps "$steps" --out "$work/deepspeed.json"
"$python" - "$work" "$tolerance" "$cpp_tolerance" "$norm_tolerance" "$cpp_norm_tolerance" << 'EOF_PY'
import json, math, sys
work, tol, cpp_tol, norm_tol, cpp_norm_tol = sys.argv[1], *map(float, sys.argv[2:6])
py, ds = json.load(open(f"{work}/python.json")), json.load(open(f"{work}/deepspeed.json"))
cpp = [dict(zip(l.split()[0::2], l.split()[1::2])) for l in open(f"{work}/cpp.txt") if l.strip()]
cpp = {"losses": [float(z["loss"]) for z in cpp], "grad_norms": [float(z["grad_norm"]) for z in cpp]}
print(f"zero from Python against transformers {ds['transformers']} + DeepSpeed {ds['deepspeed']} and zero-llama train, "
      f"{ds['world']} ranks\n step  python loss  deepspeed   rel        zero-llama  rel        | norms: python  deepspeed  rel  zero-llama  rel")
worst = {"ds": 0.0, "cpp": 0.0, "ds_norm": 0.0, "cpp_norm": 0.0}
rel = lambda a, b: abs(a - b) / abs(b)
# DeepSpeed's get_global_grad_norm() is None at stage 0 (NaN in its JSON):
# its norms are then not compared, and the line says so. Any other NaN fails.
ds_norms = not all(math.isnan(n) for n in ds["grad_norms"])
for i, (l, n) in enumerate(zip(py["losses"], py["grad_norms"])):
    row = [rel(l, ds["losses"][i]), rel(l, cpp["losses"][i]), rel(n, ds["grad_norms"][i]) if ds_norms else 0.0,
           rel(n, cpp["grad_norms"][i])]
    for k, r in zip(worst, row):
        worst[k] = r if math.isnan(r) else max(worst[k], r)
    print(f"{i + 1:>4} {l:>12.7f} {ds['losses'][i]:>12.7f} {row[0]:>8.1e} {cpp['losses'][i]:>12.7f} {row[1]:>8.1e} | "
          f"{n:>10.6f} {ds['grad_norms'][i]:>10.6f} {row[2]:>8.1e} {cpp['grad_norms'][i]:>10.6f} {row[3]:>8.1e}")
steps = {len(py["losses"]), len(ds["losses"]), len(cpp["losses"])}
if not ds_norms:
    print("DeepSpeed reports no gradient norm with this config (stage 0): norms compared with zero-llama's only")
if len(steps) != 1 or any(math.isnan(w) for w in worst.values()) or worst["ds"] > tol or worst["cpp"] > cpp_tol or worst["ds_norm"] > norm_tol or worst["cpp_norm"] > cpp_norm_tol:
    sys.exit(f"FAIL: steps {sorted(steps)}; largest relative differences: losses {worst['ds']:.2e} against DeepSpeed "
             f"(tolerance {tol:g}), {worst['cpp']:.2e} against zero-llama (tolerance {cpp_tol:g}); norms "
             f"{worst['ds_norm']:.2e} (tolerance {norm_tol:g}) and {worst['cpp_norm']:.2e} (tolerance {cpp_norm_tol:g})")
print(f"the same curve: losses {worst['ds']:.2e} (DeepSpeed), {worst['cpp']:.2e} (zero-llama); "
      f"norms {worst['ds_norm']:.2e}, {worst['cpp_norm']:.2e}")
EOF_PY
