#!/usr/bin/env bash
# One checkpoint format: a checkpoint that zero saved from Python (bench/
# llama_peer.py --engine zero, transformers' LlamaForCausalLM) loads in
# zero-llama train --load (zero's C++ Llama), and one zero-llama saved loads
# from Python; each goes on with the losses of a run that never stopped,
# within TOLERANCE (relative, 1e-6: the two forwards differ by ~1e-10).
# Usage: checkpoints_both_ways.sh ZERO_RUN ZERO_LLAMA PYTHON PACKAGE_DIR FIXTURE TOKENS CONFIG WORK
# Exits 77 (skipped) with the reason when PYTHON cannot import transformers.
set -euo pipefail
zero_run="$1" llama="$2" python="$3" package="$4" fixture="$5" tokens="$6" config="$7" work="$8"
tolerance="${TOLERANCE:-1e-6}"
here="$(cd "$(dirname "$0")" && pwd)"
if ! why="$("$python" -c "import transformers" 2>&1)"; then
  echo "SKIPPED: $python cannot import transformers (${why##*$'\n'}); run tools/setup-deps.sh with ZERO_TORCH=wheel"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
python_run() { PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}" "$zero_run" --nproc 2 "$python" "$here/../../bench/llama_peer.py" \
  --engine zero --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 "$@" > /dev/null; }
cpp_run() { "$zero_run" --nproc 2 "$llama" train --hf-dir "$fixture" --config "$config" --tokens "$tokens" --ctx 16 "$@" |
  sed -n 's/^\[rank 0\] step .* loss \([^ ]*\) .*/\1/p'; }
python_run --steps 8 --out "$work/whole.json"
python_run --steps 4 --out "$work/first.json" --save "$work/from_python"
cpp_run --steps 8 --load "$work/from_python" > "$work/cpp_resumed.txt"
cpp_run --steps 4 --save "$work/from_cpp" > /dev/null
python_run --steps 8 --out "$work/python_resumed.json" --load "$work/from_cpp"
"$python" - "$work" "$tolerance" << 'EOF_PY'
import json, sys
work, tol = sys.argv[1], float(sys.argv[2])
whole = json.load(open(f"{work}/whole.json"))["losses"][4:]
resumed = {"zero-llama train --load (saved from Python)": [float(l) for l in open(f"{work}/cpp_resumed.txt")],
           "Python load_checkpoint (saved by zero-llama)": json.load(open(f"{work}/python_resumed.json"))["losses"]}
failed = []
for name, losses in resumed.items():
    worst = max((abs(a - b) / abs(b) for a, b in zip(losses, whole)), default=float("inf"))
    print(f"{name}: steps 5-8 {['%.7f' % l for l in losses]} against {['%.7f' % l for l in whole]}: {worst:.1e}")
    if len(losses) != len(whole) or not worst <= tol:
        failed.append(name)
if failed:
    sys.exit(f"FAIL: {', '.join(failed)} did not continue the uninterrupted run within {tol:g}")
print("one checkpoint format: both resumes continue the uninterrupted Python run")
EOF_PY
