// The ds_config, object by object: key names, defaults (in zero/config.h),
// ranges and what "auto" means. Optimizer and scheduler: config_optim.cpp.

#include "config/config_detail.h"
#include "zero/error.h"

namespace zero::config_detail {
namespace {

const char* const kHiddenSizeNote =
    "Hugging Face derives it from the model's hidden size, which zero does not know here";

// Top-level keys DeepSpeed knows and zero ignores (deepspeed/runtime/constants.py,
// config.py and the docs' config-json page).
const char* const kUnimplementedTopLevel[] = {
    "amp", "sparse_attention", "compression_training", "data_efficiency", "curriculum_learning", "elasticity",
    "autotuning", "eigenvalue", "progressive_layer_drop", "quantize_training",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "memory_breakdown",
    "disable_allgather", "dataloader_drop_last", "vocabulary_size", "graph_harvesting",
    "seq_parallel_comm_data_type", "use_data_before_expert_parallelism", "data_types", "nebula",
    "hybrid_engine", "weight_quantization", "timers", "compile", "data_parallel_size"};

void visit_offload_optimizer(Fields& f, OffloadOptimizerConfig& o) {
  f.choice("device", o.device, {"none", "cpu", "nvme"});
  f.text("nvme_path", o.nvme_path);
  f.flag("pin_memory", o.pin_memory);
  f.integer("buffer_count", o.buffer_count, Opt().min(1));
  f.flag("pipeline_read", o.pipeline_read);
  f.flag("pipeline_write", o.pipeline_write);
  f.flag("fast_init", o.fast_init);
  f.number("ratio", o.ratio, Opt().min(0).max(1));
  f.flag("super_offload", o.super_offload);
  f.flag("nvme_gradients", o.nvme_gradients);
  // Kept in the struct, read by nothing yet.
  if (f.reading()) {
    if (o.pipeline_read) f.warn(unimplemented_warning(f.path("pipeline_read")));
    if (o.pipeline_write) f.warn(unimplemented_warning(f.path("pipeline_write")));
    if (o.fast_init) f.warn(unimplemented_warning(f.path("fast_init")));
  }
}

void visit_offload_param(Fields& f, OffloadParamConfig& o) {
  f.choice("device", o.device, {"none", "cpu", "nvme"});
  f.text("nvme_path", o.nvme_path);
  f.flag("pin_memory", o.pin_memory);
  f.integer("buffer_count", o.buffer_count, Opt().min(1));
  f.integer("buffer_size", o.buffer_size, Opt().min(1));
  f.integer("max_in_cpu", o.max_in_cpu, Opt().min(0));
  // Kept in the struct, read by nothing yet; DeepSpeed's default, as its
  // docs spell it out, asks for nothing.
  if (f.reading() && o.max_in_cpu != OffloadParamConfig{}.max_in_cpu)
    f.warn(unimplemented_warning(f.path("max_in_cpu")));
}

// Keys zero reads nothing from: each warns when set to a value that would
// ask DeepSpeed for something zero does not do. Their defaults describe
// what zero always does (gradients in contiguous flat buckets,
// reduce-scattered at stages 2-3, parameters all-gathered bucket by bucket
// of reduce_bucket_size, master weights loaded from the fp32 copies), and
// zero's checkpoints are always elastic (Note [Checkpoint layout]), so
// elastic_checkpoint true is honoured.
void warn_zero_unread(Fields& f, const ZeroOptimizationConfig& z) {
  const ZeroOptimizationConfig defaults;
  auto warn = [&](const char* key, bool differs, const std::string& what_zero_does) {
    if (differs) f.warn(unimplemented_warning(f.path(key)) + " (" + what_zero_does + ")");
  };
  warn("contiguous_gradients", z.contiguous_gradients != defaults.contiguous_gradients,
       "zero always keeps gradients in contiguous flat buckets");
  warn("reduce_scatter", z.reduce_scatter != defaults.reduce_scatter,
       "zero always reduce-scatters gradients at stages 2-3");
  warn("allgather_partitions", z.allgather_partitions != defaults.allgather_partitions,
       "zero always all-gathers the updated partitions");
  warn("allgather_bucket_size", z.allgather_bucket_size != defaults.allgather_bucket_size,
       "zero all-gathers bucket by bucket, reduce_bucket_size elements each");
  warn("load_from_fp32_weights", z.load_from_fp32_weights != defaults.load_from_fp32_weights,
       "zero always loads the master weights from the checkpoint's fp32 copies");
  warn("round_robin_gradients", z.round_robin_gradients != defaults.round_robin_gradients,
       "zero copies each bucket's gradients to the host as it is reduced");
  warn("stage3_model_persistence_threshold",
       z.stage3_model_persistence_threshold != defaults.stage3_model_persistence_threshold,
       "stage3_param_persistence_threshold alone decides which buckets stay gathered");
}

// MiCS and ZeRO++'s quantized non-trainable weights: kept in the struct, no effect yet.
void warn_zero_extras(Fields& f, const ZeroOptimizationConfig& z) {
  warn_zero_unread(f, z);
  if (z.mics_shard_size > 0) f.warn(unimplemented_warning(f.path("mics_shard_size")));
  if (z.mics_hierarchical_params_gather)
    f.warn(unimplemented_warning(f.path("mics_hierarchical_params_gather")));
  if (z.zero_quantized_nontrainable_weights)
    f.warn(unimplemented_warning(f.path("zero_quantized_nontrainable_weights")));
}

void visit_zero_optimization(Fields& f, ZeroOptimizationConfig& z) {
  const Opt size = Opt().min(0);
  const Opt hf_size = Opt().min(0).autos(Auto::Default, kHiddenSizeNote);
  f.integer("stage", z.stage, Opt().min(0).max(3));
  if (f.reading()) z.overlap_comm = z.stage == 3;   // DeepSpeed's default follows the stage
  f.flag("contiguous_gradients", z.contiguous_gradients);
  f.flag("reduce_scatter", z.reduce_scatter);
  f.integer("reduce_bucket_size", z.reduce_bucket_size, hf_size);
  f.flag("allgather_partitions", z.allgather_partitions);
  f.integer("allgather_bucket_size", z.allgather_bucket_size, size);
  f.flag("overlap_comm", z.overlap_comm);
  f.flag("load_from_fp32_weights", z.load_from_fp32_weights);
  f.flag("elastic_checkpoint", z.elastic_checkpoint);
  f.flag("round_robin_gradients", z.round_robin_gradients);
  f.integer("sub_group_size", z.sub_group_size, size);
  f.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, hf_size);
  f.integer("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, hf_size);
  f.integer("stage3_model_persistence_threshold", z.stage3_model_persistence_threshold, size);
  f.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, size);
  f.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, size);
  f.flag("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save,
         Opt().autos(Auto::Default));
  f.flag("ignore_unused_parameters", z.ignore_unused_parameters);
  f.integer("mics_shard_size", z.mics_shard_size, Opt().min(-1));
  f.flag("mics_hierarchical_params_gather", z.mics_hierarchical_params_gather);
  f.integer("zero_hpz_partition_size", z.zero_hpz_partition_size, Opt().min(1));
  f.flag("zero_quantized_weights", z.zero_quantized_weights);
  f.integer("zero_quantization_block_size", z.zero_quantization_block_size, Opt().min(8));
  f.flag("zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights);
  f.flag("zero_quantized_gradients", z.zero_quantized_gradients);
  f.object("offload_optimizer", [&](Fields& g) { visit_offload_optimizer(g, z.offload_optimizer); });
  f.object("offload_param", [&](Fields& g) { visit_offload_param(g, z.offload_param); });
  for (const char* key : {"legacy_stage1", "use_multi_rank_bucket_allreduce", "memory_efficient_linear",
                          "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
                          "zeropp_loco_param", "pipeline_loading_checkpoint", "override_module_apply",
                          "log_trace_cache_warnings"})
    f.unimplemented(key);
  if (f.reading()) warn_zero_extras(f, z);
}

void visit_fp16(Fields& f, Fp16Config& p) {
  f.flag("enabled", p.enabled, Opt().autos(Auto::Default));
  f.flag("auto_cast", p.auto_cast);
  f.number("loss_scale", p.loss_scale, Opt().min(0));
  f.integer("initial_scale_power", p.initial_scale_power, Opt().min(0).max(127));   // 2^127: float's top
  f.integer("loss_scale_window", p.loss_scale_window, Opt().min(1));
  f.integer("hysteresis", p.hysteresis, Opt().min(1));
  f.flag("consecutive_hysteresis", p.consecutive_hysteresis);
  f.number("min_loss_scale", p.min_loss_scale, Opt().above(0));
  f.unimplemented("fp16_master_weights_and_grads");
}

void visit_bf16(Fields& f, Bf16Config& p) {
  f.flag("enabled", p.enabled, Opt().autos(Auto::Default));
  f.flag("immediate_grad_update", p.immediate_grad_update);
}

void visit_aio(Fields& f, AioConfig& a) {
  f.integer("block_size", a.block_size, Opt().min(512));
  if (f.reading() && a.block_size % 512 != 0)
    f.fail("block_size", "must be a multiple of 512 bytes (O_DIRECT); found " + std::to_string(a.block_size));
  f.integer("queue_depth", a.queue_depth, Opt().min(1));
  f.integer("intra_op_parallelism", a.intra_op_parallelism, Opt().min(1));
  f.flag("single_submit", a.single_submit);
  f.flag("overlap_events", a.overlap_events);
  f.flag("use_gds", a.use_gds);
  if (f.reading() && a.use_gds) f.warn(unimplemented_warning(f.path("use_gds")));
}

void visit_activation_checkpointing(Fields& f, ActivationCheckpointingConfig& a) {
  f.flag("partition_activations", a.partition_activations);
  f.flag("cpu_checkpointing", a.cpu_checkpointing);
  f.flag("contiguous_memory_optimization", a.contiguous_memory_optimization);
  f.integer("number_checkpoints", a.number_checkpoints, Opt().min(1));
  f.integer("checkpoint_every", a.checkpoint_every, Opt().min(1));
  f.flag("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  f.flag("profile", a.profile);
}

void visit_checkpoint(Fields& f, CheckpointConfig& c) {
  f.choice("tag_validation", c.tag_validation, {"Warn", "Ignore", "Fail"});
  f.flag("load_universal", c.load_universal);
  f.flag("use_node_local_storage", c.use_node_local_storage);
  if (f.reading() && c.use_node_local_storage) f.warn(unimplemented_warning(f.path("use_node_local_storage")));
  f.object("parallel_write", [&](Fields& g) {
    g.flag("pipeline_stage", c.parallel_write_pipeline_stage);
    if (g.reading() && c.parallel_write_pipeline_stage)
      g.warn(unimplemented_warning(g.path("pipeline_stage")));
  });
  f.object("in_memory", [&](Fields& g) { g.integer("interval", c.in_memory_interval, Opt().min(0).max(1000000000)); });
}

void visit_monitor(Fields& f, MonitorConfig& m) {
  f.flag("enabled", m.enabled);
  f.text("output_path", m.output_path);
  f.text("job_name", m.job_name);
  if (f.reading() && (m.job_name.empty() || m.job_name.find('/') != std::string::npos || m.job_name == ".."))
    f.fail("job_name", "job_name \"" + m.job_name + "\" must name one folder (no '/'); put the path in output_path");
}

// wandb and comet are Python clients: their sections are read (so that a
// typo is still an unknown key) and enabling one is a warning naming what
// zero writes instead.
void visit_unavailable_monitor(Fields& f, const std::string& name, const std::vector<const char*>& other_keys) {
  bool enabled = false;
  f.flag("enabled", enabled);
  for (const char* key : other_keys) f.ignored(key);
  if (enabled) {
    f.warn(f.path("enabled") + ": " + name + " is not available in zero (it has no C++ client); the same scalars " +
           "go to \"csv_monitor\": {\"enabled\": true} or \"tensorboard\": {\"enabled\": true} (each with " +
           "\"output_path\" and \"job_name\")");
  }
}

void visit_comms_logger(Fields& f, CommsLoggerConfig& c) {
  f.flag("enabled", c.enabled);
  f.flag("verbose", c.verbose);
  f.flag("prof_all", c.prof_all);
  f.names("prof_ops", c.prof_ops, {"all_reduce", "all_gather", "reduce_scatter", "broadcast"},
          {{"all_gather_into_tensor", "all_gather"}, {"all_gather_base", "all_gather"}, {"allgather_fn", "all_gather"},
           {"reduce_scatter_tensor", "reduce_scatter"}, {"reduce_scatter_base", "reduce_scatter"},
           {"reduce_scatter_fn", "reduce_scatter"}, {"inference_all_reduce", "all_reduce"}});
  f.ignored("debug");  // DeepSpeed adds the caller's name to each record; zero has none to add
}

void visit_flops_profiler(Fields& f, FlopsProfilerConfig& c) {
  f.flag("enabled", c.enabled);
  f.integer("profile_step", c.profile_step, Opt().min(0));
  f.integer("module_depth", c.module_depth, Opt().min(-1));
  f.integer("top_modules", c.top_modules, Opt().min(1));
  f.flag("detailed", c.detailed);
  f.text("output_file", c.output_file);
  f.number("recompute_fwd_factor", c.recompute_fwd_factor, Opt().min(0).max(1));
  f.number("peak_tflops", c.peak_tflops, Opt().min(0));
}

void visit_tensor_parallel(Fields& f, ParallelismConfig& p) {
  f.integer("autotp_size", p.autotp_size, Opt().min(0));
  f.object("tp", [&](Fields& g) {
    g.integer("tp_size", p.tp_size, Opt().min(1));
    g.unimplemented("tp_grain_size");
  });
  if (f.reading() && p.autotp_size > 1 && p.tp_size > 1 && p.autotp_size != p.tp_size) {
    f.fail("autotp_size", "autotp_size " + std::to_string(p.autotp_size) + " and tp.tp_size " +
                              std::to_string(p.tp_size) + " name two tensor-parallel sizes; give one");
  }
  for (const char* key : {"dtype", "keep_module_on_host", "replace_with_kernel_inject", "kernel_inject",
                          "injection_policy_tuple"})
    f.unimplemented(key);
}

void visit_pipeline(Fields& f, ParallelismConfig& p) {
  if (f.integer("stages", p.pipeline_stages, Opt().min(1).autos(Auto::Caller)) == Got::Auto)
    p.pipeline_stages = 1;   // without a pipeline module there is one stage
  // The partition is the module's (zero::pipe::PipelineOptions::partition),
  // as it is built before the engine.
  for (const char* key : {"partition", "seed_layers", "activation_checkpoint_interval", "pipe_partitioned",
                          "grad_partitioned"})
    f.unimplemented(key);
}

// "pipeline_parallel": {"pp_size": N}, the other spelling of pipeline.stages.
void visit_pipeline_parallel(Fields& f, ParallelismConfig& p) {
  int64_t pp = p.pipeline_stages;
  f.integer("pp_size", pp, Opt().min(1));
  if (f.reading()) {
    if (p.pipeline_stages > 1 && pp != p.pipeline_stages)
      f.fail("pp_size", "pp_size " + std::to_string(pp) + " and pipeline.stages " +
                            std::to_string(p.pipeline_stages) + " name two pipeline sizes; give one");
    p.pipeline_stages = pp;
  }
}

void visit_zero_engine(Fields& f, ZeroEngineConfig& z) {
  f.integer("comm_timeout_s", z.comm_timeout_s, Opt().min(1));
  f.choice("cuda_comm_backend", z.cuda_comm_backend, {"nccl", "gloo"});
}

void visit_batch(Fields& f, BatchConfig& b) {
  const Opt positive = Opt().min(1).autos(Auto::Caller);   // "auto": resolve() computes it
  for (const auto& key_value : {std::make_pair("train_batch_size", &b.train_batch_size),
                                std::make_pair("train_micro_batch_size_per_gpu", &b.train_micro_batch_size_per_gpu),
                                std::make_pair("gradient_accumulation_steps", &b.gradient_accumulation_steps)}) {
    if (f.integer(key_value.first, *key_value.second, positive) == Got::Auto) key_value.second->reset();
  }
}

void visit_gradients(Fields& f, Config& c) {
  f.number("gradient_clipping", c.gradient_clipping,
           Opt().min(0).autos(Auto::Default, "Hugging Face fills it from max_grad_norm (its default is 1.0)"));
  f.flag("prescale_gradients", c.prescale_gradients);
  f.number("gradient_predivide_factor", c.gradient_predivide_factor, Opt().above(0));
  f.choice("communication_data_type", c.communication_data_type, {"fp32", "fp16", "bf16"});
  f.flag("sparse_gradients", c.sparse_gradients);
  if (f.reading() && c.sparse_gradients) f.warn(unimplemented_warning("sparse_gradients"));
}

}  // namespace

void visit_config(Fields& f, Config& c) {
  visit_batch(f, c.batch);
  // No optimizer or scheduler given: nothing to print either.
  if (f.reading() || !c.optimizer.type.empty())
    f.object("optimizer", [&](Fields& g) { visit_optimizer(g, c.optimizer); });
  if (f.reading() || !c.scheduler.type.empty())
    f.object("scheduler", [&](Fields& g) { visit_scheduler(g, c.scheduler, c.optimizer); });
  f.object("fp16", [&](Fields& g) { visit_fp16(g, c.fp16); });
  f.object("bf16", [&](Fields& g) { visit_bf16(g, c.bf16); });
  f.object("zero_optimization", [&](Fields& g) { visit_zero_optimization(g, c.zero_optimization); });
  visit_gradients(f, c);
  f.integer("steps_per_print", c.steps_per_print, Opt().min(1));
  f.flag("wall_clock_breakdown", c.wall_clock_breakdown);
  f.flag("dump_state", c.dump_state);
  f.object("aio", [&](Fields& g) { visit_aio(g, c.aio); });
  f.object("activation_checkpointing",
           [&](Fields& g) { visit_activation_checkpointing(g, c.activation_checkpointing); });
  f.object("checkpoint", [&](Fields& g) { visit_checkpoint(g, c.checkpoint); });
  f.object("csv_monitor", [&](Fields& g) { visit_monitor(g, c.csv_monitor); });
  f.object("tensorboard", [&](Fields& g) { visit_monitor(g, c.tensorboard); });
  f.object("comms_logger", [&](Fields& g) { visit_comms_logger(g, c.comms_logger); });
  f.object("flops_profiler", [&](Fields& g) { visit_flops_profiler(g, c.flops_profiler); });
  if (f.reading()) {
    f.object("wandb", [&](Fields& g) { visit_unavailable_monitor(g, "wandb", {"group", "team", "project"}); });
    f.object("comet", [&](Fields& g) {
      visit_unavailable_monitor(g, "comet", {"samples_log_interval", "project", "workspace", "api_key", "experiment_name",
                                            "experiment_key", "online", "mode"});
    });
  }
  f.object("tensor_parallel", [&](Fields& g) { visit_tensor_parallel(g, c.parallelism); });
  f.object("pipeline", [&](Fields& g) { visit_pipeline(g, c.parallelism); });
  if (f.reading()) f.object("pipeline_parallel", [&](Fields& g) { visit_pipeline_parallel(g, c.parallelism); });
  f.integer("sequence_parallel_size", c.parallelism.sequence_parallel_size, Opt().min(1).max(1000000));  // ranks: an int
  f.object("zero", [&](Fields& g) { visit_zero_engine(g, c.zero); });
  for (const char* key : kUnimplementedTopLevel) f.unimplemented(key);
}

}  // namespace zero::config_detail
