#!/usr/bin/env bash
# zero from Python (python/zero) against DeepSpeed 0.19 and against zero's
# C++ path, on one ~125 M-parameter transformers Llama (bench/llama_bench.py
# make), 2 ranks x 1 thread, fp32, micro-batch 1 x 256 tokens, the same
# batches on every side: bench/llama_peer.py with --engine zero and without,
# and zero-llama train. Per stage 1-3: the median step time of the timed
# steps of each side; at stage 3 also the largest peak RSS of the ranks
# (Python's resource.getrusage, whole process: interpreter, transformers
# and the engine's module).
#
# Usage: bench/run_python_vs_deepspeed.sh [build dir, default build-wheel]
# Environment: STEPS (timed, default 4), WARMUP (default 2), RESULTS
# (default bench/results), PYTHON (default: the build's torch's python).
# Appends its rows to $RESULTS/python_vs_deepspeed.jsonl; the last line
# printed is one JSON object with the ratios (goals: Python / DeepSpeed
# step <= 0.8 at stages 1-3, Python / C++ step <= 1.1, Python / DeepSpeed
# peak RSS <= 0.7 at stage 3).
set -euo pipefail
build="${1:-build-wheel}"
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}" steps="${STEPS:-4}" warmup="${WARMUP:-2}"
source "$here/peer_python.sh"
peer_python "$build"
peer_require run_python_vs_deepspeed.sh deepspeed transformers
run="$build/tools/launcher/zero-run" llama="$build/tools/llama/zero-llama" package="$build/python"
for need in "$llama" "$package/zero/_C.so"; do
  [ -e "$need" ] || { echo "run_python_vs_deepspeed.sh: $need is missing; build it (ZERO_TORCH=wheel bash tools/build.sh)" >&2; exit 1; }
done
work="$(mktemp -d "${TMPDIR:-/tmp}/run_python_vs_deepspeed.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$results"
lines="$results/python_vs_deepspeed.jsonl"
"$python" "$here/llama_bench.py" make "$work/model" 2>/dev/null
kernels="$(cd "$here" && "$python" -c "from ddp_peer import blas_kernels; k, lib = blas_kernels(); print(f'{k} ({lib})')")"
total=$((steps + warmup))
peer() {  # peer OUT.json [--engine zero] with the stage's config
  local out="$1"; shift
  PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}" "$run" --nproc 2 "$python" "$here/llama_peer.py" --hf-dir "$work/model" \
    --config "$config" --tokens "$work/model/tokens.bin" --ctx 256 --steps "$total" --out "$out" "$@" > /dev/null 2>&1
}
for stage in 1 2 3; do
  config="$("$python" "$here/llama_bench.py" config "$work" "$stage")"
  "$run" --nproc 2 "$llama" train --hf-dir "$work/model" --config "$config" --tokens "$work/model/tokens.bin" \
    --ctx 256 --steps "$total" --timing | sed -n 's/^\[rank 0\] step .* time \([0-9.]*\)$/\1/p' > "$work/cpp$stage.txt"
  peer "$work/python$stage.json" --engine zero
  peer "$work/deepspeed$stage.json"
  echo "stage $stage done" >&2
done
"$python" - "$work" "$warmup" "$kernels" "$lines" << 'EOF_PY'
import json, statistics, sys, time
work, warmup, kernels, lines = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
median = lambda times: statistics.median(times[warmup:])
summary = {"bench": "python_vs_deepspeed", "date": time.strftime("%Y-%m-%d"), "kernels": kernels, "ranks": 2,
           "threads_per_rank": 1, "model": "Llama ~125M (bench/llama_bench.py make), fp32, micro 1 x 256 tokens"}
rows = []
for stage in (1, 2, 3):
    py, ds = json.load(open(f"{work}/python{stage}.json")), json.load(open(f"{work}/deepspeed{stage}.json"))
    cpp = [float(l) for l in open(f"{work}/cpp{stage}.txt")]
    row = {"stage": stage, "python_step_s": median(py["step_s"]), "deepspeed_step_s": median(ds["step_s"]),
           "cpp_step_s": median(cpp), "python_peak_rss_bytes": py["peak_rss_bytes"],
           "deepspeed_peak_rss_bytes": ds["peak_rss_bytes"]}
    row["python_vs_deepspeed"] = row["python_step_s"] / row["deepspeed_step_s"]
    row["python_vs_cpp"] = row["python_step_s"] / row["cpp_step_s"]
    row["rss_python_vs_deepspeed"] = row["python_peak_rss_bytes"] / row["deepspeed_peak_rss_bytes"]
    rows.append(row)
    print(f"stage {stage}: Python {row['python_step_s']:.3f} s, DeepSpeed {row['deepspeed_step_s']:.3f} s "
          f"({row['python_vs_deepspeed']:.2f}x), C++ {row['cpp_step_s']:.3f} s ({row['python_vs_cpp']:.2f}x); "
          f"peak RSS {row['python_peak_rss_bytes'] / 2**20:.0f} / {row['deepspeed_peak_rss_bytes'] / 2**20:.0f} MiB "
          f"({row['rss_python_vs_deepspeed']:.2f}x)")
summary["rows"] = rows
with open(lines, "a") as f:
    f.write(json.dumps(summary) + "\n")
print(json.dumps({"python_vs_deepspeed": {r["stage"]: round(r["python_vs_deepspeed"], 3) for r in rows},
                  "python_vs_cpp": {r["stage"]: round(r["python_vs_cpp"], 3) for r in rows},
                  "rss_python_vs_deepspeed_stage3": round(rows[-1]["rss_python_vs_deepspeed"], 3),
                  "kernels": kernels}))
EOF_PY
