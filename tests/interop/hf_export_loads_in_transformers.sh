#!/usr/bin/env bash
# zero-ckpt export --to hf, read by transformers' own loading functions
# (get_checkpoint_shard_files on the index, load_state_dict on each shard),
# sharded and in one file: every tensor must equal zero-ckpt consolidate's
# weights rounded to the dtype (torch's .to()), and the whole state dict
# must load strictly into the Python model the fixture came from
# (bench/torch_gpt.py), whose names the name map gives. The logits of a
# transformers model family are the Llama model's test.
# Usage: hf_export_loads_in_transformers.sh ZERO_CKPT PYTHON FIXTURE NAME_MAP WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import transformers.
set -euo pipefail
zero_ckpt="$1" python="$2" fixture="$3" name_map="$4" work="$5"
here="$(cd "$(dirname "$0")" && pwd)"
if ! why="$("$python" -c "import transformers, torch" 2>&1)"; then
  echo "SKIPPED: $python cannot import transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$zero_ckpt" import --from deepspeed "$fixture/ckpt" "$work/zero" --name-map "$name_map"
"$zero_ckpt" consolidate "$work/zero" --out "$work/consolidated.safetensors"
"$zero_ckpt" export --to hf "$work/zero" "$work/sharded" --dtype bfloat16 --max-shard-size 2KB --name-map "$name_map"
"$zero_ckpt" export --to hf "$work/zero" "$work/single" --dtype float16 --name-map "$name_map"
"$python" - "$work" "$name_map" "$here/../../bench" << 'EOF_PY'
import json, os, sys
import torch
from safetensors.torch import load_file
from transformers.modeling_utils import load_state_dict
from transformers.utils.hub import get_checkpoint_shard_files
work, names, bench = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
sys.path.insert(0, bench)
from torch_gpt import GPT, LossModel
consolidated = load_file(os.path.join(work, "consolidated.safetensors"))
for folder, dtype in (("sharded", torch.bfloat16), ("single", torch.float16)):
    path = os.path.join(work, folder)
    index = os.path.join(path, "model.safetensors.index.json")
    if folder == "sharded":
        files, meta = get_checkpoint_shard_files(path, index)
        assert len(files) > 1, f"{folder}: one shard only"
    else:
        assert not os.path.exists(index)
        files = [os.path.join(path, "model.safetensors")]
    state = {}
    for f in files:
        state.update(load_state_dict(f))
    for hf, zero in names.items():
        want = consolidated[zero].to(dtype)
        got = state[hf]
        if got.dtype != dtype or got.shape != want.shape or not torch.equal(got, want):
            sys.exit(f"FAIL: {folder}: {hf} is not zero-ckpt consolidate's {zero} as {dtype}")
    model = LossModel(GPT(29, 15, 1, 10, 2)).to(dtype)
    model.load_state_dict(state, strict=True)
    print(f"{folder}: {len(files)} file(s), {len(state)} tensors in {dtype}, equal to consolidate's, loaded strictly")
EOF_PY
