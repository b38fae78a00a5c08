#!/usr/bin/env bash
# Builds the GPU bundle on this (CPU) machine, so that a GPU lease runs
# programs instead of compiling them: zero's library, tools, GPU tests and
# GPU benchmarks, compiled against the LibTorch the GPU machine has
# (torch 2.11.0 with CUDA 13.0, pinned in bench/gpu/requirements.txt and
# installed into its own environment, ./.venv-gpu), stripped, with the
# Debian libraries they load, in one archive:
#   .gpu-bundle/zero-gpu.tar.gz   (ignored by git; carried to the lease)
# Inside, zero-gpu/: bin/ (RUNPATH $ORIGIN/../lib), lib/ (libzero and the
# Debian libraries, RUNPATH $ORIGIN) and BUNDLE.json (the torch it was built
# against, the commit, the programs). LibTorch, CUDA and NCCL are not in it:
# they come from the GPU machine's own torch (bench/gpu/run_all.sh puts them
# on LD_LIBRARY_PATH and refuses a torch of another version).
#   bash bench/gpu/bundle.sh        # rebuilds only what changed
# Environment: ZERO_GPU_VENV (./.venv-gpu), ZERO_GPU_BUILD_DIR (./build-gpu-bundle).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv="${ZERO_GPU_VENV:-$root/.venv-gpu}"
build="${ZERO_GPU_BUILD_DIR:-$root/build-gpu-bundle}"
out_dir="$root/.gpu-bundle"
requirements=bench/gpu/requirements.txt
# What the lease runs (bench/gpu/run_all.sh); zero-install-set's library and
# tools come along with them.
programs=(zero-run zero-config test_collectives test_parity test_precision test_offload_engine test_checkpoint
          bench_offload_headline bench_memory_peaks)

bash tools/setup-deps.sh   # Debian's packages (the build's and the bundle's libraries)

# ---- the environment with the GPU machine's torch ----------------------------
stamp="$venv/.zero-requirements"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "zero: making $venv with torch from $requirements (about 4 GiB)"
  rm -rf "$venv"
  trap 'rc=$?; [ $rc = 0 ] || { rm -rf "$venv"; echo "zero: installing $venv failed (pip said why above); removed it" >&2; }' EXIT
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$requirements"
  trap - EXIT
  echo "$want" >"$stamp"
fi
python="$venv/bin/python"
torch_version=$("$python" -c 'import torch; print(torch.__version__)')
cuda_version=$("$python" -c 'import torch; print(torch.version.cuda)')

# ---- the build: Release, CUDA on, only the programs above ----------------------
start=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_TORCH_PYTHON="$python" >/dev/null
fi
cmake --build "$build" -j "${ZERO_JOBS:-$(nproc)}" --target "${programs[@]}"
build_s=$(( $(date +%s) - start ))

# ---- the bundle ----------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b="$stage/zero-gpu"
mkdir -p "$b/bin" "$b/lib"
for p in "${programs[@]}"; do
  f=$(find "$build" -type f -name "$p" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "zero: $p was not built in $build" >&2; exit 1; }
  cp "$f" "$b/bin/"
done
cp -L "$build"/libzero.so.0 "$b/lib/"
# A LibTorch without CUDA would build a bundle that runs nothing on the GPU.
readelf -d "$b/lib/libzero.so.0" | grep -q 'libc10_cuda.so' \
  || { echo "zero: $build's libzero does not link c10_cuda: $python's torch $torch_version has no CUDA" >&2; exit 1; }
cp -L "$(find "$build" -name 'libzero_activations.so.0' | head -1)" "$b/lib/"

# The libraries the programs load that neither the GPU machine's torch nor
# its base system provides: resolved here with torch's folders first, as the
# lease resolves them; glibc, libstdc++ and the driver's libcuda stay the
# machine's own (newer there: Ubuntu 24.04).
. bench/gpu/torch_paths.sh
system_libs='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libutil)\.so'
for f in "$b"/bin/* "$b"/lib/libzero*.so.0; do
  LD_LIBRARY_PATH="$b/lib:$torch_path" ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$path" in "$site"/* | "$b"/*) continue ;; esac
  if [[ "$name" =~ $system_libs ]]; then continue; fi
  [ -f "$b/lib/$name" ] || cp -L "$path" "$b/lib/$name"
done
# zero-run's allocator (tools/launcher/allocator.h), as on CPU ranks.
cp -L /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$b/lib/"
strip --strip-unneeded "$b"/bin/* "$b"/lib/*
patchelf --set-rpath '$ORIGIN/../lib' "$b"/bin/*
for f in "$b"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

commit=$(git rev-parse HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -c . || true)
"$python" - "$b/BUNDLE.json" "$torch_version" "$cuda_version" "$commit" "$dirty" "$build_s" "${programs[@]}" <<'EOF'
import json, os, platform, sys, time
path, torch_version, cuda, commit, dirty, build_s, *programs = sys.argv[1:]
libs = sorted(os.listdir(os.path.join(os.path.dirname(path), "lib")))
json.dump({"torch": torch_version, "cuda": cuda, "commit": commit, "uncommitted_files": int(dirty),
           "built": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "built_on": platform.freedesktop_os_release().get("PRETTY_NAME", ""),
           "glibc": platform.libc_ver()[1], "build_s": int(build_s), "programs": programs, "libraries": libs},
          open(path, "w"), indent=1)
EOF
mkdir -p "$out_dir"
tar -C "$stage" -czf "$out_dir/zero-gpu.tar.gz.part" zero-gpu
mv "$out_dir/zero-gpu.tar.gz.part" "$out_dir/zero-gpu.tar.gz"
echo "zero: $out_dir/zero-gpu.tar.gz: $(du -h "$out_dir/zero-gpu.tar.gz" | cut -f1), torch $torch_version (CUDA $cuda_version)," \
     "${#programs[@]} programs, $(ls "$b/lib" | wc -l) libraries; build ${build_s} s"
