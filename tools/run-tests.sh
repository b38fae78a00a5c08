#!/usr/bin/env bash
# Builds zero and runs its whole test suite (README's second command), then
# the torch-free half of it again under AddressSanitizer + UBSan (config
# reader, checkpoint format and tools, fuzz corpora; tools/sanitize.sh),
# against the LibTorch ZERO_TORCH names (tools/torch-choice.sh). CI runs it
# once for each (.ci/run). ZERO_TEST_SANITIZE=0 leaves out the sanitizer half,
# which uses no LibTorch: CI runs it with the first choice only.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/torch-choice.sh
bash tools/setup-deps.sh
bash tools/build.sh
(cd "$zero_build_dir" && ctest --output-on-failure --timeout 300 -j "${ZERO_TEST_JOBS:-2}")
[ "${ZERO_TEST_SANITIZE:-1}" = 0 ] || bash tools/sanitize.sh address --quick
