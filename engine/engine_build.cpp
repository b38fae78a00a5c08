// The training core's construction (engine_impl.h): the partition and the
// optimizer over the model's parameters, activation checkpointing, whether
// super_offload's update can run in backward, and the memory report of
// what it built.
#include <torch/torch.h>

#include <sstream>

#include "activations/estimate.h"
#include "core/byte_units.h"
#include "engine/engine_impl.h"
#include "core/write_failure.h"
#include "engine/master_optimizer.h"
#include "engine/model_params.h"
#include "engine/partition_options.h"
#include "engine/rank_agreement.h"
#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

using core::human_bytes;

std::string MemoryReport::describe() const {
  std::ostringstream out;
  out << "params " << human_bytes(params) << ", grads " << human_bytes(gradients) << ", fp32 master "
      << human_bytes(fp32_master) << ", optimizer " << human_bytes(optimizer_states) << ", buffers "
      << human_bytes(buffers);
  if (offload_buffers > 0) out << ", offload buffers " << human_bytes(offload_buffers);
  out << " (total " << human_bytes(total()) << ")";
  if (host_offloaded > 0) out << "; offloaded to host " << human_bytes(host_offloaded);
  if (nvme_offloaded > 0) out << ", to NVMe " << human_bytes(nvme_offloaded);
  if (nvme_host_peak > 0) out << " (host peak " << human_bytes(nvme_host_peak) << ")";
  // Stage 3's gathered units are parameters, not activations: their own item
  // (what stage3_max_reuse_distance keeps gathered shows here).
  if (gathered_params_peak > 0) out << "; gathered units (peak) " << human_bytes(gathered_params_peak);
  if (activations_peak > 0) out << "; activations (measured peak) " << human_bytes(activations_peak);
  return out.str();
}

void Engine::Impl::build_params(InitOptions& options, const std::shared_ptr<partition::ConstructionParts>& parts) {
  engine::ModelParams model_params = engine::model_params(*module, std::move(options.param_groups), config, dtype);
  frozen_bytes = model_params.frozen_bytes;
  units = model_params.units;
  // A pipeline's tied parameters count once over the stages holding them,
  // each in a group (so a bucket) of its own (PipelineDriver::find_tied_buckets).
  const std::map<std::string, int> copies = pipeline ? pipeline->tied_copies() : std::map<std::string, int>{};
  if (pipeline) engine::isolate_params(model_params, copies);
  engine::set_replicas(model_params, *module, splits, mesh->shape(), copies);
  const auto& dp = mesh->zero_group();
  // Units partitioned as they were built (zero::Init) are laid out from their parts.
  if (parts) engine::check_partitioned(*module, *parts, mesh->shape(), *pg);
  // Before the first collective that assumes it: every rank holds the same
  // config and model, or every rank stops naming what differs (tp slices
  // have equal shapes; pipeline stages hold different layers, so the model
  // is compared over the data-parallel group there).
  std::string differs;
  if (mesh->shape().pp > 1) {
    differs = comm::disagreement(*pg, engine::config_facts(config));
    if (differs.empty()) differs = comm::disagreement(*dp, engine::model_facts(*module, model_params));
  } else {
    comm::Facts facts = engine::config_facts(config);
    for (auto& f : engine::model_facts(*module, model_params)) facts.push_back(std::move(f));
    differs = comm::disagreement(*pg, facts);
  }
  if (!differs.empty()) {
    throw EngineError("zero::initialize: " + differs +
                      "; every rank must start with the same config and the same model");
  }
  // Every rank starts from the weights and buffers of its data-parallel
  // group's rank 0, as DeepSpeed does (tp ranks hold different slices).
  {
    torch::NoGradGuard no_grad;
    for (auto& p : module->parameters()) {
      if (!parts || !parts->holds(p)) dp->broadcast(p.data(), 0);  // parts are rank 0's already
    }
    for (auto& b : module->buffers()) dp->broadcast(b, 0);
  }
  bool params_on_host = true;
  for (const auto& g : model_params.groups) {
    for (const auto& p : g.params) params_on_host = params_on_host && (parts ? parts->device_of(p) : p.device()).is_cpu();
  }
  partition::Options partition_options = engine::partition_options(config, dtype, pg);
  partition_options.parts = parts;
  engine::set_node_groups(config, *mesh, partition_options);
  sharded = std::make_unique<partition::ShardedParams>(std::move(model_params.groups), dp, partition_options);
  if (!units.empty()) sharded->attach_units(units);
  if (dtype != at::kFloat) {  // frozen weights and buffers follow the training dtype
    torch::NoGradGuard no_grad;
    for (auto& p : module->parameters()) {
      if (!p.requires_grad() && at::isFloatingType(p.scalar_type())) p.set_data(p.to(dtype));
    }
    for (auto& b : module->buffers()) {
      if (at::isFloatingType(b.scalar_type())) b.set_data(b.to(dtype));
    }
  }
  optimizer = client ? client->wrap(*sharded, model_params.user_group, config)
                     : engine::master_optimizer(config, *sharded, model_params.weight_decays, dp, params_on_host);
  if (pipeline) pipeline->find_tied_buckets(*sharded);
}

// The config's activation_checkpointing section: the process-wide settings
// of zero::checkpoint, and which of the model's units recompute.
void Engine::Impl::setup_activation_checkpointing() {
  for (const auto& p : module->parameters()) {
    model_device = p.device();
    break;
  }
  const auto& a = config.activation_checkpointing;
  ActivationCheckpointOptions options;
  options.cpu_checkpointing = a.cpu_checkpointing;
  options.synchronize_boundary = a.synchronize_checkpoint_boundary;
  options.profile = a.profile;
  options.contiguous_memory = a.contiguous_memory_optimization;
  const std::shared_ptr<comm::ProcessGroup>& tp = mesh->tp_group();
  if (a.partition_activations && tp->size() > 1) {
    auto partition = std::make_shared<ActivationPartition>();
    partition->rank = tp->rank();
    partition->size = tp->size();
    partition->all_gather = [tp](at::Tensor full, const at::Tensor& shard) { tp->all_gather(full, shard); };
    options.partition = partition;
    log::info("activations", "activation_checkpointing.partition_activations: each of the " +
                                 std::to_string(tp->size()) + " tensor-parallel ranks keeps 1/" +
                                 std::to_string(tp->size()) + " of the checkpoints' inputs and gathers them back to recompute");
  } else if (a.partition_activations) {
    log::info("activations", "activation_checkpointing.partition_activations: there is no tensor-parallel group to "
                             "split the saved inputs over, so they stay whole on each rank");
  }
  configure_activation_checkpointing(options);
  const std::vector<UnitBase*> all = engine::units_of(*module);
  const int64_t n = static_cast<int64_t>(all.size());
  const bool chosen = a.checkpoint_every || a.number_checkpoints;
  if (chosen && n == 0) {
    log::warn("activations", "activation_checkpointing selects units, but the model has no zero::Unit; wrap its blocks "
                             "in zero::Unit or call zero::checkpoint in its forward (include/zero/activation_checkpointing.h)");
  }
  int64_t on = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (chosen) {
      all[i]->set_config_checkpointing(
          checkpointed_unit(i, n, a.checkpoint_every.value_or(0), a.number_checkpoints.value_or(0)));
    }
    on += all[i]->checkpoints_activations() ? 1 : 0;
  }
  if (on > 0) {
    log::info("activations", std::to_string(on) + " of " + std::to_string(n) +
                                 " unit(s) recompute their activations in backward" +
                                 (a.cpu_checkpointing ? "; their inputs wait in host memory" : ""));
  }
}

Engine::Impl::~Impl() {
  if (boundary) boundary->finish();  // the last step's loss is written while the groups are alive
  boundary.reset();
  telemetry.reset();
  // What failed as the engine went away was logged; the next engine in this process starts clean.
  write_failure::take();
  if (ActivationCheckpointOptions a = activation_checkpointing_options(); a.partition) {
    a.partition = nullptr;  // this engine's group: checkpoints after it keep whole inputs
    configure_activation_checkpointing(a);
  }
}

MemoryReport Engine::Impl::memory() const {
  MemoryReport r;
  r.params = sharded->param_bytes() + frozen_bytes;
  r.gradients = sharded->grad_bytes();
  r.fp32_master = sharded->masters().bytes();
  r.optimizer_states = optimizer->state_bytes();
  r.host_offloaded = sharded->offloaded_param_bytes(/*nvme=*/false);
  r.nvme_offloaded = sharded->offloaded_param_bytes(/*nvme=*/true);
  r.gathered_params_peak = sharded->gathered_param_peak();
  r.activations_peak = telemetry ? telemetry->activations_peak() : 0;
  if (sharded->options().offload_optimizer) {
    // Of the master weights and states, those of the buckets on the host
    // (all of them unless partial, Note [Partial offload]). A host master is
    // always apart from the parameters, so masters().bytes() counts it, fp32 too.
    r.offload_buffers = sharded->offload_buffer_bytes();
    r.host_offloaded += r.offload_buffers;
    if (offload::SwappedTensors* nvme = sharded->masters().nvme_store()) {  // only the offloaded share is in the store
      r.nvme_offloaded += nvme->nvme_bytes();
      r.host_offloaded += nvme->resident_bytes();
      r.nvme_host_peak = nvme->peak_resident_bytes();
    } else {
      for (size_t k = 0; k < sharded->num_buckets(); ++k) {
        if (!sharded->masters().on_host(k)) continue;
        const at::Tensor& m = sharded->masters().tensors()[k];
        r.host_offloaded += m.nbytes();
        for (const auto& name : optimizer->state_names()) {
          const at::Tensor state = optimizer->state(m, name, false);
          if (state.defined()) r.host_offloaded += state.nbytes();
        }
      }
    }
  }
  for (const auto& b : module->buffers()) r.buffers += b.nbytes();
  return r;
}

// Only an update that needs no global norm first runs early (Note
// [Updates in backward] in partition/step.cpp); otherwise super_offload's
// update waits for step(), as it would without it, and the log says why.
void Engine::Impl::choose_updates_in_backward() {
  if (!config.zero_optimization.offload_optimizer.super_offload) return;
  std::string waits;
  if (scaler) {
    waits = "fp16's loss scale skips a step whose gradients overflow on any rank";
  } else if (pipeline) {
    waits = "a pipeline's train_batch runs its own backward schedule";
  } else if (!optimizer->per_bucket()) {
    throw EngineError("zero::initialize: offload_optimizer.super_offload updates bucket by bucket in backward, but "
                      "this optimizer updates every tensor at once (torch_adam, Lamb or a client optimizer); set "
                      "torch_adam false or drop super_offload");
  }
  if (!waits.empty()) {
    log::info("engine", "super_offload: the update waits for engine.step(): " + waits +
                            " (DeepSpeed's SuperOffload would update early and roll back)");
    return;
  }
  updates_in_backward = true;
  log::info("engine", config.gradient_clipping > 0
                          ? "super_offload: the update waits for engine.step() while gradient_clipping is set: it "
                            "needs the global gradient norm before any update (DeepSpeed's SuperOffload would update "
                            "early and roll back)"
                          : "super_offload: each gradient bucket is updated in the accumulation boundary's backward "
                            "as soon as it is reduced");
}

}  // namespace zero
