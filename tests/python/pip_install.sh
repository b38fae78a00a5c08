#!/usr/bin/env bash
# `pip install --no-build-isolation ./python` makes a package that stands on
# its own: installed into a fresh folder (pip --target), with no build
# folder on the path, it loads its own libraries (zero._C finds libzero
# beside itself) and trains: test_api's stage-3 case against torch.optim.
# Usage: pip_install.sh PYTHON BUILD_DIR WORK
set -euo pipefail
python="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" build="$(cd "$2" && pwd)" work="$3"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work" && mkdir -p "$work"
ZERO_BUILD_DIR="$build" "$python" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
  --target "$work/site" "$here/../../python"
ls "$work/site/zero"
cd "$here"
PYTHONPATH="$work/site" "$python" - << 'EOF_PY'
import os, sys
import zero
assert zero.__file__.startswith(os.environ["PYTHONPATH"]), f"zero came from {zero.__file__}"
lib = [l for l in open(f"/proc/{os.getpid()}/maps") if "libzero.so" in l]
assert lib and lib[0].split()[-1].startswith(os.environ["PYTHONPATH"]), f"libzero loaded from {lib}"
print("installed zero", zero.__file__, "with", lib[0].split()[-1])
EOF_PY
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$work/site" OMP_NUM_THREADS=1 "$python" -m unittest test_api.SameAsTorch.test_stage3_units_released_between_steps
