#!/usr/bin/env bash
# Builds zero and runs its whole test suite (README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh
cd "${ZERO_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 300 -j "${ZERO_TEST_JOBS:-2}"
