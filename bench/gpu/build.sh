# Sourced by the GPU scripts, from the project root with $out set: unpacks
# the Debian packages from .debs/ (made on a Debian 12 machine; .debs/ is
# ignored by git and travels as a carried path):
#   mkdir -p .debs && (cd .debs && apt-get download liburing-dev liburing2 \
#     nlohmann-json3-dev libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 \
#     libhwloc15 libgtest-dev libgloo-dev libgloo0 libhiredis0.14 libibverbs1 \
#     libnl-3-200 libnl-route-3-200 libxxhash-dev libxxhash0 libzip-dev libzip4)
# (2 MB; yaml-cpp and protobuf are optional and left out), and
# configures and builds build-gpu for the targets given, finding LibTorch
# and NCCL the way ZERO_TORCH=wheel does (cmake/TorchChoice.cmake): from
# python3's torch package and its nvidia-nccl wheel.
#   gpu_build [cmake -D options...] -- target...
gpu_build() {
  local defs=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do defs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  targets=("$@")
  local deps=/tmp/zero-deps
  if [ -d .debs ]; then
    mkdir -p "$deps"
    for f in .debs/*.deb; do dpkg -x "$f" "$deps"; done
  fi
  local nccl_root
  nccl_root=$(python3 -c "import nvidia.nccl,os;print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:$deps/usr/lib:${nccl_root:+$nccl_root/lib:}${LD_LIBRARY_PATH:-}"
  local start
  start=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DZERO_TORCH_PYTHON="$(command -v python3)" -DCMAKE_PREFIX_PATH="$deps/usr" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu" \
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$deps/usr/lib/x86_64-linux-gnu" \
    ${defs[@]+"${defs[@]}"} >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; return 1; }
  cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; return 1; }
  echo "build: $(( $(date +%s) - start )) s" | tee "$out/summary.txt"
}
