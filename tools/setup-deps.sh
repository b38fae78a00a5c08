#!/usr/bin/env bash
# Installs what zero needs when it is missing: Debian's packages, and with
# ZERO_TORCH=wheel the torch 2.x wheel and the Python peers in ./.venv
# (tools/torch-choice.sh). Safe to run twice: what is installed is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/torch-choice.sh

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas0-openmp     # LibTorch calls libblas.so.3: the reference BLAS is ~15x slower
  libgloo-dev             # collectives on host tensors
  libtbb-dev liburing-dev nlohmann-json3-dev
  libxxhash-dev           # checkpoint checksums
  libzip-dev              # torch.save's zip container (torchsave/: DeepSpeed checkpoints)
  libprotobuf-dev protobuf-compiler  # TensorBoard's event messages (monitor/)
  python3-protobuf        # the tests' independent reader of those event files
  libtcmalloc-minimal4    # the allocator zero-run preloads (tools/launcher/allocator.h)
  libyaml-cpp-dev         # launch config files in Accelerate's YAML (accelerate/)
  fio                     # reference for the NVMe swapper benchmark
  patchelf                # the GPU bundle's programs find their libraries beside them (bench/gpu/bundle.sh)
  libgtest-dev libbenchmark-dev
)
case "$zero_torch" in
  debian) packages+=(libtorch-dev) ;;   # LibTorch 1.13 (CPU)
  wheel) packages+=(python3-venv        # the .venv below
                   python3-dev          # Python.h: DeepSpeed compiles its CPU ops (cpu_adam, fused_adam) on first use
                   libaio-dev) ;;       # DeepSpeed's async I/O op, for its NVMe rows (bench/run_vs_deepspeed.sh)
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "zero: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Two LibTorch builds, each with a precompiled torch header of 0.7-0.9 GB,
# overflow ccache's default 5 GB: it then evicts what the next build needs.
if command -v ccache >/dev/null; then
  max=$(ccache -k max_size 2>/dev/null || echo 0)
  case "$max" in
    *G) [ "${max%.*G}" -ge 25 ] 2>/dev/null || ccache -M 25G >/dev/null ;;
    *) ccache -M 25G >/dev/null ;;
  esac
fi

[ "$zero_torch" = wheel ] || exit 0

# ---- ZERO_TORCH=wheel: torch and the peers, pinned, in .venv ---------------
requirements=tools/python-requirements.txt
stamp="$zero_venv/.zero-requirements"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
# zero's own Python package: the build makes it in <build>/python (python/
# CMakeLists.txt); this line puts that folder on the .venv's path, so that
# `import zero` finds it once built (pip install ./python makes a copy of
# its own instead).
put_package_on_path() {
  local site
  site=$("$zero_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  case "$zero_build_dir" in /*) echo "$zero_build_dir/python" ;; *) echo "$PWD/$zero_build_dir/python" ;; esac \
    >"$site/zero-build.pth"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  put_package_on_path
  exit 0
fi

# Measured on a fresh install (README): .venv takes 5.7 GiB; pip unpacks
# beside it.
need_gib=8
free_gib() { df -Pk "$1" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
parent=$(dirname "$zero_venv")
if awk -v f="$(free_gib "$parent")" -v n="$need_gib" 'BEGIN { exit !(f < n) }'; then
  echo "zero: ZERO_TORCH=wheel needs about $need_gib GiB free for $zero_venv; $parent has $(free_gib "$parent") GiB free" >&2
  exit 1
fi

# A venv left by an interrupted or older install is made anew, and one that
# fails half-way is removed: no half-made .venv, and no fallback to Debian's
# LibTorch.
rm -rf "$zero_venv"
installing=""
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    rm -rf "$zero_venv"
    echo "zero: ZERO_TORCH=wheel: installing ${installing:-the virtual environment} into $zero_venv failed (see pip's message above);" \
      "the whole install needs about $need_gib GiB and $(free_gib "$parent") GiB are free; $zero_venv was removed" >&2
  fi
}
trap cleanup EXIT
echo "zero: making $zero_venv with the torch wheel and the Python peers ($requirements)"
installing="python3 -m venv"
/usr/bin/python3 -m venv "$zero_venv"
# torch first: deepspeed's setup.py imports it while building.
for top in torch numpy deepspeed accelerate transformers safetensors tensorboard; do
  installing=$(grep -i "^$top==" "$requirements")
  "$zero_venv/bin/pip" install --disable-pip-version-check -q -c "$requirements" "$installing"
done
"$zero_python" -c 'import torch' >/dev/null
put_package_on_path
echo "$want" >"$stamp"
echo "zero: $zero_venv ready: torch $("$zero_python" -c 'import torch; print(torch.__version__)'), $(du -sh "$zero_venv" | cut -f1)"
