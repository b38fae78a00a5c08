#!/usr/bin/env bash
# Installs what zero needs from Debian's packages when it is missing.
# Safe to run twice: packages already installed are left alone.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libopenblas0-openmp     # LibTorch calls libblas.so.3: the reference BLAS is ~15x slower
  libgloo-dev             # collectives on host tensors
  libtbb-dev liburing-dev nlohmann-json3-dev
  libxxhash-dev           # checkpoint checksums
  libprotobuf-dev protobuf-compiler  # TensorBoard's event messages (monitor/)
  python3-protobuf        # the tests' independent reader of those event files
  libtcmalloc-minimal4    # the allocator zero-run preloads (tools/launcher/allocator.h)
  libyaml-cpp-dev         # launch config files in Accelerate's YAML (accelerate/)
  fio                     # reference for the NVMe swapper benchmark
  libgtest-dev libbenchmark-dev
)

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
