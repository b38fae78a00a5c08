# Third-party dependencies, all from Debian packages on the CPU machines
# (see tools/setup-deps.sh) or from unpacked .debs on the GPU machine
# (CMAKE_PREFIX_PATH pointing at them). LibTorch is Debian's libtorch-dev
# or the one inside a Python torch package (ZERO_TORCH_PYTHON below).

include(cmake/TorchChoice.cmake)
find_package(nlohmann_json 3.9 REQUIRED)
find_package(Threads REQUIRED)

find_path(GLOO_INCLUDE_DIR gloo/allreduce.h REQUIRED)
find_library(GLOO_LIBRARY gloo REQUIRED)
# Note [Two glooes]: LibTorch 2.x's libtorch_cpu carries its own gloo, another
# version, and exports its symbols. The dynamic linker binds every gloo call
# to the first library in load order that defines it, so a program that
# loads libtorch_cpu before Debian's libgloo runs torch's gloo code on
# Debian's gloo objects (seen: a crash in Context::createUnboundBuffer on the
# first all-reduce). Every program that links zero therefore needs libgloo
# ahead of LibTorch, kept even where the linker drops libraries nothing names
# directly. zero uses no gloo of torch's (c10d's TCPStore only).
set(ZERO_GLOO_BEFORE_TORCH -Wl,--push-state,--no-as-needed ${GLOO_LIBRARY} -Wl,--pop-state)
find_package(TBB REQUIRED)
find_path(URING_INCLUDE_DIR liburing.h REQUIRED)
find_library(URING_LIBRARY uring REQUIRED)
# Checkpoint checksums (XXH3-64: hashing keeps up with the disk).
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
# torch.save's zip container (torchsave/)
find_path(LIBZIP_INCLUDE_DIR zip.h REQUIRED)
find_library(LIBZIP_LIBRARY zip REQUIRED)

# Private link interface of libzero: nothing here leaks into its users.
add_library(zero_deps_private INTERFACE)
target_include_directories(zero_deps_private SYSTEM INTERFACE ${GLOO_INCLUDE_DIR} ${URING_INCLUDE_DIR})
target_link_libraries(zero_deps_private INTERFACE
  ${GLOO_LIBRARY} ${URING_LIBRARY} ${XXHASH_LIBRARY} TBB::tbb nlohmann_json::nlohmann_json Threads::Threads)

# Torch built with CUDA: code that uses c10::cuda (streams of the caching
# allocator, pinned memory) is compiled only then.
set(ZERO_TORCH_CUDA OFF)
if(TORCH_CUDA_LIBRARIES)
  set(ZERO_TORCH_CUDA ON)
endif()

# NCCL backend: on whenever the CUDA toolkit and NCCL are found, even with a
# CPU-only Torch, so that it compiles and links in CI.
set(ZERO_WITH_NCCL OFF)
if(ZERO_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    # The NCCL that torch itself loads comes first (the nvidia-nccl wheel
    # beside a Python torch): two different libnccl.so.2 cannot both load.
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${ZERO_TORCH_NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${ZERO_TORCH_NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(ZERO_WITH_NCCL ON)
      target_include_directories(zero_deps_private SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(zero_deps_private INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    endif()
  endif()
endif()
message(STATUS "zero: NCCL backend ${ZERO_WITH_NCCL} (${NCCL_LIBRARY}), Torch CUDA ${ZERO_TORCH_CUDA}")

# Launch config files in Accelerate's YAML (accelerate/, zero-run): Debian's
# yaml-cpp (libyaml-cpp-dev). Optional: without it, reading one is an error
# that says what to install.
find_package(yaml-cpp QUIET)
if(yaml-cpp_FOUND)
  set(ZERO_HAVE_YAML ON)
  message(STATUS "zero: launch config files read with yaml-cpp ${yaml-cpp_VERSION}")
else()
  set(ZERO_HAVE_YAML OFF)
  message(STATUS "zero: no yaml-cpp found: launch config files cannot be read (install libyaml-cpp-dev)")
endif()
