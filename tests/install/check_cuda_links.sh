#!/usr/bin/env bash
# libzero built against a CUDA LibTorch needs libtorch_cuda and libc10_cuda
# (the dynamic section, as ldd would follow it). Exit 77 (skipped) for a
# LibTorch without CUDA. Usage: check_cuda_links.sh LIBZERO TORCH_CUDA(ON|OFF)
set -u
lib=$1
if [ "$2" != ON ]; then
  echo "skipped: this LibTorch has no CUDA (ZERO_TORCH=wheel builds one that has)"
  exit 77
fi
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$lib needs: $(echo $needed)"
for want in libtorch_cuda.so libc10_cuda.so; do
  printf '%s\n' $needed | grep -qx "$want" || { echo "FAILED: $lib does not need $want"; exit 1; }
done
