# Which LibTorch zero builds against, checked before anything uses it.
#
# ZERO_TORCH_PYTHON: a Python interpreter whose `torch` package carries the
# LibTorch to use (the PyPI wheel: headers, libraries, TorchConfig.cmake,
# usually with CUDA). tools/build.sh sets it to .venv/bin/python under
# ZERO_TORCH=wheel, bench/gpu/build.sh to the GPU machine's python3. Empty:
# find_package(Torch) as CMAKE_PREFIX_PATH says (Debian's libtorch-dev).
set(ZERO_TORCH_PYTHON "" CACHE FILEPATH "Python whose torch package provides LibTorch (empty: find_package(Torch) as configured)")
set(ZERO_TORCH_MIN_VERSION 1.13)
set(ZERO_TORCH_NCCL_ROOT "")

if(ZERO_TORCH_PYTHON)
  execute_process(
    COMMAND "${ZERO_TORCH_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _zero_torch_root ERROR_VARIABLE _zero_torch_err RESULT_VARIABLE _zero_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _zero_torch_rc EQUAL 0)
    string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _zero_torch_err "${_zero_torch_err}")
    message(FATAL_ERROR "zero: ZERO_TORCH_PYTHON=${ZERO_TORCH_PYTHON} cannot import torch (${_zero_torch_err}); "
                        "install it with ZERO_TORCH=wheel bash tools/setup-deps.sh")
  endif()
  # The package root first: TorchConfig looks for libtorch.so in the default
  # paths too, and would otherwise take Debian's beside the wheel's headers.
  list(PREPEND CMAKE_PREFIX_PATH "${_zero_torch_root}" "${_zero_torch_root}/share/cmake")
  execute_process(
    COMMAND "${ZERO_TORCH_PYTHON}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE ZERO_TORCH_NCCL_ROOT ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(ZERO_TORCH_NCCL_ROOT)
    # libtorch_cuda needs that NCCL: the linker must resolve it there, not in
    # the CUDA toolkit's lib folder (an older libnccl.so.2 that the rpath of
    # every program names too).
    add_link_options("LINKER:-rpath-link,${ZERO_TORCH_NCCL_ROOT}/lib")
  endif()
endif()

find_package(Torch REQUIRED)

if(Torch_VERSION VERSION_LESS ZERO_TORCH_MIN_VERSION)
  message(FATAL_ERROR "zero: LibTorch ${Torch_VERSION} found at ${TORCH_INSTALL_PREFIX}; zero needs ${ZERO_TORCH_MIN_VERSION} or newer")
endif()
# TorchConfig.cmake and the libtorch.so it found must be one distribution.
get_filename_component(_zero_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
get_filename_component(_zero_torch_prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
get_filename_component(_zero_torch_lib_dir "${_zero_torch_lib_dir}" REALPATH)
string(FIND "${_zero_torch_lib_dir}/" "${_zero_torch_prefix}/" _zero_torch_at)
if(NOT _zero_torch_at EQUAL 0)
  message(FATAL_ERROR "zero: LibTorch ${Torch_VERSION}'s TorchConfig.cmake is under ${TORCH_INSTALL_PREFIX} but it found "
                      "${TORCH_LIBRARY}, another LibTorch; put ${TORCH_INSTALL_PREFIX} first on CMAKE_PREFIX_PATH "
                      "(or set ZERO_TORCH_PYTHON)")
endif()
message(STATUS "zero: LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
