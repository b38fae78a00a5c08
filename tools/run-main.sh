#!/usr/bin/env bash
# Builds zero and runs the main job on 2 local CPU ranks (README's first
# command), against the LibTorch ZERO_TORCH names (tools/torch-choice.sh).
# Arguments are passed to the job. It also builds what `cmake --install`
# copies (zero-install-set: the library and the tools, README's Install), so
# that an install works right after it: 16 more steps, about a minute on 2
# cores without ccache's objects.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/torch-choice.sh
bash tools/setup-deps.sh
bash tools/build.sh --target zero-run zero-main zero-install-set
exec "$zero_build_dir/tools/launcher/zero-run" --nproc "${ZERO_NPROC:-2}" \
  "$zero_build_dir/examples/zero-main" "$@"
