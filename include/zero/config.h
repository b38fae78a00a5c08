#pragma once
// zero::Config: a DeepSpeed ds_config (JSON), parsed, checked and typed.
//
//   auto cfg = zero::Config::from_file("configs/zero2.json");  // throws zero::ConfigError
//   cfg.resolve(world_size);        // batch triad, checks that need the world size
//   for (auto& w : cfg.warnings()) zero::log::warn("config", w);
//
// Key names and defaults are DeepSpeed's (deepspeed/runtime/config.py,
// zero/config.py, zero/offload_config.py, lr_schedules.py), so a ds_config
// written for DeepSpeed means the same here. Each struct below mirrors one
// JSON object; its members carry the JSON key names.
//
// Parsing rules (see config/config*.cpp):
//  - Every key must be known. A misspelled or misplaced key is an error that
//    names its JSON path and the nearest known key; a key DeepSpeed knows but
//    zero does not implement is accepted with one warning ("it has no effect").
//  - Deprecated DeepSpeed spellings (cpu_offload, cpu_offload_param(s),
//    cpu_offload_use_pin_memory, stage3_gather_fp16_weights_on_model_save,
//    "zero_optimization": true|false, "bfloat16", aio.thread_count) are mapped
//    to their current key with one warning each; giving both is an error.
//  - Types are strict: an integer field takes a JSON integer or an integral
//    number (5e8 is fine, 1.5 is not); a boolean field takes true/false only
//    ("true" in quotes is an error). Numbers in quotes are not accepted.
//    null means "not given" (the default applies). Comments (#, // and /* */)
//    and a comma before a closing bracket are allowed, as DeepSpeed reads
//    configs with hjson (Note [DeepSpeed's config syntax]); True, False and
//    None are refused naming JSON's spelling; duplicate keys are an
//    error, as in DeepSpeed.
//  - "auto" (the Hugging Face convention) is accepted where Hugging Face
//    writes it, and nowhere else:
//      batch keys: computed by resolve() from the others and the world size;
//      scheduler warmup_max_lr: takes optimizer.params.lr (as parsed);
//      scheduler total_num_steps: left unset for the program to set before
//        resolve() (zero cannot know the run length);
//      the rest (optimizer lr/betas/eps/weight_decay, fp16/bf16 enabled,
//        gradient_clipping, ZeRO bucket sizes, ...): "not given", as in
//        DeepSpeed's own config models: the default applies and a warning
//        names the value used.
//    resolve() names any value still missing. A program may fill values in
//    between parsing and resolve(), as Hugging Face's Trainer does.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero/choices.h"

namespace zero {

// train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps
// * world_size. As given in the config (unset when missing or "auto"); all three
// are set after Config::resolve(). A program may set them before resolve(), as
// Hugging Face's Trainer does for "auto".
struct BatchConfig {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
};

// "zero_optimization.offload_optimizer". device: "none" | "cpu" | "nvme".
struct OffloadOptimizerConfig {
  std::string device = "none";
  std::string nvme_path;         // required when device is "nvme"
  bool pin_memory = false;
  int64_t buffer_count = 4;      // NVMe buffers; >= the optimizer's states per parameter
  // Not implemented: accepted, warned about when true.
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;            // share of the partition offloaded (partial offload), whole buckets
  // DeepSpeed's SuperOffload: the boundary's backward updates each bucket
  // as soon as its gradient is reduced (Note [Updates in backward] in
  // partition/step.cpp); with gradient_clipping or fp16 the update waits
  // for step(), as without it.
  bool super_offload = false;
  // With device "nvme": each offloaded bucket's reduced gradients live in
  // a file too, between the backward that reduces them and the step that
  // reads them (ZeRO-Infinity's gradient swapping; Note [Gradients on
  // NVMe] in partition/host_grads.h). Host memory then holds no gradient
  // partition, only the buckets in flight.
  bool nvme_gradients = false;
  // `device` as zero/choices.h's enum; a spelling outside the set (set in
  // code, never checked) is a ConfigError naming this key.
  OffloadDevice where() const;
};

// "zero_optimization.offload_param" (stage 3 only). device: "none" | "cpu" | "nvme".
struct OffloadParamConfig {
  std::string device = "none";
  std::string nvme_path;         // required when device is "nvme"
  bool pin_memory = false;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;   // elements per NVMe buffer (1e8)
  // DeepSpeed's elements kept in CPU memory with NVMe (1e9). Not implemented:
  // accepted, warned about when set to anything but this default.
  int64_t max_in_cpu = 1000000000;
  OffloadDevice where() const;   // as OffloadOptimizerConfig::where
};

// "zero_optimization". Sizes count elements, not bytes.
struct ZeroOptimizationConfig {
  int stage = 0;                                  // 0..3
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;         // 5e8
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;      // 5e8
  bool overlap_comm = false;                      // default: true at stage 3, false below (DeepSpeed)
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1000000000;            // 1e9
  int64_t stage3_prefetch_bucket_size = 50000000;       // 5e7  (alias prefetch_bucket_size)
  int64_t stage3_param_persistence_threshold = 100000;  // 1e5  (alias param_persistence_threshold)
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;      // 1e9
  int64_t stage3_max_reuse_distance = 1000000000;       // 1e9
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool ignore_unused_parameters = true;
  // DeepSpeed features zero does not implement: accepted, warned about when
  // set to anything but their default.
  int64_t mics_shard_size = -1;
  bool mics_hierarchical_params_gather = false;
  bool zero_quantized_nontrainable_weights = false;
  // ZeRO++ (stage 3; README "Configuration"). hpZ: a secondary partition
  // of the gathered weights within each node of this many ranks (the ranks
  // per node), from which backward gathers.
  int64_t zero_hpz_partition_size = 1;
  // qwZ: stage 3's gathers for forward and backward carry int8 blocks of
  // zero_quantization_block_size elements with a scale each (zero's own
  // key; DeepSpeed picks its blocks near 8,000 elements).
  bool zero_quantized_weights = false;
  int64_t zero_quantization_block_size = 4096;
  // qgZ: gradients reduced within each node exactly, then across nodes as
  // int8 blocks of zero_quantization_block_size.
  bool zero_quantized_gradients = false;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

// "fp16". loss_scale 0 means dynamic scaling starting at 2^initial_scale_power.
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

// "bf16" (old spelling "bfloat16"). No loss scaling.
struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
};

// "optimizer.params". Only the parameters of the chosen type are read and
// printed; the defaults are those of the implementation DeepSpeed uses for
// the type (FusedAdam, torch.optim.SGD, torch.optim.Adagrad, FusedLamb).
struct OptimizerParams {
  double lr = 1e-3;                          // Adagrad: 1e-2
  std::array<double, 2> betas{0.9, 0.999};   // Adam, AdamW, Lamb
  double eps = 1e-8;                         // Adagrad: 1e-10
  double weight_decay = 0.0;
  // Adam / AdamW. DeepSpeed's "Adam" applies decoupled (AdamW) weight decay
  // unless adam_w_mode is false; "AdamW" always does.
  bool adam_w_mode = true;
  bool torch_adam = false;
  bool bias_correction = true;               // also Lamb
  bool amsgrad = false;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adagrad
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
  // Lamb
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
};

// "optimizer". type: "" (none given) or one of "Adam", "AdamW", "SGD",
// "Adagrad", "Lamb" (matched case-insensitively, stored in this spelling).
struct OptimizerConfig {
  std::string type;
  OptimizerParams params;
  // `type` as zero/choices.h's enum: nothing when none is given; a ConfigError
  // naming optimizer.type for a spelling outside the set.
  std::optional<OptimizerKind> kind() const;
  // True when weight decay is decoupled from the gradient (AdamW).
  bool decoupled_weight_decay() const {
    const auto k = optimizer_kind_named(type);
    return k == OptimizerKind::adamw || (k == OptimizerKind::adam && params.adam_w_mode);
  }
};

// "scheduler.params", DeepSpeed's names and defaults (lr_schedules.py). Only
// the parameters of the chosen type are read and printed.
struct SchedulerParams {
  // WarmupLR, WarmupDecayLR (+ total_num_steps)
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;           // also WarmupCosineLR
  std::string warmup_type = "log";           // "log" | "linear"; also WarmupCosineLR
  // Required by WarmupDecayLR and WarmupCosineLR. "auto" leaves it unset for
  // the program to fill in before resolve(), which fails while it is unset.
  std::optional<int64_t> total_num_steps;
  // WarmupCosineLR (ratios of the optimizer's lr)
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle (cycle_min_lr, cycle_max_lr required)
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 2000;     // default: cycle_first_step_size
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = 0;      // default: cycle_first_stair_count
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
  // all types
  int64_t last_batch_iteration = -1;
};

// "scheduler". type: "" or one of "WarmupLR", "WarmupDecayLR",
// "WarmupCosineLR", "OneCycle", "LRRangeTest".
struct SchedulerConfig {
  std::string type;
  SchedulerParams params;
};

// "aio": the NVMe swapper's I/O settings.
struct AioConfig {
  int64_t block_size = 1048576;     // bytes, a multiple of 512 (O_DIRECT)
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1; // old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;             // not implemented by zero (warned)
};

// "activation_checkpointing": which zero::Units recompute their activations
// in backward, and how (include/zero/activation_checkpointing.h).
// checkpoint_every (zero's key): every k-th unit, the first included (1: all);
// number_checkpoints: that many units, evenly spaced; neither: only the units
// and zero::checkpoint calls the model asks for. partition_activations
// splits the saved inputs over the tensor-parallel group (a no-op with a
// log line without one); contiguous_memory_optimization copies them into one
// reused buffer per device (DeepSpeed asks for partition_activations with
// it; zero does not).
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  std::optional<int64_t> checkpoint_every;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

// "checkpoint". tag_validation: "Warn" | "Ignore" | "Fail" (case-insensitive
// in the file): what load does when ranks disagree on the tag. zero's
// checkpoints are always loadable at any world size, so load_universal has
// nothing to switch on; use_node_local_storage and
// parallel_write.pipeline_stage are not implemented (warned when true).
struct CheckpointConfig {
  std::string tag_validation = "Warn";
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;   // "parallel_write": {"pipeline_stage": ...}
  // "in_memory": {"interval": K} (zero's own): after every K-th optimizer
  // step a copy of each rank's shard of the training state stays in host
  // memory, its own node's and the next node's, and
  // engine.load_checkpoint_if_present resumes from it after a restart
  // (Note [In-memory copies] in engine/memory_copies.h). 0: off.
  int64_t in_memory_interval = 0;
};

// DeepSpeed's "csv_monitor" and "tensorboard": rank 0 writes each
// optimizer step's scalars (train loss, lr, loss scale, grad norm, ...)
// under <output_path>/<job_name>/ (monitor/monitor.h). "wandb" and "comet"
// have no C++ client: enabling them is a warning that names these two.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;                    // "": the working directory
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
};

// DeepSpeed's "comms_logger": every collective's kind, message size, count,
// latency and bandwidth (zero::comm::comms_summary), printed by rank 0 at
// each steps_per_print and at the end, and written to the monitors.
// prof_ops names the kinds to log when prof_all is false: "all_reduce",
// "all_gather", "reduce_scatter", "broadcast" (DeepSpeed's function names,
// e.g. "all_gather_into_tensor", are accepted for them).
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;   // a log line per collective
  bool prof_all = true;
  std::vector<std::string> prof_ops;
};

// DeepSpeed's "flops_profiler" (profile/flops_profiler.h): at the step
// where global_steps == profile_step, every rank counts its forward FLOPs,
// MACs and latency per module; rank 0 prints DeepSpeed's summary (or writes
// it to output_file) to module_depth (-1: all) with the top_modules of each
// depth. From then on the progress line shows the achieved TFLOP/s (and the
// MFU: achieved over the device's dense peak for the training dtype, from
// profile/device_peak.h's table for known GPUs, or peak_tflops (ours) for
// any device). recompute_fwd_factor: the share of forward that activation
// checkpointing runs again in backward.
struct FlopsProfilerConfig {
  bool enabled = false;
  int64_t profile_step = 1;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  bool detailed = true;
  std::string output_file;  // "": the log
  double recompute_fwd_factor = 0.0;
  double peak_tflops = 0.0;  // per device; 0: the table's, when the device is known
};

// The rank mesh (include/zero/mesh.h): "tensor_parallel" ({"autotp_size":
// N}, or {"tp": {"tp_size": N}} as DeepSpeed's inference config has it) and
// the pipeline's size ("pipeline": {"stages": N}, or "pipeline_parallel":
// {"pp_size": N}), and the top-level "sequence_parallel_size" (DeepSpeed's
// key: ranks that share one sequence, Ulysses; ZeRO partitions over their
// sp x dp). The data-parallel size is world / (tp * pp * sp). Pipeline
// sizes above 1 train a zero::pipe::PipelineModule (zero/pipeline.h).
struct ParallelismConfig {
  int64_t autotp_size = 0;       // 0: off (DeepSpeed)
  int64_t tp_size = 1;
  int64_t pipeline_stages = 1;   // "auto" reads as 1
  int64_t sequence_parallel_size = 1;
  int64_t tensor_parallel() const { return autotp_size > 0 ? autotp_size : tp_size; }
  int64_t pipeline_parallel() const { return pipeline_stages; }
  int64_t sequence_parallel() const { return sequence_parallel_size; }
};

// "zero": engine options DeepSpeed has no key for.
//   comm_timeout_s: seconds a collective or rendezvous may wait before it
//     fails naming the missing rank (the environment's ZERO_COMM_TIMEOUT has
//     the same meaning);
//   cuda_comm_backend: "nccl" | "gloo" (gloo stages CUDA tensors through host
//     memory; ZERO_CUDA_BACKEND likewise).
struct ZeroEngineConfig {
  int64_t comm_timeout_s = 300;
  std::string cuda_comm_backend = "nccl";
};

class Config {
 public:
  Config() = default;   // DeepSpeed's defaults, no batch size given

  // Parses and checks a ds_config. Errors (zero::ConfigError) name the file,
  // the JSON path, what was expected and what was found.
  static Config from_file(const std::string& path);
  static Config from_json(const std::string& json_text);

  // Completes the batch triad for `world_size` data-parallel ranks and checks
  // the whole config again (so fields a program changed are checked too).
  // Throws ConfigError naming the numbers when they do not fit. Resolving an
  // already resolved config checks the three batch values against the new
  // world size.
  // `world_size` counts every rank; the batch triad counts the data-parallel
  // ones, world / (tensor parallel x pipeline stages), and a world they do
  // not divide is a ConfigError naming the layouts that fit.
  void resolve(int world_size);
  // What zero::initialize needs beyond a valid config: an "optimizer"
  // section (a program may set `optimizer` in code first, as
  // Accelerator::prepare does). Throws ConfigError. zero-config checks a
  // file with resolve() and this, as initialize does (Note [One validator]).
  void check_trainable() const;
  bool resolved() const { return world_size_ > 0; }
  int world_size() const { return world_size_; }
  int data_parallel_size() const { return data_parallel_size_; }

  // The config as JSON with every default filled in (DeepSpeed's key names;
  // keys zero ignores are left out). Batch values not yet resolved are null.
  std::string to_json(int indent = 2) const;

  // One line per deprecated key mapped, known-but-unimplemented key, or
  // "auto" replaced by a default. The engine logs them once.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The file the config came from, or "" for from_json.
  const std::string& source() const { return source_; }

  BatchConfig batch;
  ZeroOptimizationConfig zero_optimization;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double gradient_clipping = 0.0;          // max global gradient norm; 0 = off
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // "fp32" | "fp16" | "bf16"; unset: the training precision.
  std::optional<std::string> communication_data_type;
  bool sparse_gradients = false;           // not implemented (warned when true)
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool dump_state = false;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  ParallelismConfig parallelism;
  ZeroEngineConfig zero;

 private:
  friend struct ConfigAccess;   // config/config*.cpp
  std::vector<std::string> warnings_;
  std::string source_;
  int world_size_ = 0;
  int data_parallel_size_ = 0;
};

}  // namespace zero
