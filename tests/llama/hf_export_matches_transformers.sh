#!/usr/bin/env bash
# A Llama fixture trained by zero, exported with zero-ckpt export --to hf,
# loaded by transformers (AutoModelForCausalLM.from_pretrained, eager
# attention): its float32 logits must equal those zero computed after
# training within 1e-5 relative, and its loss over the token file must be
# what zero-llama eval reports on the export, within 1e-6.
# Usage: hf_export_matches_transformers.sh ZERO_RUN LLAMA_STEPS ZERO_CKPT ZERO_LLAMA PYTHON FIXTURE TOKENS WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import transformers.
set -euo pipefail
zero_run="$1" steps_bin="$2" zero_ckpt="$3" llama="$4" python="$5" fixture="$6" tokens="$7" work="$8"
if ! why="$("$python" -c "import transformers, torch" 2>&1)"; then
  echo "SKIPPED: $python cannot import transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
ctx=16
"$zero_run" --nproc 2 "$steps_bin" "$fixture" "$tokens" "$ctx" 3 "$work/ckpt" "$work/logits.safetensors"
"$zero_ckpt" export --to hf "$work/ckpt" "$work/hf" --config "$fixture/config.json"
out="$("$zero_run" --nproc 1 "$llama" eval --hf-dir "$work/hf" --tokens "$tokens" --ctx "$ctx")"
loss="$(echo "$out" | sed -n 's/^\(\[rank 0\] \)\{0,1\}loss //p' | tail -1)"
"$python" - "$work" "$tokens" "$ctx" "$loss" << 'EOF_PY'
import os, sys
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
work, ctx, zero_loss = sys.argv[1], int(sys.argv[3]), float(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "hf"), attn_implementation="eager").eval()
tokens = np.fromfile(sys.argv[2], dtype="<u2").astype(np.int64)
total, count = 0.0, 0
with torch.no_grad():
    for s in range(len(tokens) // ctx):
        ids = torch.from_numpy(tokens[s * ctx:(s + 1) * ctx]).unsqueeze(0)
        logits = model(ids).logits.float()
        if s == 0:
            ours = load_file(os.path.join(work, "logits.safetensors"))["logits"]
            error = ((logits[0] - ours).abs().max() / ours.abs().max()).item()
        ce = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
        total, count = total + ce.double().sum().item(), count + ce.numel()
loss = total / count
rel = abs(loss - zero_loss) / abs(loss)
print(f"logits after zero's training: {error:.1e} relative to transformers'; loss: transformers {loss:.10f}, "
      f"zero-llama eval {zero_loss:.10f} ({rel:.1e})")
if error > 1e-5 or rel > 1e-6:
    sys.exit("FAIL: more than 1e-5 (logits) or 1e-6 (loss) apart")
EOF_PY
