#!/usr/bin/env bash
# zero-llama eval on NPROC ranks against transformers' loss over the same
# token file (the fixture's reference.json, written by
# tools/fixtures/make_llama_fixtures.py): within 1e-6 relative.
# Usage: eval_matches_transformers.sh ZERO_RUN ZERO_LLAMA FIXTURE TOKENS NPROC [DS_CONFIG]
# (DS_CONFIG: the layout, e.g. tensor parallelism.)
set -euo pipefail
zero_run="$1" llama="$2" fixture="$3" tokens="$4" nproc="$5" config=("${@:6}")
[ ${#config[@]} -eq 0 ] || config=(--config "${config[0]}")
ctx="$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['ctx'])" "$fixture/reference.json")"
out="$("$zero_run" --nproc "$nproc" "$llama" eval --hf-dir "$fixture" --tokens "$tokens" --ctx "$ctx" "${config[@]}")"
echo "$out"
loss="$(echo "$out" | sed -n 's/^\(\[rank 0\] \)\{0,1\}loss //p' | tail -1)"
python3 - "$loss" "$fixture/reference.json" << 'EOF_PY'
import json, sys
ours, ref = float(sys.argv[1]), json.load(open(sys.argv[2]))
rel = abs(ours - ref["loss"]) / abs(ref["loss"])
print(f"zero-llama {ours:.10f}, transformers {ref['transformers']} {ref['loss']:.10f}: {rel:.1e} relative")
sys.exit(0 if rel <= 1e-6 else "FAIL: more than 1e-6 apart")
EOF_PY
