// zero::checkpoint_tensors (include/zero/activation_checkpointing.h): a
// custom autograd function whose forward runs the body without recording a
// graph and whose backward runs it again with one, then backward through
// that (reentrant, as torch.utils.checkpoint's default).
#include "zero/activation_checkpointing.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

#include "activations/autograd_leaves.h"
#include "zero/error.h"

namespace zero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

std::mutex settings_mutex;
ActivationCheckpointOptions settings;
std::mutex stats_mutex;
ActivationCheckpointStats stats;

ActivationCheckpointOptions current_settings() {
  std::lock_guard<std::mutex> lock(settings_mutex);
  return settings;
}

// The random generators' states when the checkpointed forward began: the
// CPU one always, and the accelerator's of the device the inputs are on.
struct RngStates {
  at::Tensor cpu;
  c10::optional<at::Device> device;
  at::Tensor on_device;

  static RngStates capture(const std::vector<at::Tensor>& inputs) {
    RngStates s;
    s.cpu = at::detail::getDefaultCPUGenerator().get_state();
    for (const auto& t : inputs) {
      if (t.defined() && !t.device().is_cpu()) {
        s.device = t.device();
        s.on_device = at::globalContext().defaultGenerator(t.device()).get_state();
        break;
      }
    }
    return s;
  }
  void restore() const {
    set(at::detail::getDefaultCPUGenerator(), cpu);
    if (device) set(at::globalContext().defaultGenerator(*device), on_device);
  }
  static void set(at::Generator generator, const at::Tensor& state) {  // a handle on the same generator
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
};

// What the recompute needs besides the saved inputs; it rides in the
// autograd context as a capsule.
// contiguous_memory: the saved inputs of one forward, one after another in
// one buffer per device (and host, pinned or not). A new round starts
// when no checkpoint holds the last one's round token; the buffer is then
// reused, or grown to what the last round wanted, or made anew when a
// tensor of the last round still uses it.
class InputBuffer {
 public:
  // An uninitialized tensor of these sizes and options, in the buffer when
  // it fits; `round` keeps the round open while the tensor is kept.
  at::Tensor take(at::IntArrayRef sizes, const at::TensorOptions& options, std::shared_ptr<void>& round) {
    if (!round_ || round_.use_count() == 1) start_round(options);
    round = round_;
    const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(options.dtype().itemsize());
    const int64_t aligned = (bytes + kAlign - 1) / kAlign * kAlign;
    wanted_ += aligned;
    if (!buffer_.defined() || used_ + aligned > buffer_.numel()) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++stats.buffer_misses;
      return at::empty(sizes, options);
    }
    at::Tensor view = at::empty({0}, options);
    view.set_(buffer_.storage(), used_ / static_cast<int64_t>(options.dtype().itemsize()), sizes,
              c10::contiguous_strides(sizes));
    used_ += aligned;
    return view;
  }

 private:
  static constexpr int64_t kAlign = 64;

  void start_round(const at::TensorOptions& options) {
    const bool in_use = buffer_.defined() && buffer_.storage().use_count() > 1;
    if (wanted_ > 0 && (!buffer_.defined() || wanted_ > buffer_.numel() || in_use)) {
      const int64_t capacity = std::max<int64_t>(wanted_, buffer_.defined() ? buffer_.numel() : 0);
      buffer_ = at::Tensor();  // freed first: the old and the new need not coexist
      buffer_ = at::empty({capacity}, options.dtype(at::kByte));
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++stats.buffers_made;
    }
    round_ = std::make_shared<int>(0);
    used_ = 0;
    wanted_ = 0;
  }

  at::Tensor buffer_;  // bytes
  std::shared_ptr<void> round_;
  int64_t used_ = 0, wanted_ = 0;
};

std::mutex buffers_mutex;
std::map<std::string, InputBuffer> buffers;  // by device (and "pinned")

at::Tensor take_from_buffer(at::IntArrayRef sizes, const at::TensorOptions& options, std::shared_ptr<void>& round) {
  std::lock_guard<std::mutex> lock(buffers_mutex);
  const std::string key = options.device().str() + (options.pinned_memory() ? " pinned" : "");
  return buffers[key].take(sizes, options, round);
}

// One saved input while it waits for the recompute: whole or this rank's
// partition, on its device or in host memory, in the contiguous buffer or not.
struct KeptInput {
  at::Tensor kept;
  std::vector<int64_t> sizes;     // of the whole input
  at::Device device{at::kCPU};    // where the whole input lives
  bool partitioned = false;
  std::shared_ptr<void> round;    // contiguous_memory: the buffer round it is in
};

struct Saved : torch::CustomClassHolder {
  CheckpointBody body;
  size_t num_inputs = 0;              // the inputs come first,
  size_t num_params = 0;              // then the listed parameters, then the marker
  std::vector<at::Tensor> params;       // the listed parameters
  std::vector<bool> requires_grad;    // per input
  // With cpu_checkpointing, partition or contiguous_memory the inputs are
  // copied aside; otherwise autograd keeps them (save_for_backward).
  bool kept_aside = false;
  std::vector<KeptInput> kept;
  std::shared_ptr<const ActivationPartition> partition;  // as at the forward
  RngStates rng;
  bool on_accelerator = false;
};

// The copy of input `t` that waits for the recompute (options: see KeptInput).
KeptInput keep(const at::Tensor& t, const ActivationCheckpointOptions& options) {
  KeptInput k;
  if (!t.defined()) return k;
  k.sizes = t.sizes().vec();
  k.device = t.device();
  const ActivationPartition* part = options.partition.get();
  k.partitioned = part && part->size > 1 && t.numel() >= part->size;
  at::Tensor source = t;
  std::vector<int64_t> sizes = k.sizes;
  int64_t valid = 0, chunk = 0;
  if (k.partitioned) {  // chunk `rank` of the flat input, padded to the same length on every rank
    chunk = (t.numel() + part->size - 1) / part->size;
    const int64_t begin = std::min<int64_t>(t.numel(), part->rank * chunk);
    valid = std::min<int64_t>(t.numel(), begin + chunk) - begin;
    source = t.reshape({-1}).slice(0, begin, begin + valid);
    sizes = {chunk};
  }
  at::TensorOptions where = t.options();
  const bool to_host = options.cpu_checkpointing && !t.device().is_cpu();
  if (!k.partitioned && !to_host && !options.contiguous_memory) {  // already where it should wait
    k.kept = t;
    return k;
  }
  if (to_host) where = where.device(at::kCPU).pinned_memory(true);
  k.kept = options.contiguous_memory ? take_from_buffer(sizes, where, k.round) : at::empty(sizes, where);
  if (k.partitioned) {
    k.kept.slice(0, 0, valid).copy_(source, /*non_blocking=*/to_host);
    if (valid < chunk) k.kept.slice(0, valid).zero_();
  } else {
    k.kept.copy_(source, /*non_blocking=*/to_host);
  }
  return k;
}

// The whole input back on its device, gathered over the partition's group.
at::Tensor bring_back(const KeptInput& k, const ActivationPartition* part) {
  if (!k.kept.defined()) return k.kept;
  at::Tensor t = k.kept.device() == k.device ? k.kept : k.kept.to(k.device, /*non_blocking=*/true);
  if (!k.partitioned) return t;
  at::Tensor full = at::empty({part->size * t.numel()}, t.options());
  part->all_gather(full, t);
  {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.gathered_bytes += full.nbytes();
  }
  return full.slice(0, 0, c10::multiply_integers(k.sizes)).view(k.sizes);
}

}  // namespace

variable_list unlisted_leaves(const variable_list& roots, const variable_list& listed) {
  std::unordered_set<const void*> known;
  for (const auto& t : listed) known.insert(t.unsafeGetTensorImpl());
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> pending;
  for (const auto& r : roots) {
    if (r.grad_fn()) pending.push_back(r.grad_fn().get());
  }
  variable_list out;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (!node || !seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      if (!known.count(acc->variable.unsafeGetTensorImpl())) out.push_back(acc->variable);
      continue;
    }
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return out;
}

namespace {

bool differentiable(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

void synchronize_if(bool wanted, bool on_accelerator) {
  if (wanted && on_accelerator && torch::cuda::is_available()) torch::cuda::synchronize();
}

class Recompute : public torch::autograd::Function<Recompute> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Saved> saved) {
    const ActivationCheckpointOptions options = current_settings();
    synchronize_if(options.synchronize_boundary, saved->on_accelerator);
    const auto start = Clock::now();
    std::vector<at::Tensor> real(inputs.begin(), inputs.begin() + saved->num_inputs);
    // The listed parameters are the module's own tensors, kept as they are
    // (no copy, no version check): the recompute uses them through the module.
    saved->params.assign(inputs.begin() + saved->num_inputs, inputs.begin() + saved->num_inputs + saved->num_params);
    saved->rng = RngStates::capture(real);
    variable_list outputs = saved->body(real);

    int64_t bytes = 0;
    saved->partition = options.partition && options.partition->size > 1 ? options.partition : nullptr;
    saved->kept_aside = options.cpu_checkpointing || saved->partition || options.contiguous_memory;
    if (saved->kept_aside) {
      for (const auto& t : real) {
        saved->kept.push_back(keep(t, options));
        bytes += saved->kept.back().kept.defined() ? saved->kept.back().kept.nbytes() : 0;
      }
    } else {
      for (const auto& t : real) bytes += t.defined() ? t.nbytes() : 0;
      ctx->save_for_backward(real);
    }
    // Integer outputs carry no gradient.
    std::vector<at::Tensor> no_grad;
    for (const auto& out : outputs) {
      if (out.defined() && !differentiable(out)) no_grad.push_back(out);
    }
    if (!no_grad.empty()) ctx->mark_non_differentiable(no_grad);
    ctx->saved_data["zero.checkpoint"] = c10::IValue::make_capsule(saved);
    synchronize_if(options.synchronize_boundary, saved->on_accelerator);
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++stats.forwards;
    stats.saved_bytes += bytes;
    if (options.profile) stats.forward_s += std::chrono::duration<double>(Clock::now() - start).count();
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = c10::static_intrusive_pointer_cast<Saved>(ctx->saved_data.at("zero.checkpoint").toCapsule());
    const ActivationCheckpointOptions options = current_settings();
    synchronize_if(options.synchronize_boundary, saved->on_accelerator);
    const auto start = Clock::now();
    std::vector<at::Tensor> inputs;
    if (saved->kept_aside) {
      for (const KeptInput& k : saved->kept) inputs.push_back(bring_back(k, saved->partition.get()));
    } else {
      inputs = ctx->get_saved_variables();
    }
    std::vector<at::Tensor> detached;
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor d = inputs[i].defined() ? inputs[i].detach() : inputs[i];
      if (d.defined() && saved->requires_grad[i]) d.requires_grad_(true);
      detached.push_back(d);
    }

    // The recompute draws the same random numbers as the forward did; the
    // generators then continue where backward left them.
    const RngStates now = RngStates::capture(detached);
    saved->rng.restore();
    std::vector<at::Tensor> outputs;
    try {
      torch::AutoGradMode grad(true);
      outputs = saved->body(detached);
    } catch (...) {
      now.restore();
      throw;
    }
    now.restore();
    double recompute_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (outputs.size() != grad_outputs.size()) {
      throw EngineError("zero::checkpoint: the recompute returned " + std::to_string(outputs.size()) +
                        " outputs, the forward " + std::to_string(grad_outputs.size()) +
                        "; the checkpointed function must return the same outputs each time it runs");
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // The inputs' and listed parameters' gradients are returned; the other
    // parameters the recompute reached get theirs accumulated here
    // (reentrant, as torch.utils.checkpoint), which fires their hooks.
    variable_list wanted;
    for (const auto& d : detached) {
      if (d.defined() && d.requires_grad()) wanted.push_back(d);
    }
    const std::vector<at::Tensor>& params = saved->params;
    for (const auto& p : params) wanted.push_back(p);
    const variable_list unlisted = unlisted_leaves(roots, wanted);
    variable_list wanted_grads;
    if (!roots.empty() && !wanted.empty()) {
      wanted_grads = torch::autograd::grad(roots, wanted, grads, /*retain_graph=*/!unlisted.empty(),
                                           /*create_graph=*/false, /*allow_unused=*/true);
    }
    if (!roots.empty() && !unlisted.empty()) {
      torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false, unlisted);
    }

    variable_list result;
    size_t next = 0;
    for (const auto& d : detached) {
      const bool returned = d.defined() && d.requires_grad();
      result.push_back(returned && next < wanted_grads.size() ? wanted_grads[next] : at::Tensor());
      next += returned ? 1 : 0;
    }
    for (size_t i = 0; i < params.size(); ++i, ++next) {
      result.push_back(next < wanted_grads.size() ? wanted_grads[next] : at::Tensor());
    }
    result.push_back(at::Tensor());  // the marker
    result.push_back(at::Tensor());  // the capsule
    // Nothing of the kept inputs outlives the recompute: the contiguous
    // buffer's round can close.
    saved->kept.clear();
    synchronize_if(options.synchronize_boundary, saved->on_accelerator);
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++stats.recomputes;
    if (options.profile) stats.recompute_s += recompute_s;
    return result;
  }
};

}  // namespace

void configure_activation_checkpointing(const ActivationCheckpointOptions& options) {
  std::lock_guard<std::mutex> lock(settings_mutex);
  settings = options;
}

ActivationCheckpointOptions activation_checkpointing_options() { return current_settings(); }

ActivationCheckpointStats take_activation_checkpoint_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ActivationCheckpointStats taken = stats;
  stats = ActivationCheckpointStats();
  return taken;
}

std::vector<at::Tensor> checkpoint_tensors(CheckpointBody body, const std::vector<at::Tensor>& inputs,
                                           const std::vector<at::Tensor>& params) {
  if (!body) throw EngineError("zero::checkpoint: no function to run");
  // Evaluation: nothing is kept for backward anyway.
  if (!at::GradMode::is_enabled()) return body(inputs);
  auto saved = c10::make_intrusive<Saved>();
  saved->body = std::move(body);
  saved->num_inputs = inputs.size();
  saved->num_params = params.size();
  for (const auto& t : inputs) {
    saved->requires_grad.push_back(t.defined() && t.requires_grad());
    saved->on_accelerator = saved->on_accelerator || (t.defined() && !t.device().is_cpu());
  }
  // The marker requires grad, so that the outputs do even when no input
  // does: the parameters inside still need their gradients.
  variable_list with_marker(inputs.begin(), inputs.end());
  with_marker.insert(with_marker.end(), params.begin(), params.end());
  with_marker.push_back(torch::empty({0}, torch::TensorOptions().requires_grad(true)));
  // As a TensorList: autograd takes a std::vector argument for a non-tensor.
  return Recompute::apply(at::TensorList(with_marker), saved);
}

}  // namespace zero
