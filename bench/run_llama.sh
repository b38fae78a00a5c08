#!/usr/bin/env bash
# zero-llama train against transformers + DeepSpeed 0.19 (bench/llama_peer.py)
# at ZeRO stages 0-3, and against transformers + PyTorch DDP, on one
# ~125 M-parameter Llama (bench/llama_bench.py make), 2 ranks x 1 thread,
# fp32, micro-batch 1 x 256 tokens, the same batches on every side. Per row:
# the median step time of the timed steps, tokens/s and MFU: the model's
# FLOPs per token (PaLM's count: 6 x the non-embedding parameters, plus
# 12 x layers x width x context for attention) x tokens/s, over the ranks'
# measured one-thread matrix-product rate.
#
# Usage: bench/run_llama.sh [build dir, default build-wheel]
# Environment: STEPS (timed, default 4), WARMUP (default 2), RESULTS
# (default bench/results), PYTHON (default: the build's torch's python).
# The build must use the same torch as that python (ZERO_TORCH=wheel), so
# that both sides compute with the same BLAS; the table names it.
# Writes $RESULTS/llama.jsonl and $RESULTS/llama.md.
set -euo pipefail
build="${1:-build-wheel}"
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}" steps="${STEPS:-4}" warmup="${WARMUP:-2}"
source "$here/peer_python.sh"
peer_python "$build"
peer_require run_llama.sh deepspeed transformers
run="$build/tools/launcher/zero-run" llama="$build/tools/llama/zero-llama"
[ -x "$llama" ] || { echo "run_llama.sh: $llama is missing; build it (ZERO_TORCH=wheel bash tools/build.sh)" >&2; exit 1; }
work="$(mktemp -d "${TMPDIR:-/tmp}/run_llama.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$results"
lines="$results/llama.jsonl"
rm -f "$lines"
"$python" "$here/llama_bench.py" make "$work/model" 2>/dev/null
peak="$("$python" "$here/llama_bench.py" peak)"
kernels="$(cd "$here" && "$python" -c "from ddp_peer import blas_kernels; k, lib = blas_kernels(); print(f'{k} ({lib})')")"
read -r params flops <<< "$("$python" -c "
import json, sys
c = json.load(open(sys.argv[1]))
h, l, i, v = c['hidden_size'], c['num_hidden_layers'], c['intermediate_size'], c['vocab_size']
kv = c['num_key_value_heads'] * c['head_dim']
params = 2 * v * h + l * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h
print(params, 6 * (params - v * h) + 12 * l * h * 256)  # the embedding is a lookup: no FLOPs
" "$work/model/config.json")"
total=$((steps + warmup))
record() {  # record SYSTEM STAGE SECONDS...: the median of the timed steps
  "$python" - "$1" "$2" "$peak" "$kernels" "$params" "$warmup" "$steps" "$flops" "${@:3}" >> "$lines" << 'EOF_PY'
import json, statistics, sys
system, stage, peak, kernels, params, warmup, steps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
flops = int(sys.argv[8])
times = [float(t) for t in sys.argv[9:]][warmup:]
step = statistics.median(times)
tokens = 2 * 1 * 256 / step  # 2 ranks x micro 1 x 256 tokens
print(json.dumps({"system": system, "stage": stage, "step_s": step, "tokens_per_s": tokens,
                  "mfu": flops * tokens / (2 * peak * 1e9), "flops_per_token": flops, "params": params, "ranks": 2,
                  "kernels": kernels,
                  "peak_gflops": peak, "warmup": warmup, "timed": steps}))
EOF_PY
}
for stage in 0 1 2 3; do
  config="$("$python" "$here/llama_bench.py" config "$work" "$stage")"
  times=($("$run" --nproc 2 "$llama" train --hf-dir "$work/model" --config "$config" --tokens "$work/model/tokens.bin" \
    --ctx 256 --steps "$total" --timing | sed -n 's/^\[rank 0\] step .* time \([0-9.]*\)$/\1/p'))
  record zero "$stage" "${times[@]}"
  "$run" --nproc 2 "$python" "$here/llama_peer.py" --hf-dir "$work/model" --config "$config" \
    --tokens "$work/model/tokens.bin" --ctx 256 --steps "$total" --out "$work/ds.json" > /dev/null 2>&1
  record "transformers + DeepSpeed" "$stage" $("$python" -c "import json, sys; print(*json.load(open(sys.argv[1]))['step_s'])" "$work/ds.json")
  echo "stage $stage done" >&2
done
"$run" --nproc 2 "$python" "$here/llama_peer.py" --hf-dir "$work/model" --config "$work/stage0.json" \
  --tokens "$work/model/tokens.bin" --ctx 256 --steps "$total" --out "$work/ddp.json" --ddp > /dev/null 2>&1
record "transformers + DDP" 0 $("$python" -c "import json, sys; print(*json.load(open(sys.argv[1]))['step_s'])" "$work/ddp.json")
"$python" "$here/llama_bench.py" table "$lines" "$results/llama.md"
