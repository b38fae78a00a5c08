#pragma once
// zero::initialize and the Engine: DeepSpeed's training loop for LibTorch.
//
//   auto engine = zero::initialize(zero::Config::from_file("configs/zero2.json"), model);
//   for (...) {
//     auto loss = loss_fn(model->forward(x), y);
//     engine.backward(loss);   // scales (fp16, accumulation), reduces gradients as they appear
//     engine.step();           // at the accumulation boundary: unscale, clip, update, re-gather
//   }
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/comm.h"
#include "zero/config.h"
#include "zero/data.h"
#include "zero/mesh.h"

namespace torch::optim {
class Optimizer;
class LRScheduler;
}  // namespace torch::optim

namespace zero {

// A group of parameters with its own weight decay (e.g. none for biases and
// norms), as in torch.optim's parameter groups.
struct ParamGroup {
  std::vector<at::Tensor> params;
  std::optional<double> weight_decay;  // default: the config's optimizer.params.weight_decay
};

struct InitOptions {
  // Empty: one group of every trainable parameter of the model (with
  // `optimizer` below: its groups). Parameters with requires_grad false are
  // left alone (frozen) either way.
  std::vector<ParamGroup> param_groups;
  // Empty: zero::comm::init_process_group() from the launch environment.
  std::shared_ptr<comm::ProcessGroup> group;
  // The rank mesh the model's tensor-parallel layers were built on
  // (include/zero/tensor_parallel.h); its sizes must be the config's.
  // Empty: the engine builds it over `group` from the config's sizes.
  std::shared_ptr<Mesh> mesh;
  // DDP's broadcast_buffers: buffers that differ between the data-parallel
  // ranks after a step (BatchNorm's running statistics, from each rank's
  // data) are broadcast from the group's rank 0, so that every rank, and the
  // checkpoint, holds the same. The ranks compare an 8-byte hash of each
  // buffer per step; only those that differ travel. false: each rank keeps
  // its own (DeepSpeed's behaviour after initialize).
  bool broadcast_buffers = true;
  // DeepSpeed's client optimizer (Note [Client optimizer] in
  // engine/client_optimizer.h): a torch::optim Adam, AdamW, SGD or Adagrad
  // that has not stepped, built over the model's parameters, in place of
  // the config's "optimizer" section. Its parameter groups become the
  // engine's (leave param_groups empty), each with its own options; the
  // engine rewrites their params to this rank's fp32 master partition and
  // calls its step(), so the object's lr and options stay live. With
  // offload_optimizer it is refused, as DeepSpeed refuses it.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  // A torch::optim::LRScheduler built on `optimizer` (StepLR or one of your
  // own), stepped after each applied optimizer step, skipped fp16 steps
  // excepted, as DeepSpeed steps its client lr_scheduler. A checkpoint keeps
  // each group's lr; load_checkpoint steps a scheduler that has not stepped
  // up to the saved step count (LibTorch's schedulers have no state_dict).
  // Not with the config's "scheduler", which would set the same rates.
  std::shared_ptr<torch::optim::LRScheduler> lr_scheduler;
};

// Bytes this rank holds, by kind.
struct MemoryReport {
  int64_t params = 0;            // the model's parameters in the training dtype (flat buffers, frozen ones too)
  int64_t gradients = 0;         // gradient buffers: full (stages 0-1) or partition + buckets (stage 2)
  int64_t fp32_master = 0;       // fp32 master weights of this rank's partition (mixed precision only)
  int64_t optimizer_states = 0;  // optimizer moments of this rank's partition
  int64_t buffers = 0;           // the module's buffers
  int64_t offload_buffers = 0;   // offload: host gradient and training-dtype copies of the partition
  // Of the above, what offload keeps in host memory (master weights, optimizer
  // states, offload buffers) and on NVMe instead of the accelerator.
  int64_t host_offloaded = 0;
  int64_t nvme_offloaded = 0;
  // offload_optimizer "nvme": the most host memory its master weights and
  // optimizer states took at once since initialize (the step's sub-groups
  // in flight, a checkpoint's buckets); what to size host memory for.
  int64_t nvme_host_peak = 0;
  // Stage 3: the most bytes of units' parameters gathered at once since
  // initialize (part of `params` while they are gathered), which
  // stage3_max_live_parameters and stage3_prefetch_bucket_size bound.
  int64_t gathered_params_peak = 0;
  // Measured, not estimated: the most bytes a forward left allocated on the
  // model's device for its backward (the activations autograd keeps, the
  // loss), since initialize, less stage 3's units it left gathered (those
  // are gathered_params_peak's); 0 before the first backward or where the
  // allocator cannot be read. Not part of total().
  int64_t activations_peak = 0;
  int64_t total() const { return params + gradients + fp32_master + optimizer_states + buffers + offload_buffers; }
  std::string describe() const;  // "params 1.2 MB, grads ..., "
};

// Where the time of the steps went (wall_clock_breakdown), in seconds
// summed since the last take_step_times() (the progress line keeps a window
// of its own).
struct StepTimes {
  int64_t steps = 0;
  double forward = 0;    // from the end of one step() or backward() to the next backward()
  double backward = 0;   // backward with the gradient reductions it overlaps
  double reduce = 0;     // waiting for the last reductions after backward
  double step = 0;       // the optimizer step (unscale, clip, update), gather excluded
  double gather = 0;     // publishing the updated parameters (copies, all-gathers)
  // Stage 3: of forward and backward, waiting for units' parameters (their
  // all-gathers, and NVMe reads with offload_param) that prefetching did
  // not have ready in time. A GatheredParameters taken between steps waits
  // the same way and is counted here too.
  double gather_wait = 0;
  double host_step = 0;  // offload: of `step`, the host optimizer's kernels
  double nvme_wait = 0;  // offload to NVMe: of `step`, waiting for reads and writes
  // Pipeline parallelism: of forward and backward, waiting for the
  // neighbouring stages' activations and gradients (the bubble, and any
  // imbalance between the stages).
  double pipeline_wait = 0;
};

// Keeps a module's parameters gathered while it lives (stage 3; a no-op
// below): for evaluation or export. Every rank creates and destroys it.
class GatheredParameters {
 public:
  GatheredParameters() = default;
  explicit GatheredParameters(std::function<void()> release) : release_(std::move(release)) {}
  GatheredParameters(GatheredParameters&& other) noexcept : release_(std::move(other.release_)) { other.release_ = nullptr; }
  GatheredParameters& operator=(GatheredParameters&&) = delete;
  ~GatheredParameters() {
    if (release_) release_();
  }

 private:
  std::function<void()> release_;
};

// What load_checkpoint restores besides the weights (DeepSpeed's arguments).
struct LoadOptions {
  bool load_optimizer_states = true;     // moments, sums, momentum buffers and the update count
  bool load_lr_scheduler_states = true;  // false: the schedule starts again from its first step
  bool load_module_only = false;         // weights, frozen parameters and buffers only
  // Master weights or optimizer states that are NaN or infinite are refused,
  // naming the tensor (they would train to NaN); true loads them anyway (to
  // look at a diverged run). DeepSpeed checks neither.
  bool allow_non_finite = false;
};

// How save_checkpoint writes (zero's own; DeepSpeed has no such check).
struct SaveOptions {
  // Master weights or optimizer states that are NaN or infinite are refused
  // before anything of the new checkpoint replaces the old one, naming the
  // tensor; true saves them anyway (to keep a diverged run for a look).
  bool allow_non_finite = false;
};

// What Engine::load_weights takes from weight files.
struct WeightsLoadOptions {
  // The name in the files of each of the model's parameters and buffers
  // (e.g. add "model." for a Hugging Face checkpoint). None: the same name.
  std::function<std::string(const std::string&)> name_in_files;
};

class Engine {
 public:
  Engine(const Config& config, std::shared_ptr<torch::nn::Module> module, InitOptions options);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // One micro-step's backward: the loss is scaled by the fp16 loss scale and
  // divided by gradient_accumulation_steps, as DeepSpeed does.
  void backward(const at::Tensor& loss);
  // Call once per micro-step, after its backward(); updates the parameters
  // at the accumulation boundary and clears the gradients, as DeepSpeed's
  // step() does. step() without a backward() before it is an EngineError
  // (it would count a micro-step that is not there); backward() twice
  // before step() adds both into one micro-step, as DeepSpeed does, and
  // warns once. The engine is not thread-safe: the thread that
  // first trains with it is the only one that may (an EngineError names
  // the call made from another).
  void step();
  // True when the next step() call will update the parameters.
  bool is_gradient_accumulation_boundary() const;

  // Pipeline parallelism (a zero::pipe::PipelineModule, include/zero/pipeline.h):
  // one optimizer step over gradient_accumulation_steps micro-batches run
  // through the stages with the 1F1B schedule (at most `stages` micro-batches
  // of activations alive on a stage). next_batch() gives a micro-batch's
  // (inputs, labels); it is called once per micro-batch, in order, on the
  // first stage (which uses the inputs) and the last (the labels) only.
  // Returns the mean loss over the micro-batches and data-parallel ranks, on
  // every rank. A collective; backward() and step() are for other models.
  using Batch = std::pair<at::Tensor, at::Tensor>;
  double train_batch(const std::function<Batch()>& next_batch);
  // The same forward without gradients (the module in eval mode meanwhile).
  double eval_batch(const std::function<Batch()>& next_batch);
  // Bytes of activations and gradients this rank has sent to its
  // neighbouring stages (each message with an 80-byte header); 0 without
  // pipeline stages.
  int64_t pipeline_bytes_sent() const;

  // DeepSpeed's engine(inputs): `model->forward(inputs...)`, `model` being
  // the module given to initialize. With fp16.auto_cast each floating-point
  // tensor input is cast to fp16 first, as DeepSpeed does. A forward that
  // fails because an input's dtype is not the model's (fp16 and bf16 convert
  // the model) is an EngineError saying what to cast.
  template <typename Model, typename... Inputs>
  auto forward(Model& model, Inputs&&... inputs) {
    try {
      return model->forward(cast_input(std::forward<Inputs>(inputs))...);
    } catch (const c10::Error& e) {
      rethrow_forward_error(e);
      throw;
    }
  }
  // What forward() passes on: a floating-point tensor in fp16 under
  // fp16.auto_cast, anything else as it is.
  template <typename T>
  decltype(auto) cast_input(T&& input) const {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return cast_tensor(input);
    } else {
      return std::forward<T>(input);
    }
  }
  // The dtype the model's weights are in: Float, Half (fp16) or BFloat16 (bf16).
  at::ScalarType dtype() const;

  void train(bool on = true);
  void eval() { train(false); }

  // The learning rate the last applied optimizer step used (before the
  // first step: the one it will use). Not DeepSpeed's get_lr(), which names
  // the next step's rate: logs that print get_lr() after step() are one
  // step ahead of lr().
  double lr() const;
  // DeepSpeed's engine.get_lr() (of the one parameter group's rate): the
  // rate the next optimizer step will use. A skipped fp16 step leaves it.
  // With a client optimizer and no config "scheduler": its first group's.
  double get_lr() const;
  double loss_scale() const;      // 1 unless fp16
  int64_t global_steps() const;   // optimizer steps taken, skipped ones included (DeepSpeed)
  int64_t skipped_steps() const;  // steps skipped for an fp16 overflow
  int64_t micro_steps() const;
  // The batch triad as resolved for this world (DeepSpeed's accessors):
  // train_batch_size = micro batch x gradient_accumulation_steps x data-parallel ranks.
  int64_t train_batch_size() const;
  int64_t train_micro_batch_size_per_gpu() const;
  int64_t gradient_accumulation_steps() const;
  double last_grad_norm() const;  // global L2 norm of the last step's gradients, unscaled, before clipping
  // The max global gradient norm of the updates from now on (the config's
  // gradient_clipping; 0: no clipping).
  void set_gradient_clipping(double max_norm);
  MemoryReport memory_report() const;
  StepTimes take_step_times();

  // Stage 3: gathers the parameters of `module` (a part of the model, or the
  // whole) until the returned object goes away. A collective (every rank
  // creates and destroys it). DeepSpeed's GatheredParameters: changes to the
  // parameters inside are lost (they are copies) unless `modifier_rank` is
  // given; then, when the object goes away, that data-parallel rank's
  // parameters become every rank's, in the master weights and the shards,
  // at any stage (Note [Modified gathered parameters]).
  GatheredParameters gather_parameters(torch::nn::Module& module, std::optional<int> modifier_rank = std::nullopt);
  // Full copies of the model's parameters and buffers, by name, on every
  // rank, in the training dtype (with tensor parallelism, this rank's
  // slices of the split ones). A collective.
  std::vector<std::pair<std::string, at::Tensor>> gathered_state_dict();
  // DeepSpeed's save_16bit_model: the gathered weights (and buffers) in the
  // training dtype, as one safetensors file <dir>/<filename> that
  // transformers and Engine::load_weights read, written by rank 0 (replaced
  // durably). A collective; every rank raises if the write failed. With
  // tensor or pipeline parallelism no rank holds the whole model: an
  // EngineError says to save_checkpoint and run zero-ckpt export --to hf.
  // At stage 3 it saves only with zero_optimization.
  // stage3_gather_16bit_weights_on_model_save true, as in DeepSpeed;
  // otherwise it warns and returns false (on every rank).
  bool save_16bit_model(const std::string& dir, const std::string& filename = "model.safetensors");

  // Sharded checkpoints (ckpt/checkpoint.h, Note [Checkpoint layout]). A
  // collective: every rank writes its own file into <dir>/<tag>/ in
  // parallel, then <dir>/latest is replaced atomically. tag: empty means
  // "global_step<N>". client_state: JSON text handed back by
  // load_checkpoint. The positions of the loaders data_loader() made are
  // saved too, and restored by load_checkpoint (Note [Data that resumes]):
  // no client_state is needed to continue with the same samples, at any
  // world size. Non-finite master weights or
  // optimizer states are a CheckpointError naming the tensor on every rank,
  // `latest` and the checkpoints already saved untouched (SaveOptions).
  void save_checkpoint(const std::string& dir, const std::string& tag = "", const std::string& client_state = "{}",
                       const SaveOptions& options = {});
  // Loads <dir>/<tag> (empty: the tag <dir>/latest names), saved at any
  // world size and stage, and returns its client_state JSON text. A collective.
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "", const LoadOptions& options = {});
  // Resume-if-present (DeepSpeed's load_checkpoint returning None): nullopt
  // when <dir>/latest (or <dir>/<tag>) does not exist on any rank, else what
  // load_checkpoint returns. A damaged checkpoint still raises, and so does
  // one that only some ranks see. A collective.
  std::optional<std::string> load_checkpoint_if_present(const std::string& dir, const std::string& tag = "",
                                                        const LoadOptions& options = {});

  // Weights from safetensors files into the model as it is partitioned: one
  // file (Hugging Face's model.safetensors, or what `zero-ckpt consolidate`
  // writes), a model.safetensors.index.json with the shards it names, or a
  // folder holding either. Each rank reads only the byte ranges of its own
  // shards (F16, BF16 and F64 converted to the fp32 master weights), one
  // bucket at a time; frozen parameters and buffers are read whole. Names
  // and shapes are checked first: a tensor missing, left over or of another
  // shape is a CheckpointError naming it, and nothing is loaded. Optimizer
  // states and counters stay as they are. A collective.
  void load_weights(const std::string& path, const WeightsLoadOptions& options = {});

  // DeepSpeed's deepspeed_io: a loader over `dataset` that hands this
  // data-parallel rank its rows of each global batch, on the model's device.
  // save_checkpoint keeps its position and load_checkpoint restores it
  // (made after the load: here, as the load's k-th loader), or names a
  // loader whose position would name other samples (a shuffled one over
  // another dataset size or seed, shuffle switched).
  // Its batch_size: rows per rank, unset: train_micro_batch_size_per_gpu.
  // Shuffled from (seed, epoch) unless options.shuffle is false (unset seed: 0,
  // DistributedSampler's). Tensor-parallel and pipeline ranks of one
  // data-parallel rank get the same rows.
  DataLoader data_loader(std::shared_ptr<Dataset> dataset, const DataLoaderOptions& options = {});

  torch::nn::Module& module();
  std::shared_ptr<torch::nn::Module> module_ptr();
  // The world: every rank of the job.
  comm::ProcessGroup& group();
  // This rank's place in the tp x dp x pp mesh and its groups; ZeRO
  // partitions over mesh().dp_group().
  const Mesh& mesh() const;
  const Config& config() const;

 private:
  at::Tensor cast_tensor(const at::Tensor& t) const;
  // An EngineError for a dtype mismatch; returns for anything else.
  void rethrow_forward_error(const c10::Error& e) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Engine initialize(const Config& config, std::shared_ptr<torch::nn::Module> model, InitOptions options = {});

// DeepSpeed's get_fp32_state_dict_from_zero_checkpoint: a checkpoint's full
// fp32 weights, frozen parameters and buffers by name, read without an
// engine or a process group, whatever world size and stage saved it (what
// `zero-ckpt consolidate` writes). `tag` "": the one <dir>/latest names.
// Holds the whole model in memory; for larger ones use zero-ckpt consolidate
// and Engine::load_weights, which stream.
std::vector<std::pair<std::string, at::Tensor>> fp32_state_dict_from_checkpoint(const std::string& dir,
                                                                                const std::string& tag = "");

// Checks for a program's start, before the model is built, so that an
// option that would fail at the end of training fails first (Note [Refuse
// at the start], engine/start_checks.cpp):
// a folder a save will write into exists as a folder or can be made (its
// nearest existing parent is a folder this process can write); otherwise a
// CheckpointError naming `option` (e.g. "--save") and the path.
void check_save_dir(const std::string& dir, const std::string& option);
// The tag load_checkpoint(dir, tag) would read (tag "": the one
// <dir>/latest names), its manifest read and checked; otherwise the
// CheckpointError load_checkpoint would raise. Reads no tensor.
std::string checkpoint_to_load(const std::string& dir, const std::string& tag = "");
// The shapes of the tensors in the weights load_weights(path) would read
// (one safetensors file, an index and its shards, or a folder holding
// either), from their headers alone: a program compares them with the model
// its config implies before building it. The CheckpointError load_weights
// raises for a missing or damaged file.
std::map<std::string, std::vector<int64_t>> weight_shapes(const std::string& path);

template <typename M>
Engine initialize(const Config& config, torch::nn::ModuleHolder<M>& model, InitOptions options = {}) {
  return initialize(config, std::static_pointer_cast<torch::nn::Module>(model.ptr()), std::move(options));
}

}  // namespace zero
