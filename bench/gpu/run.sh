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
deps=/tmp/zero-deps
if [ -d .debs ]; then
  mkdir -p "$deps"
  for f in .debs/*.deb; do dpkg -x "$f" "$deps"; done
fi
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
nccl_root=$(python3 -c "import nvidia.nccl,os;print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export NCCL_ROOT="$nccl_root"
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib:${nccl_root:+$nccl_root/lib:}${LD_LIBRARY_PATH:-}"
[ -e "$nccl_root/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl_root/lib/libnccl.so" 2>/dev/null || true

start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu" \
  -DZERO_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target zero-run test_collectives bench_collectives >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s" | tee "$out/summary.txt"

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
