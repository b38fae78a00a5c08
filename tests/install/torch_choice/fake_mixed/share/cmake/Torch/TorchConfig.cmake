# A stand-in for an installed LibTorch: only the variables zero's check reads.
get_filename_component(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../../" ABSOLUTE)
set(TORCH_LIBRARY "/elsewhere/lib/libtorch.so")
set(TORCH_LIBRARIES torch)
set(Torch_FOUND TRUE)
