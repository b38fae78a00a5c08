#!/usr/bin/env bash
# The offload headline on one GPU (see bench/offload_headline.cpp): a
# GPT-style model of about 6.65 B parameters (106 GB of mixed-precision
# training state) with the CUDA allocator capped at CAP_GB (80), trained
# with offload_optimizer "cpu", all of it and a share (partial offload);
# the same model without offload (expected to run out of memory); and
# FSDP2 + CPUOffloadPolicy on the same model and batch
# (bench/gpu/fsdp2_offload.py), all in this one run. The offload and
# checkpoint tests on CUDA and a small model go first, as checks that the
# CUDA path works at all.
# Same machine requirements as bench/gpu/run.sh. Writes results.jsonl,
# logs and summary.txt under ${OUT:-gpu-out}.
#   bash bench/gpu/run_offload.sh
# Environment: CAP_GB (80), SIZE ("--depth 32 --width 4096 --heads 32
# --context 1024 --micro 2"), STEPS (3), RATIO (0.6: the partial-offload
# run offloads that share of the optimizer and keeps the rest on the GPU),
# ADAM ("foreach": FSDP2's AdamW; "foreach fused" runs both), SKIP (names of
# runs to leave out: offload_cuda, ckpt_cuda, small, none, offload, partial,
# fsdp2). Where one command may run at most 10 minutes, split it in two
# (the build is reused; results.jsonl and summary.txt accumulate):
#   SKIP="none offload partial fsdp2" bash bench/gpu/run_offload.sh
#   SKIP="offload_cuda ckpt_cuda" bash bench/gpu/run_offload.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
results="$out/results.jsonl"
. bench/gpu/build.sh
gpu_build -- bench_offload_headline test_checkpoint test_offload_engine zero-run || exit 1

cap="${CAP_GB:-80}"
size="${SIZE:---depth 32 --width 4096 --heads 32 --context 1024 --micro 2}"
steps="${STEPS:-3}"
skip=" ${SKIP:-} "
bin=build-gpu/bench/bench_offload_headline
run() {  # name, timeout s, command...
  local name=$1 limit=$2; shift 2
  case "$skip" in *" $name "*) return 0 ;; esac
  local t=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then r=done; else r="FAIL($?)"; fi
  grep '^{"result"' "$out/$name.log" >>"$results"
  echo "$name: $r in $(( $(date +%s) - t )) s: $(grep '^{"result"' "$out/$name.log" | head -c 600)" | tee -a "$out/summary.txt"
  [ "$r" = done ]
}
# Offload on the GPU against no offload, checkpoints on the GPU (exact
# resume, a CPU checkpoint loading there), then the CUDA path at a small
# size, with and without offload: stop if that fails.
run offload_cuda 180 build-gpu/tools/launcher/zero-run --nproc 1 build-gpu/tests/offload/test_offload_engine --gtest_filter='Cuda.*'
grep -E '\[  (PASSED|FAILED|SKIPPED) \]|Failure' "$out/offload_cuda.log" | head -20 | tee -a "$out/summary.txt"
run ckpt_cuda 180 build-gpu/tools/launcher/zero-run --nproc 1 build-gpu/tests/ckpt/test_checkpoint --gtest_filter='Cuda.*:ExactResume.Stage2*:NvmeOffload.*'
grep -E '\[  (PASSED|FAILED|SKIPPED) \]|Failure' "$out/ckpt_cuda.log" | head -20 | tee -a "$out/summary.txt"
run small 150 sh -c "ZERO_LOG_LEVEL=warn $bin --device cuda --offload cpu --steps 3 && ZERO_LOG_LEVEL=warn $bin --device cuda --offload cpu --ratio 0.5 --steps 3 && ZERO_LOG_LEVEL=warn $bin --device cuda --offload none --steps 3" || exit 1
run none 240 env ZERO_LOG_LEVEL=warn $bin --device cuda --cap-gb "$cap" --offload none --steps "$steps" $size
run offload 420 env ZERO_LOG_LEVEL=warn $bin --device cuda --cap-gb "$cap" --offload cpu --steps "$steps" $size
run partial 420 env ZERO_LOG_LEVEL=warn $bin --device cuda --cap-gb "$cap" --offload cpu --ratio "${RATIO:-0.6}" --steps "$steps" $size
for adam in ${ADAM:-foreach}; do
  run fsdp2 420 python3 bench/gpu/fsdp2_offload.py --cap-gb "$cap" --adam "$adam" --steps 2 $size
done
python3 - "$results" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ours = [r for r in rows if r.get("offload") == "cpu" and r.get("params", 0) > 1e9 and not r["oom"]]
refs = [r for r in rows if r.get("reference") and not r["oom"]]
for r in rows:
    name = r.get("reference") or f"zero offload={r['offload']} ratio={r.get('ratio', 1)}"
    print(f"{name} ({r.get('adam', '')}): params {r.get('params', 0)/1e9:.2f} B, oom {r['oom']}, "
          f"step {r.get('step_s_median', float('nan')):.3f} s, device peak {r.get('device_peak_bytes', -1)/1e9:.1f} GB, "
          f"host peak {r.get('host_peak_rss_bytes', -1)/1e9:.1f} GB")
for ref in refs:
    for o in ours:
        print(f"FSDP2 ({ref['adam']}) / zero (ratio {o.get('ratio', 1)}): {ref['step_s_median'] / o['step_s_median']:.2f}x (goal >= 4)")
EOF
