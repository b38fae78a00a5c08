#pragma once
// Activation checkpointing: run a piece of the model without keeping its
// intermediate activations, and run it again during backward to get them
// back (torch.utils.checkpoint's reentrant variant, which LibTorch lacks):
//
//   y = zero::checkpoint([&](const at::Tensor& x, const at::Tensor& mask) { return block(x, mask); }, x, mask);
//
// Only the tensor arguments are kept for backward (on the host with
// cpu_checkpointing); other arguments (numbers, options) are kept by value.
// The function may return one tensor or a vector of them. The random
// generators' states (CPU, and the accelerator of the inputs) are restored
// for the recompute, so dropout draws the same masks. The gradients of the
// module's parameters reach them as without checkpointing (the recompute's
// own backward accumulates them), so the engine's hooks see them as usual.
// zero::Unit checkpoints its block when asked (unit.h, or the config's
// activation_checkpointing section for all units).
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

// The process-wide settings, as DeepSpeed's checkpointing.configure(); the
// engine sets them from the config's "activation_checkpointing" section.
//
// partition: DeepSpeed's partition_activations. The ranks of a group that
// all hold the same inputs (a tensor-parallel group: its ranks see the same
// hidden states) keep 1/size of each saved input each, and gather them back
// for the recompute, in the same order on every rank. Inputs that differ
// across the group must not be partitioned.
//
// contiguous_memory: DeepSpeed's contiguous_memory_optimization. The saved
// inputs (or their partitions, or their host copies) of one forward are
// copied one after another into one buffer per device, reused by the next
// forward once the last recompute has let go of it, instead of a separate
// allocation each. A forward that needs more than the buffer holds gets
// separate allocations for the rest and a larger buffer the next time.
struct ActivationPartition {
  int rank = 0, size = 1;
  // Fills `full` (size x shard.numel() elements, rank r's shard at chunk r).
  std::function<void(at::Tensor full, const at::Tensor& shard)> all_gather;
};
struct ActivationCheckpointOptions {
  bool cpu_checkpointing = false;       // keep the saved inputs in host memory until the recompute
  bool synchronize_boundary = false;    // synchronize the accelerator before and after each checkpoint
  bool profile = false;                 // count the time of the checkpointed forwards and recomputes
  std::shared_ptr<const ActivationPartition> partition;  // null: each rank keeps whole inputs
  bool contiguous_memory = false;
};
void configure_activation_checkpointing(const ActivationCheckpointOptions& options);
ActivationCheckpointOptions activation_checkpointing_options();

// What the checkpoints did since the last take (with `profile`, times too).
struct ActivationCheckpointStats {
  int64_t forwards = 0;        // checkpointed forwards run
  int64_t recomputes = 0;      // recomputes run in backward
  int64_t saved_bytes = 0;     // bytes of inputs kept for backward, summed over the forwards
  int64_t gathered_bytes = 0;  // with partition: bytes gathered back for the recomputes
  int64_t buffers_made = 0;    // with contiguous_memory: buffers allocated (grown) for the saved inputs
  int64_t buffer_misses = 0;   // with contiguous_memory: saved inputs that did not fit the buffer
  double forward_s = 0;        // with profile: seconds in checkpointed forwards
  double recompute_s = 0;      // with profile: seconds recomputing (its backward excluded)
};
ActivationCheckpointStats take_activation_checkpoint_stats();

using CheckpointBody = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// The core: `body` maps the inputs to the outputs, the same way each time.
// `params`: parameters the body uses, whose gradients then leave through
// the checkpoint like the inputs' (autograd adds up a parameter's uses and
// accumulates it once per backward, as without checkpointing); parameters
// not listed get theirs from the recompute's own backward, once per call.
std::vector<at::Tensor> checkpoint_tensors(CheckpointBody body, const std::vector<at::Tensor>& inputs,
                                           const std::vector<at::Tensor>& params = {});

// ALST's tiled compute (arXiv 2506.13996; DeepSpeed's TiledMLP and
// TiledFusedLogitsLoss): fn over `tiles` consecutive slices of x along
// dimension 1 (the sequence), one slice at a time, keeping only x for
// backward; backward runs each tile's forward again and its backward, one
// tile after another. What fn makes inside (an MLP's intermediate
// activations, a head's logits) then peaks at one tile's, at the price of a
// second forward. fn(tile, start) gets the tile and the position of its
// first element along dimension 1; the tiles' results are concatenated
// along dimension 1, or summed when they are scalars (a loss). `params`:
// every parameter fn uses (others are refused in backward), whose
// gradients, summed over the tiles, leave through the call once, as from one
// use. fn runs again in backward: what it captures must still be alive then
// (capture tensors by value). Tiles must not depend on each other (fn must not mix positions: an
// MLP or a per-token loss, not attention).
using TileFn = std::function<at::Tensor(const at::Tensor& tile, int64_t start)>;
at::Tensor tiled_compute(const TileFn& fn, const at::Tensor& x, const std::vector<at::Tensor>& params, int64_t tiles);

namespace detail {

template <typename T>
constexpr bool is_tensor = std::is_same<std::decay_t<T>, at::Tensor>::value;

// A non-tensor argument is stored by value; a tensor one travels through
// checkpoint_tensors and is stored as nothing here.
struct TensorSlot {};
template <typename T>
using Stored = std::conditional_t<is_tensor<T>, TensorSlot, std::decay_t<T>>;

template <typename T>
Stored<T> store(T&& arg) {
  if constexpr (is_tensor<T>) {
    return TensorSlot{};
  } else {
    return std::forward<T>(arg);
  }
}

// How many of the first I arguments are tensors: argument I's index among them.
template <size_t I, typename... Args>
constexpr size_t tensors_before() {
  constexpr bool flags[] = {is_tensor<Args>..., false};
  size_t n = 0;
  for (size_t i = 0; i < I; ++i) n += flags[i] ? 1 : 0;
  return n;
}

template <typename Arg, size_t TensorIndex, typename S>
decltype(auto) pick(S& stored, const std::vector<at::Tensor>& tensors) {
  if constexpr (is_tensor<Arg>) {
    return static_cast<const at::Tensor&>(tensors[TensorIndex]);
  } else {
    return static_cast<S&>(stored);
  }
}

template <typename... Args, typename F, typename Tuple, size_t... I>
decltype(auto) call_with(F& fn, Tuple& stored, const std::vector<at::Tensor>& tensors, std::index_sequence<I...>) {
  return fn(pick<Args, tensors_before<I, Args...>()>(std::get<I>(stored), tensors)...);
}

inline std::vector<at::Tensor> as_list(at::Tensor t) { return {std::move(t)}; }
inline std::vector<at::Tensor> as_list(std::vector<at::Tensor> v) { return v; }

}  // namespace detail

// fn(args...) checkpointed, with the gradients of `params` (see
// checkpoint_tensors) leaving through the checkpoint.
template <typename F, typename... Args>
auto checkpoint_with_params(const std::vector<at::Tensor>& params, F&& fn, Args&&... args) {
  using Result = std::decay_t<decltype(fn(args...))>;
  static_assert(std::is_same<Result, at::Tensor>::value || std::is_same<Result, std::vector<at::Tensor>>::value,
                "zero::checkpoint: the function must return at::Tensor or std::vector<at::Tensor>");
  std::vector<at::Tensor> tensors;
  auto collect = [&](const auto& arg) {
    if constexpr (detail::is_tensor<decltype(arg)>) tensors.push_back(arg);
  };
  (collect(args), ...);
  auto state = std::make_shared<std::pair<std::decay_t<F>, std::tuple<detail::Stored<Args>...>>>(
      std::forward<F>(fn), std::tuple<detail::Stored<Args>...>(detail::store(std::forward<Args>(args))...));
  CheckpointBody body = [state](const std::vector<at::Tensor>& inputs) {
    return detail::as_list(
        detail::call_with<Args...>(state->first, state->second, inputs, std::index_sequence_for<Args...>{}));
  };
  std::vector<at::Tensor> outputs = checkpoint_tensors(std::move(body), tensors, params);
  if constexpr (std::is_same<Result, at::Tensor>::value) {
    return outputs.front();
  } else {
    return outputs;
  }
}

// fn(args...) checkpointed; returns what fn returns (at::Tensor or
// std::vector<at::Tensor>). A parameter used by two checkpointed calls (or
// by one and outside) in one backward is better given to
// checkpoint_with_params, so that its gradient arrives once, summed.
template <typename F, typename... Args>
auto checkpoint(F&& fn, Args&&... args) {
  return checkpoint_with_params({}, std::forward<F>(fn), std::forward<Args>(args)...);
}

// The trainable parameters of `module`, for checkpoint_with_params.
inline std::vector<at::Tensor> trainable_parameters(const std::vector<at::Tensor>& all) {
  std::vector<at::Tensor> out;
  for (const auto& p : all) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace zero
