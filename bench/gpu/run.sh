#!/usr/bin/env bash
# GPU checks, for a machine with CUDA, a CUDA LibTorch in python3's torch,
# NCCL from the nvidia-nccl wheel, and the Debian packages zero needs
# unpacked from .debs/ (apt-get download them on a machine with Debian's
# registry; see tools/setup-deps.sh for the list). Writes logs and a
# summary under ${OUT:-gpu-out}.
#   bash bench/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
. bench/gpu/build.sh
gpu_build -DZERO_BUILD_EXAMPLES=OFF -- zero-run test_collectives bench_collectives || exit 1

run() {  # name, command...
  local name=$1; shift
  if timeout 300 "$@" >"$out/$name.log" 2>&1; then r=pass; else r="FAIL($?)"; fi
  echo "$name: $r $(grep -E '\[  (PASSED|FAILED|SKIPPED) \]' "$out/$name.log" | sort | uniq -c | tr '\n' ' ')" | tee -a "$out/summary.txt"
}
run nccl_1rank build-gpu/tools/launcher/zero-run --nproc 1 build-gpu/tests/comm/test_collectives
for n in 2 4; do
  ZERO_CUDA_BACKEND=gloo run "gloo_cuda_${n}ranks" build-gpu/tools/launcher/zero-run --nproc $n build-gpu/tests/comm/test_collectives
done
run bench_collectives_4 build-gpu/tools/launcher/zero-run --nproc 4 build-gpu/bench/bench_collectives --max-mib 256
cat "$out/summary.txt"
