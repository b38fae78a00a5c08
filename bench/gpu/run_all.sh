#!/usr/bin/env bash
# The GPU table in one command, for a GPU lease (one 10-minute call): runs the
# programs of the bundle bench/gpu/bundle.sh built on a CPU machine
# (.gpu-bundle/zero-gpu.tar.gz, carried with the tree), part by part, each
# within a budget of seconds, and writes under ${OUT:-gpu-out}:
#   gpu.json      every row measured (bench/gpu/summarize.py says which)
#   summary.txt   the same as a short table, with the goals
#   logs.tar.gz   every program's log
# rewritten after each part, so that what was measured is kept when a later
# part (or the call) runs out of time.
#   bash bench/gpu/run_all.sh                 # all parts
#   PARTS="speed larger" bash bench/gpu/run_all.sh
# Parts (budget in seconds, ZERO_GPU_BUDGET_<PART> changes it):
#   correctness (130)  the Cuda.* tests; the engine's parity tests (stages 0-3,
#                      fp32/bf16/fp16) with ZERO_TEST_DEVICE=cuda on 1 rank
#                      and on 2 and 4 gloo ranks sharing the GPU
#   speed       (120)  a 1.56 B GPT in bf16 at world 1: zero stages 0-3, a plain
#                      torch loop and FSDP2 (bench/gpu/torch_reference.py)
#   larger      (175)  the 6.65 B GPT with the allocator capped at 80 GB:
#                      offload_optimizer cpu (all, then ratio 0.6) against
#                      FSDP2 + CPUOffloadPolicy
#   peaks       (45)   stage 2 and 3 CUDA allocator peaks on 2 gloo ranks
#                      sharing the GPU, beside the estimate zero-config prints
#   nvme        (70)   offload_optimizer nvme and + offload_param nvme at
#                      stage 3 on the machine's disk, beside dd's O_DIRECT
#                      read and write rates measured in the same run
# A part that cannot run here (no GPU, too little GPU memory) is skipped with
# its reason. The torch beside it (ZERO_GPU_PYTHON, else python3) must be the
# version the bundle was built against; another is refused naming both.
# ZERO_GPU_REHEARSAL=1 (bench/gpu/rehearse.sh) runs every part on the CPU at
# small sizes: the same programs and commands, figures that mean nothing.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
root=$PWD
out="${OUT:-$root/gpu-out}"
rehearsal="${ZERO_GPU_REHEARSAL:-0}"
python="${ZERO_GPU_PYTHON:-python3}"
work="${ZERO_GPU_WORK:-$(mktemp -d /tmp/zero-gpu.XXXXXX)}"
parts="${PARTS:-correctness speed larger peaks nvme}"
mkdir -p "$out" "$work/logs" "$work/rows"
: >"$work/runs.jsonl"
t_start=$(date +%s)
say() { echo "$*" | tee -a "$work/logs/run_all.log"; }

# ---- the bundle ------------------------------------------------------------------
bundle="${ZERO_GPU_BUNDLE:-$root/.gpu-bundle/zero-gpu.tar.gz}"
b="$work/zero-gpu"
if [ "${ZERO_GPU_BUILD_HERE:-0}" = 1 ]; then
  # The fallback: build the same programs on this machine (bench/gpu/build.sh,
  # with the Debian packages carried in .debs/), minutes of the lease.
  . bench/gpu/build.sh
  out="$out" gpu_build -- zero-run zero-config test_collectives test_parity test_precision test_offload_engine \
    test_checkpoint bench_offload_headline bench_memory_peaks || exit 2
  mkdir -p "$b/bin" "$b/lib"
  find "$root/build-gpu" -type f -perm -u+x \( -name 'zero-run' -o -name 'zero-config' -o -name 'test_*' -o -name 'bench_*' \) \
    -exec ln -sf {} "$b/bin/" \;
  cp -L /tmp/zero-deps/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$b/lib/" 2>/dev/null || true
  "$python" -c 'import json, subprocess, torch; json.dump({"torch": torch.__version__, "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown", "built_on": "this machine"}, open("'"$b"'/BUNDLE.json", "w"))'
elif [ ! -f "$bundle" ]; then
  echo "run_all: no bundle at $bundle: run 'bash bench/gpu/bundle.sh' on a CPU machine and carry .gpu-bundle," \
       "or set ZERO_GPU_BUILD_HERE=1 to build here" >&2
  exit 2
else
  tar -C "$work" -xzf "$bundle" || { echo "run_all: cannot unpack $bundle" >&2; exit 2; }
fi
want_torch=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["torch"])' "$b/BUNDLE.json")
have_torch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) \
  || { echo "run_all: $python cannot import torch; the bundle needs torch $want_torch beside it" >&2; exit 2; }
if [ "$have_torch" != "$want_torch" ]; then
  echo "run_all: the bundle was built against torch $want_torch, but $python has torch $have_torch;" \
       "rebuild it against this one (bench/gpu/requirements.txt, bash bench/gpu/bundle.sh)" >&2
  exit 2
fi
# LibTorch, CUDA's runtime and NCCL: the machine's torch's own. The bundle's
# programs find its libraries through their RUNPATH ($ORIGIN/../lib), so
# that Python here never loads Debian's builds of them.
. bench/gpu/torch_paths.sh
export LD_LIBRARY_PATH="$torch_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# zero-run's allocator, as on CPU ranks.
[ -f "$b/lib/libtcmalloc_minimal.so.4" ] && export ZERO_ALLOCATOR="$b/lib/libtcmalloc_minimal.so.4"
export ZERO_COMM_TIMEOUT="${ZERO_COMM_TIMEOUT:-120}"
bin="$b/bin"

# ---- the machine -------------------------------------------------------------------
"$python" - "$work/machine.json" "$rehearsal" <<'EOF' 2>"$work/logs/probe.log"
import json, os, platform, subprocess, sys, warnings
path, rehearsal = sys.argv[1], sys.argv[2] == "1"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    ok = torch.cuda.is_available()
m = {"torch": torch.__version__, "cuda": torch.version.cuda, "cpus": os.cpu_count(), "rehearsal": rehearsal,
     "os": platform.freedesktop_os_release().get("PRETTY_NAME", ""), "gpu": None}
try:
    m["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
except Exception:
    m["driver"] = ""
if ok:
    p = torch.cuda.get_device_properties(0)
    m["gpu"] = {"name": p.name, "memory_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}",
                "count": torch.cuda.device_count()}
else:
    m["no_gpu_reason"] = "; ".join(str(w.message).splitlines()[0] for w in caught) or "torch sees no CUDA device"
json.dump(m, open(path, "w"), indent=1)
EOF
gpu_mem=$("$python" -c 'import json, sys; g = json.load(open(sys.argv[1]))["gpu"]; print(g["memory_bytes"] if g else 0)' "$work/machine.json")
no_gpu=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("no_gpu_reason", ""))' "$work/machine.json")
if [ "$rehearsal" = 1 ]; then
  device=cpu
  say "run_all: rehearsal on the CPU: torch $have_torch, bundle $(sed -n 's/.*"commit": "\(.\{10\}\).*/\1/p' "$b/BUNDLE.json")"
else
  device=cuda
  say "run_all: torch $have_torch, GPU: $("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpu"])' "$work/machine.json")"
fi

# ---- running, with a budget per part ---------------------------------------------------
part=""; deadline=0
left() { echo $(( deadline - $(date +%s) )); }
record() {  # JSON fields of one run (or a skipped part), to runs.jsonl
  "$python" -c 'import json, sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' "$@" >>"$work/runs.jsonl"
}
# run NAME command...: within what is left of the part's budget; the log in
# logs/NAME.log. The benchmarks append their JSON rows to rows/NAME.jsonl (--out).
run() {
  local name=$1; shift
  local limit; limit=$(left)
  if [ "$limit" -lt 5 ]; then record part "$part" name "$name" status "not started: the part's budget was spent"; say "  $name: not started (budget spent)"; return 1; fi
  local t rc
  t=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$work/logs/$name.log" 2>&1; rc=$?
  local took=$(( $(date +%s) - t )) status="done"
  [ "$rc" = 0 ] || status="failed (exit $rc)"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && status="stopped at the part's budget (${limit} s)"
  local tests; tests=$(grep -aoE '\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$work/logs/$name.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  record part "$part" name "$name" status "$status" seconds "$took" rc "$rc" tests "$tests" command "$*"
  say "  $name: $status in ${took} s ${tests:+($tests)}"
  return "$rc"
}
skip_part() { record part "$1" name "$1" status "skipped: $2"; say "$1: skipped: $2"; }
finish_part() {  # gpu.json, summary.txt and the logs, as far as measured
  "$python" "$root/bench/gpu/summarize.py" --work "$work" --json "$out/gpu.json" --summary "$out/summary.txt" >/dev/null 2>"$work/logs/summarize.log" \
    || say "run_all: summarize.py failed: $(tail -1 "$work/logs/summarize.log")"
  tar -C "$work" -czf "$out/logs.tar.gz" logs rows runs.jsonl machine.json zero-gpu/BUNDLE.json
}
start_part() {  # name, default budget
  part=$1
  local var="ZERO_GPU_BUDGET_${1^^}"
  deadline=$(( $(date +%s) + ${!var:-$2} ))
  say "$part: budget ${!var:-$2} s"
}
needs_gpu() {  # GB the part needs; says why not and returns 1
  [ "$rehearsal" = 1 ] && return 0
  if [ -n "$no_gpu" ]; then skip_part "$part" "$no_gpu"; return 1; fi
  if [ "$gpu_mem" -lt $(( $1 * 1000000000 )) ]; then
    skip_part "$part" "needs $1 GB of GPU memory; the GPU has $(( gpu_mem / 1000000000 )) GB"; return 1
  fi
}

# Sizes: the lease's, or the rehearsal's (small, CPU).
if [ "$rehearsal" = 1 ]; then
  gpt_speed="--depth 2 --width 64 --heads 2 --context 32 --micro 2"
  gpt_large="--depth 2 --width 96 --heads 2 --context 32 --micro 2"
  gpt_mid="--depth 2 --width 64 --heads 2 --context 32 --micro 2"
  cap=0 steps=2 dd_mib=64 test_filter="--gtest_filter=Cuda.*:Parity.AdamWStage*:Fp16.*:Bf16.*"
else
  gpt_speed="--depth 48 --width 1600 --heads 25 --context 1024 --micro 4"   # 1.56 B
  gpt_large="--depth 32 --width 4096 --heads 32 --context 1024 --micro 2"   # 6.65 B, 106 GB of state
  gpt_mid="--depth 24 --width 1024 --heads 16 --context 1024 --micro 2"     # 0.35 B
  cap=80 steps=3 dd_mib=4096 test_filter=""
fi
headline="$bin/bench_offload_headline"

for p in $parts; do
  case "$p" in
  correctness)
    start_part correctness 130
    if needs_gpu 1; then
      run offload_cuda "$bin/zero-run" --nproc 1 "$bin/test_offload_engine" --gtest_filter='Cuda.*'
      run ckpt_cuda "$bin/zero-run" --nproc 1 "$bin/test_checkpoint" --gtest_filter='Cuda.*'
      run collectives_nccl_1 "$bin/zero-run" --nproc 1 "$bin/test_collectives"
      ZERO_TEST_DEVICE=$device run parity_1 "$bin/zero-run" --nproc 1 "$bin/test_parity" $test_filter
      ZERO_TEST_DEVICE=$device run precision_1 "$bin/zero-run" --nproc 1 "$bin/test_precision" $test_filter
      for n in 2 4; do
        ZERO_CUDA_BACKEND=gloo run "collectives_gloo_$n" "$bin/zero-run" --nproc $n "$bin/test_collectives"
        ZERO_CUDA_BACKEND=gloo ZERO_TEST_DEVICE=$device run "parity_gloo_$n" "$bin/zero-run" --nproc $n "$bin/test_parity" $test_filter
      done
      ZERO_CUDA_BACKEND=gloo ZERO_TEST_DEVICE=$device run precision_gloo_2 "$bin/zero-run" --nproc 2 "$bin/test_precision" $test_filter
    fi ;;
  speed)
    start_part speed 120
    if needs_gpu 40; then
      for s in 2 3 0 1; do
        run "speed_zero_stage$s" env ZERO_LOG_LEVEL=warn "$headline" --device $device --offload none --stage $s \
          --steps $steps $gpt_speed --out "$work/rows/speed_zero_stage$s.jsonl"
      done
      for mode in plain fsdp2; do
        run "speed_torch_$mode" "$python" bench/gpu/torch_reference.py --mode $mode --device $device --adam fused \
          --steps $steps $gpt_speed --out "$work/rows/speed_torch_$mode.jsonl"
      done
    fi ;;
  larger)
    start_part larger 175
    if needs_gpu "$cap"; then
      run large_zero_offload env ZERO_LOG_LEVEL=warn "$headline" --device $device --cap-gb $cap --offload cpu \
        --steps 2 $gpt_large --out "$work/rows/large_zero_offload.jsonl"
      run large_fsdp2_offload "$python" bench/gpu/torch_reference.py --mode fsdp2-offload --device $device \
        --cap-gb $cap --steps 2 $gpt_large --out "$work/rows/large_fsdp2_offload.jsonl"
      run large_zero_ratio env ZERO_LOG_LEVEL=warn "$headline" --device $device --cap-gb $cap --offload cpu --ratio 0.6 \
        --steps 2 $gpt_large --out "$work/rows/large_zero_ratio.jsonl"
    fi ;;
  peaks)
    start_part peaks 45
    if needs_gpu 20; then
      for s in 2 3; do
        ZERO_CUDA_BACKEND=gloo run "peaks_stage$s" "$bin/zero-run" --nproc 2 "$bin/bench_memory_peaks" --device $device --stage $s \
          --dtype bf16 --steps 2 $gpt_mid --out "$work/rows/peaks_stage$s.jsonl"
      done
      # The model and settings bench_memory_peaks trained (bench/gpt_bench.h; its
      # vocabulary is the corpus's, hence --params), asked as a user would.
      echo '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW"},
             "zero_optimization": {"stage": 3, "reduce_bucket_size": 500000}}' >"$work/peaks_config.json"
      params=$(grep -ho '"params": [0-9]*' "$work"/rows/peaks_stage*.jsonl 2>/dev/null | head -1 | grep -o '[0-9]*$')
      run peaks_estimate "$bin/zero-config" "$work/peaks_config.json" --estimate $gpt_mid --params "${params:-0}" --world-size 2 --json
    fi ;;
  nvme)
    start_part nvme 70
    if needs_gpu 20; then
      nvme_dir="${ZERO_GPU_NVME:-$root/.gpu-nvme}"
      mkdir -p "$nvme_dir"
      run disk_write dd if=/dev/zero of="$nvme_dir/probe" bs=1M count=$dd_mib oflag=direct conv=fsync
      run disk_read dd if="$nvme_dir/probe" of=/dev/null bs=1M iflag=direct
      rm -f "$nvme_dir/probe"
      for o in nvme nvme+param; do
        run "nvme_${o/+/_}" env ZERO_LOG_LEVEL=warn "$headline" --device $device --stage 3 --offload "$o" \
          --nvme-path "$nvme_dir" --steps 2 $gpt_mid --out "$work/rows/nvme_${o/+/_}.jsonl"
      done
      rm -rf "$nvme_dir"
    fi ;;
  *) echo "run_all: unknown part '$p'; the parts are correctness speed larger peaks nvme" >&2; exit 2 ;;
  esac
  finish_part
done
say "run_all: done in $(( $(date +%s) - t_start )) s"
finish_part
cat "$out/summary.txt"
