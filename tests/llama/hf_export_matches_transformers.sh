#!/usr/bin/env bash
# A Llama fixture fine-tuned by zero-llama train (2 ranks, stage 2, 3
# steps), saved two ways: --save-hf, and --save then zero-ckpt export --to
# hf. transformers loads each (AutoModelForCausalLM.from_pretrained, eager
# attention): its loss over the token file must be what zero-llama eval
# reports on the same folder, within 1e-6, and the two folders must give
# transformers the same logits within 1e-5 relative.
# Usage: hf_export_matches_transformers.sh ZERO_RUN ZERO_LLAMA ZERO_CKPT PYTHON FIXTURE TOKENS CONFIG WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import transformers.
set -euo pipefail
zero_run="$1" llama="$2" zero_ckpt="$3" python="$4" fixture="$5" tokens="$6" config="$7" work="$8"
if ! why="$("$python" -c "import transformers, torch" 2>&1)"; then
  echo "SKIPPED: $python cannot import transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
ctx=16
"$zero_run" --nproc 2 "$llama" train --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx "$ctx" --steps 3 \
  --save "$work/ckpt" --save-hf "$work/save_hf"
"$zero_ckpt" export --to hf "$work/ckpt" "$work/export" --config "$fixture/config.json"
losses=()
for folder in save_hf export; do
  out="$("$zero_run" --nproc 1 "$llama" eval --hf-dir "$work/$folder" --tokens "$tokens" --ctx "$ctx")"
  losses+=("$(echo "$out" | sed -n 's/^\(\[rank 0\] \)\{0,1\}loss //p' | tail -1)")
done
"$python" - "$work" "$tokens" "$ctx" "${losses[@]}" "$fixture" << 'EOF_PY'
import os, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM
work, ctx = sys.argv[1], int(sys.argv[3])
tokens = np.fromfile(sys.argv[2], dtype="<u2").astype(np.int64)
first = {}
for folder, zero_loss in (("save_hf", float(sys.argv[4])), ("export", float(sys.argv[5]))):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(work, folder), attn_implementation="eager").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(len(tokens) // ctx):
            ids = torch.from_numpy(tokens[s * ctx:(s + 1) * ctx]).unsqueeze(0)
            logits = model(ids).logits.float()
            first.setdefault(folder, logits[0])
            ce = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
            total, count = total + ce.double().sum().item(), count + ce.numel()
    loss = total / count
    rel = abs(loss - zero_loss) / abs(loss)
    print(f"{folder}: transformers' loss {loss:.10f}, zero-llama eval {zero_loss:.10f} ({rel:.1e})")
    if rel > 1e-6:
        sys.exit("FAIL: more than 1e-6 apart")
error = ((first["save_hf"] - first["export"]).abs().max() / first["export"].abs().max()).item()
start = AutoModelForCausalLM.from_pretrained(sys.argv[6], attn_implementation="eager").eval()
with torch.no_grad():
    moved = (start(torch.from_numpy(tokens[:ctx]).unsqueeze(0)).logits.float()[0] - first["export"]).abs().max().item()
print(f"--save-hf and zero-ckpt export give transformers the same logits ({error:.1e} relative); training moved them by {moved:.2e}")
if error > 1e-5 or moved == 0:
    sys.exit("FAIL: the two folders differ, or training changed nothing")
EOF_PY
