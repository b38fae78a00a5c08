#!/usr/bin/env bash
# The longest context one training step of a fixed Llama config fits in a
# per-rank activation budget, at sequence-parallel sizes 1, 2 and 4 (each
# rank a process on this machine), plain (transformers' eager attention,
# whole MLPs and logits) and long (ALST: blockwise attention, the MLPs and
# the loss over tiles). Each probe is one zero-run of bench_long_context
# (bench/long_context.cpp: the step's peak RSS above where it started, the
# largest over the ranks, less what a step at a short context grows by).
# The ranks run on glibc's malloc with a fixed mmap threshold of 64 kB, so
# that a freed tensor leaves the RSS and the RSS follows what is alive
# (tcmalloc, zero-run's default, keeps freed spans). The search doubles the context from 64 x sp while
# it fits, then halves the gap STEPS times (default 3: within 1/8).
# Then, at sp 1's longest long-mode context (a multiple of 64 x the largest
# sp), every sp runs once more: the
# activation peak per rank at sp P against sp 1's, and all-to-all bytes
# against the formula.
# Usage: bench/run_long_context.sh [BUILD] [bench_long_context options...]
# Environment: BUDGET_MB (default 128), SPS (default "1 2 4"), MODES (default
# "plain long"), STEPS (default 3), MAX_CONTEXT (default 65536), RESULTS
# (default bench/results). Appends every probe to
# $RESULTS/long_context_probes.jsonl; the last line is JSON: max_ctx per
# mode and sp, the growth from sp 1, tiling's gain at sp 1, and the
# same-context comparison. Exits 0 when the runs complete: the goals are
# information.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
probes="$results/long_context_probes.jsonl"
budget=$(( ${BUDGET_MB:-128} * 1000000 ))
steps="${STEPS:-3}" ceiling="${MAX_CONTEXT:-65536}"
bin="$build/bench/bench_long_context"
run="$build/tools/launcher/zero-run"
export ZERO_ALLOCATOR=system MALLOC_MMAP_THRESHOLD_=65536
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); $(nproc) cores; kernels: $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo AVX2); budget ${BUDGET_MB:-128} MB a rank" >&2

# probe SP MODE CONTEXT -> prints the activation peak in bytes (huge when the run failed)
probe() {
  local out
  out="$(mktemp)"
  if "$run" --nproc "$1" "$bin" --context "$3" --mode "$2" --out "$out" "${@:4}" >&2; then
    tee -a "$probes" < "$out" | python3 -c 'import json, sys; print(int(json.loads(sys.stdin.readline())["activation_peak"]))'
  else
    echo 999999999999
  fi
  rm -f "$out"
}

declare -A best
for mode in ${MODES:-plain long}; do
  for sp in ${SPS:-1 2 4}; do
    good=0 bad=0 ctx=$(( 64 * sp ))
    while [ "$ctx" -le "$ceiling" ]; do
      if [ "$(probe "$sp" "$mode" "$ctx" "$@")" -le "$budget" ]; then good=$ctx; ctx=$(( ctx * 2 )); else bad=$ctx; break; fi
    done
    if [ "$bad" -gt 0 ] && [ "$good" -gt 0 ]; then
      for _ in $(seq "$steps"); do
        mid=$(( (good + bad) / 2 / (64 * sp) * (64 * sp) ))  # a multiple of 64 x sp
        [ "$mid" -gt "$good" ] && [ "$mid" -lt "$bad" ] || break
        if [ "$(probe "$sp" "$mode" "$mid" "$@")" -le "$budget" ]; then good=$mid; else bad=$mid; fi
      done
    fi
    best[$mode.$sp]=$good
    echo "$mode, sp $sp: longest context within the budget $good (first over it: $bad)" >&2
  done
done

# The same context at every sp: sp 1's longest long-mode one, rounded down
# to a multiple of 64 x the largest sp, so that every sp runs exactly it.
largest=1
for sp in ${SPS:-1 2 4}; do [ "$sp" -gt "$largest" ] && largest=$sp; done
same=$(( ${best[long.1]:-0} / (64 * largest) * (64 * largest) ))
same_lines="$(mktemp)"
if [ "$same" -gt 0 ]; then
  for sp in ${SPS:-1 2 4}; do
    "$run" --nproc "$sp" "$bin" --context "$same" --mode long --out "$same_lines" "$@" >&2 || true
  done
  cat "$same_lines" >> "$probes"
fi
python3 - "$same_lines" "$budget" ${MODES:-plain long} -- ${SPS:-1 2 4} -- $(for k in "${!best[@]}"; do echo "$k=${best[$k]}"; done) << 'EOF_PY'
import json, sys
args = sys.argv[1:]
same_file, budget = args[0], int(args[1])
rest = args[2:]
first = rest.index("--"); modes = rest[:first]
second = rest.index("--", first + 1); sps = [int(s) for s in rest[first + 1:second]]
best = dict(kv.split("=") for kv in rest[second + 1:])
max_ctx = {m: {str(sp): int(best.get(f"{m}.{sp}", 0)) for sp in sps} for m in modes}
out = {"budget_mb": budget / 1e6, "max_ctx": max_ctx}
if "long" in max_ctx and max_ctx["long"].get("1"):
    base = max_ctx["long"]["1"]
    out["growth_from_sp1"] = {sp: round(v / base, 2) for sp, v in max_ctx["long"].items()}
    out["growth_goal"] = {sp: round(0.8 * int(sp), 2) for sp in max_ctx["long"]}
if "plain" in max_ctx and max_ctx["plain"].get("1") and "long" in max_ctx:
    out["tiling_gain_sp1"] = round(max_ctx["long"]["1"] / max_ctx["plain"]["1"], 2)
lines = [json.loads(l) for l in open(same_file) if l.strip()]
if lines:
    one = next((l for l in lines if l["sp"] == 1), None)
    out["same_context"] = [{"sp": l["sp"], "context": l["context"], "activation_peak_mb": round(l["activation_peak"] / 1e6, 1),
                            "peak_rss_mb": round(l["peak_rss"] / 1e6, 1), "step_s": round(l["step_s"], 2),
                            "vs_sp1_times_p": round(l["activation_peak"] / one["activation_peak"] * l["sp"], 2) if one else None,
                            "all_to_all_bytes": l["all_to_all_bytes"], "formula": l["all_to_all_formula"]} for l in lines]
print(json.dumps(out))
EOF_PY
rm -f "$same_lines"
