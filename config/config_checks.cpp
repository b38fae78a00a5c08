// The checks across keys of a parsed ds_config (check_config in
// config_detail.h): which offload, ZeRO++, pipeline and precision choices go
// together. Run after every parse, so resolve() checks them again for
// fields a program changed (Note [One validator], config.cpp).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "config/config_detail.h"
#include "zero/choices.h"
#include "zero/error.h"

namespace zero::config_detail {
namespace {

void check_offload(const Config& c) {
  const ZeroOptimizationConfig& z = c.zero_optimization;
  const std::string stage = "zero_optimization.stage is " + std::to_string(z.stage);
  const auto& opt = z.offload_optimizer;
  const auto& par = z.offload_param;
  if (par.device != "none" && z.stage < 3)
    throw ConfigError("zero_optimization.offload_param needs stage 3 (" + stage +
                      "); at stages 1 and 2 use offload_optimizer");
  if (opt.device != "none" && z.stage == 0)
    throw ConfigError("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (" + stage + ")");
  if (opt.device == "nvme" && z.stage < 3)
    throw ConfigError("zero_optimization.offload_optimizer.device \"nvme\" needs stage 3 (" + stage +
                      "); use \"cpu\" at stages 1 and 2");
  if (opt.device == "nvme" && opt.nvme_path.empty())
    throw ConfigError("zero_optimization.offload_optimizer.nvme_path is required when device is \"nvme\"");
  if (par.device == "nvme" && par.nvme_path.empty())
    throw ConfigError("zero_optimization.offload_param.nvme_path is required when device is \"nvme\"");
  if (opt.super_offload && opt.device == "none")
    throw ConfigError("zero_optimization.offload_optimizer.super_offload runs the offloaded optimizer during "
                      "backward, but offload_optimizer.device is \"none\"; set it to \"cpu\" or \"nvme\"");
  if (opt.super_offload && z.stage < 2)
    throw ConfigError("zero_optimization.offload_optimizer.super_offload updates each gradient bucket as its "
                      "reduction completes in backward, which stages 2 and 3 do (" + stage +
                      ": its gradients are reduced after backward); set stage 2 or 3");
  if (opt.super_offload && opt.ratio < 1.0)
    throw ConfigError("zero_optimization.offload_optimizer.super_offload updates every bucket on the host; ratio " +
                      std::to_string(opt.ratio) + " keeps some on the accelerator: set ratio 1");
  if (opt.nvme_gradients && opt.device != "nvme")
    throw ConfigError("zero_optimization.offload_optimizer.nvme_gradients keeps the reduced gradients in files beside "
                      "the optimizer's states, but offload_optimizer.device is \"" + opt.device +
                      "\"; set it to \"nvme\" (with nvme_path) or drop nvme_gradients");
  // The host optimizer has kernels for these (offload/cpu_optimizer.h).
  const std::optional<OptimizerKind> kind = c.optimizer.kind();
  if (opt.device == "none" || !kind) return;
  if (!is_adam(*kind) && *kind != OptimizerKind::adagrad)
    throw ConfigError("zero_optimization.offload_optimizer runs Adam, AdamW or Adagrad on the CPU; optimizer.type \"" +
                      c.optimizer.type + "\" is not supported with it (use one of those, or set offload_optimizer.device to \"none\")");
  if (c.optimizer.params.amsgrad)
    throw ConfigError("zero_optimization.offload_optimizer does not support amsgrad; set optimizer.params.amsgrad to false");
}

// ZeRO++ quantizes stage 3's collectives; below it there is nothing to act on.
void check_zeropp(const ZeroOptimizationConfig& z) {
  const std::string stage = "zero_optimization.stage is " + std::to_string(z.stage) + "; set stage 3 or remove it";
  if (z.zero_quantized_weights && z.stage != 3)
    throw ConfigError("zero_optimization.zero_quantized_weights quantizes stage 3's all-gather of weights, but " + stage);
  if (z.zero_hpz_partition_size > 1 && z.stage != 3)
    throw ConfigError("zero_optimization.zero_hpz_partition_size keeps stage 3's gathered weights within a node, but " +
                      stage);
  if (z.zero_quantized_gradients && z.stage != 3)
    throw ConfigError("zero_optimization.zero_quantized_gradients quantizes stage 3's reduce-scatter of gradients, but " +
                      stage);
  if (z.zero_quantization_block_size % 8 != 0)
    throw ConfigError("zero_optimization.zero_quantization_block_size is " + std::to_string(z.zero_quantization_block_size) +
                      "; it must be a multiple of 8 (the default is 4096)");
}

// As DeepSpeed: stages 2 and 3 partition gradients that a pipeline's
// micro-batches accumulate stage by stage; PP composes with stages 0-1.
void check_pipeline(const Config& c) {
  const int64_t pp = c.parallelism.pipeline_parallel();
  if (pp > 1 && c.zero_optimization.stage > 1)
    throw ConfigError("pipeline parallelism (pipeline.stages " + std::to_string(pp) +
                      ") works with zero_optimization.stage 0 or 1, not " + std::to_string(c.zero_optimization.stage) +
                      "; use stage 1, or pipeline.stages 1 with stage " + std::to_string(c.zero_optimization.stage));
}

void check_precision(const Config& c) {
  if (c.fp16.enabled && c.bf16.enabled)
    throw ConfigError("fp16.enabled and bf16.enabled are both true; enable one of them");
  const Fp16Config& p = c.fp16;
  if (p.enabled && p.loss_scale == 0.0 && p.min_loss_scale > std::ldexp(1.0, static_cast<int>(p.initial_scale_power)))
    throw ConfigError("fp16.min_loss_scale " + show_number(p.min_loss_scale) +
                      " is above the initial loss scale 2^" + std::to_string(p.initial_scale_power) +
                      " (fp16.initial_scale_power); lower min_loss_scale or raise initial_scale_power");
}

}  // namespace

void check_config(const Config& c) {
  check_offload(c);
  check_zeropp(c.zero_optimization);
  check_pipeline(c);
  check_precision(c);
}

// Keys a user wrote that only stage 3 reads, in a config of another stage:
// from the file itself, since the typed config cannot tell a key given
// from its default.
void warn_stage3_keys_elsewhere(const Json& root, std::vector<std::string>& warnings) {
  const auto z = root.find("zero_optimization");
  if (z == root.end() || !z->is_object()) return;
  const auto stage = z->find("stage");
  if (stage != z->end() && !stage->is_number()) return;  // "auto", or a type error the reader names
  const double at = stage == z->end() ? 0.0 : stage->get<double>();
  if (at == 3.0) return;
  // ZeRO++'s stage 3 keys are refused elsewhere (check_zeropp), not warned.
  std::vector<std::string> given;
  for (const auto& [key, value] : z->items()) {
    const bool of_stage3 = key.rfind("stage3_", 0) == 0 || key == "sub_group_size";
    if (of_stage3 && !value.is_null()) given.push_back("zero_optimization." + key);
  }
  if (given.empty()) return;
  warnings.push_back(join(given, ", ") + (given.size() == 1 ? " is a stage 3 key" : " are stage 3 keys") +
                     ": at zero_optimization.stage " + show_number(at) + " " +
                     (given.size() == 1 ? "it has" : "they have") + " no effect");
}

}  // namespace zero::config_detail
