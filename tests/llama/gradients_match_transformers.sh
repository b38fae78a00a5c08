#!/usr/bin/env bash
# The gradients of zero-llama train's first step equal transformers' on the
# same batch within 1e-5 relative: zero takes one SGD step with lr 1000 (no
# clipping, momentum or decay) and saves the weights (--save-hf); the
# gradient is (W0 - W1) / 1000 for every tensor (a large lr keeps the
# subtraction exact to ~1e-7), against transformers' loss.backward() on
# sequences 0 and 1 of the token file, the batch those ranks took.
# Usage: gradients_match_transformers.sh ZERO_RUN ZERO_LLAMA PYTHON FIXTURE TOKENS NPROC WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import transformers.
set -euo pipefail
zero_run="$1" llama="$2" python="$3" fixture="$4" tokens="$5" nproc="$6" work="$7"
if ! why="$("$python" -c "import transformers, torch" 2>&1)"; then
  echo "SKIPPED: $python cannot import transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
micro=$(( 2 / nproc ))
cat > "$work/config.json" << EOF_JSON
{"train_micro_batch_size_per_gpu": $micro, "optimizer": {"type": "SGD", "params": {"lr": 1000.0}},
 "zero_optimization": {"stage": 2}}
EOF_JSON
"$zero_run" --nproc "$nproc" "$llama" train --hf-dir "$fixture" --config "$work/config.json" --tokens "$tokens" \
  --ctx 16 --steps 1 --save-hf "$work/stepped"
"$python" - "$fixture" "$work/stepped" "$tokens" << 'EOF_PY'
import os, sys
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
fixture, stepped, ctx = sys.argv[1], sys.argv[2], 16
model = AutoModelForCausalLM.from_pretrained(fixture, attn_implementation="eager")
tokens = torch.from_numpy(np.fromfile(sys.argv[3], dtype="<u2").astype(np.int64))
batch = tokens[:2 * ctx].view(2, ctx)
logits = model(batch[:, :-1]).logits.float()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
loss.backward()
before, after = load_file(os.path.join(fixture, "model.safetensors")), load_file(os.path.join(stepped, "model.safetensors"))
worst = 0.0
for name, p in model.named_parameters():
    ours = (before[name].double() - after[name].double()) / 1000.0
    theirs = p.grad.double()
    error = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    worst = max(worst, error)
    if error > 1e-5:
        sys.exit(f"FAIL: the gradient of {name} differs by {error:.2e} relative (largest difference / largest gradient)")
print(f"{len(before)} gradients equal transformers' within {worst:.2e} relative (loss {loss.item():.6f})")
EOF_PY
