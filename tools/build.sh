#!/usr/bin/env bash
# Configures and builds zero into ./build (or $ZERO_BUILD_DIR). Extra
# arguments go to `cmake --build` (e.g. --target zero-run).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${ZERO_BUILD_DIR:-build}"
jobs="${ZERO_JOBS:-$(nproc)}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build_dir" -j "$jobs" "$@"
