#pragma once
// Note [LibTorch 1.13 and 2.x]
// zero compiles against Debian's LibTorch 1.13 and the 2.x of the torch
// wheel. Where their C++ APIs differ, the difference is absorbed here, once,
// and every caller goes through this header; tests/core/test_torch_compat.cpp
// checks each entry on whichever version it is built with (CI builds both).
// Header-only and included only by layers that use LibTorch: core's own
// objects stay torch-free.
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>
#include <c10/core/Event.h>

#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero::compat {

// A parameter's AccumulateGrad node: a std::shared_ptr<Node> in 1.13, a
// c10::intrusive_ptr<Node> in recent 2.x. Holding it keeps the node, and the
// post-hooks added to it, alive.
using GradAccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// torch::optim keys its state by the parameter's TensorImpl: as a string in
// 1.13, as the pointer itself in 2.x.
using OptimizerStateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
template <typename Key = OptimizerStateMap::key_type>
Key optimizer_state_key(const at::Tensor& t) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << t.unsafeGetTensorImpl();
    return key.str();
  } else {
    return t.unsafeGetTensorImpl();
  }
}

// torch::optim's param groups keep the options zero gives them. Recent 2.x
// merges each group's options into the optimizer's defaults when it adds
// the group: a field equal to its type's constructor default is taken from
// the defaults, and options of a type torch does not know (zero's Lamb) come
// out as the defaults whole. zero states every field of every group, so each
// optimizer it builds puts them back as given (1.13 kept them: a no-op).
inline void keep_group_options(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::optim::OptimizerParamGroup>& given) {
  auto& groups = optimizer.param_groups();
  TORCH_CHECK(groups.size() == given.size(), "keep_group_options: ", groups.size(), " groups, ", given.size(), " given");  // not a zero::Error: zero's own calls break this, no input can
  for (size_t g = 0; g < groups.size(); ++g) {
    const torch::optim::OptimizerOptions& options = given[g].options();
    groups[g].set_options(options.clone());
  }
}

// The LibTorch this was compiled against, e.g. "2.15.0", for messages.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// float8 (safetensors' F8_E4M3 and F8_E5M2): LibTorch has the dtypes from
// 2.1 on. Empty where it has not: such tensors can still be read as F32
// (ckpt::convert_to_f32), not as themselves.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
inline std::optional<at::ScalarType> float8_e4m3fn() { return at::kFloat8_e4m3fn; }
inline std::optional<at::ScalarType> float8_e5m2() { return at::kFloat8_e5m2; }
#else
inline std::optional<at::ScalarType> float8_e4m3fn() { return std::nullopt; }
inline std::optional<at::ScalarType> float8_e5m2() { return std::nullopt; }
#endif

// Blocks until `event`'s work has run: c10::Event::synchronize from 2.1
// on; 1.13 has only query() (and no accelerator in Debian's build), so it
// polls, yielding the core.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
inline void synchronize(const c10::Event& event) { event.synchronize(); }
#else
inline void synchronize(const c10::Event& event) {
  while (!event.query()) std::this_thread::yield();
}
#endif

}  // namespace zero::compat
