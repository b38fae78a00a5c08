#!/usr/bin/env bash
# Builds zero and runs the main job on 2 local CPU ranks (README's first
# command). Arguments are passed to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh --target zero-run zero-main
exec "${ZERO_BUILD_DIR:-build}/tools/launcher/zero-run" --nproc "${ZERO_NPROC:-2}" \
  "${ZERO_BUILD_DIR:-build}/examples/zero-main" "$@"
