#!/usr/bin/env bash
# Configures and builds zero against the LibTorch ZERO_TORCH names
# (tools/torch-choice.sh: debian into ./build, wheel into ./build-wheel;
# ZERO_BUILD_DIR overrides). Extra arguments go to `cmake --build` (e.g.
# --target zero-run).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/torch-choice.sh
jobs="${ZERO_JOBS:-$(nproc)}"
if [ "$zero_torch" = wheel ] && [ ! -x "$zero_python" ]; then
  echo "zero: ZERO_TORCH=wheel but $zero_python is missing; run ZERO_TORCH=wheel bash tools/setup-deps.sh first" >&2
  exit 1
fi
cache="$zero_build_dir/CMakeCache.txt"
if [ -f "$cache" ]; then
  # A build folder holds one LibTorch: never mix the two in one.
  had=$(sed -n 's/^ZERO_TORCH_PYTHON:FILEPATH=//p' "$cache")
  if [ "$had" != "$zero_python" ]; then
    echo "zero: $zero_build_dir was configured with ZERO_TORCH_PYTHON='$had', not ZERO_TORCH=$zero_torch's '$zero_python';" \
      "remove it or set ZERO_BUILD_DIR to another folder" >&2
    exit 1
  fi
else
  cmake -S . -B "$zero_build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_TORCH_PYTHON="$zero_python"
fi
cmake --build "$zero_build_dir" -j "$jobs" "$@"
