#!/usr/bin/env bash
# Builds zero and runs its whole test suite (README's second command), then
# the torch-free half of it again under AddressSanitizer + UBSan (config
# reader, checkpoint format and tools, fuzz corpora; tools/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh
(cd "${ZERO_BUILD_DIR:-build}" && ctest --output-on-failure --timeout 300 -j "${ZERO_TEST_JOBS:-2}")
bash tools/sanitize.sh address --quick
