#pragma once
// LibTorch host tensors as the host optimizer's kernels see them: a
// gradient tensor as a GradArray, and the large host arrays they stream
// through allocated with huge pages (huge_pages.h).
#include <torch/torch.h>

#include <optional>

#include "offload/cpu_optimizer.h"
#include "offload/huge_pages.h"

namespace zero::offload {

// A contiguous fp32, fp16 or bf16 host tensor as a GradArray; none otherwise.
inline std::optional<GradArray> grad_array(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !t.is_contiguous()) return std::nullopt;
  const auto* bits = static_cast<const uint16_t*>(t.data_ptr());
  switch (t.scalar_type()) {
    case at::kFloat: return GradArray(t.data_ptr<float>());
    case at::kHalf: return GradArray(bits, GradDtype::kHalf);
    case at::kBFloat16: return GradArray(bits, GradDtype::kBFloat16);
    default: return std::nullopt;
  }
}

// An uninitialised 1-D tensor; in (pageable) host memory, advised to huge
// pages before its first write. Page-locked memory is left alone (CUDA
// allocates and touches it).
inline at::Tensor empty_with_huge_pages(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = torch::empty({numel}, options);
  if (t.is_cpu() && !options.pinned_memory()) advise_huge_pages(t.data_ptr(), t.nbytes());
  return t;
}

// A host tensor of `dtype` with `source`'s values (flattened), page-locked
// if `pinned`, else advised to huge pages.
inline at::Tensor host_copy(const at::Tensor& source, at::ScalarType dtype, bool pinned) {
  auto options = torch::TensorOptions().dtype(dtype).device(at::kCPU);
  if (pinned) options = options.pinned_memory(true);
  return empty_with_huge_pages(source.numel(), options).copy_(source.reshape(-1));
}

}  // namespace zero::offload
