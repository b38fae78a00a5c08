# Sourced by the tools scripts, from the project root: which LibTorch zero
# builds against, from ZERO_TORCH.
#   debian  Debian's libtorch-dev (1.13, CPU only): the default (README
#           says why)
#   wheel   the torch 2.x wheel from PyPI, with CUDA, in the project's
#           .venv, beside the Python peers (deepspeed, transformers, ...)
# Sets zero_torch, zero_venv (ZERO_VENV or ./.venv), zero_python (the
# venv's interpreter, wheel only) and zero_build_dir (ZERO_BUILD_DIR, else
# build for debian and build-wheel for wheel, so both can live side by side).
zero_torch="${ZERO_TORCH:-debian}"
case "$zero_torch" in
  debian | wheel) ;;
  *)
    echo "zero: ZERO_TORCH=$zero_torch is not a choice; use debian (Debian's LibTorch 1.13, CPU) or wheel (the torch 2.x wheel with CUDA, in .venv)" >&2
    exit 2
    ;;
esac
zero_venv="${ZERO_VENV:-$PWD/.venv}"
zero_python=""
zero_build_dir="${ZERO_BUILD_DIR:-build}"
if [ "$zero_torch" = wheel ]; then
  zero_python="$zero_venv/bin/python"
  zero_build_dir="${ZERO_BUILD_DIR:-build-wheel}"
fi
