// Engine::gather_parameters with a modifier rank: DeepSpeed's
// GatheredParameters(params, modifier_rank=r).
#include <torch/torch.h>

#include <map>
#include <set>

#include "engine/checkpoint_io.h"
#include "engine/engine_impl.h"
#include "zero/engine.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

// Note [Modified gathered parameters]
// Inside the scope the model's parameters are whole on every rank, but what
// training reads afterwards is elsewhere: the fp32 master weights of this
// rank's partition (stages 1-3, and the step's source at stage 0), and at
// stage 3 the shards the units gather from. A change made to the gathered
// parameters alone is lost at the next step or release, or lives on one
// rank only. With a modifier rank, leaving the scope makes that rank's
// parameters everyone's (a broadcast over the data-parallel group) and
// writes them into each rank's masters, then publishes the masters back
// into the parameters as load_weights does. In mixed precision only the
// elements that differ from the master's rounding are written, so a
// parameter nobody touched keeps its fp32 digits.
void Engine::Impl::write_back_gathered(const std::vector<at::Tensor>& touched, int modifier_rank) {
  Impl& s = *this;
  comm::ProcessGroup& dp = *s.mesh->zero_group();
  torch::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> chosen;
  for (const at::Tensor& p : touched) {
    dp.broadcast(p, modifier_rank);
    chosen.insert(p.unsafeGetTensorImpl());
  }
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : s.module->named_parameters()) by_name.emplace(p.key(), p.value());
  partition::ShardedParams& params = *s.sharded;
  const auto& masters = params.masters().tensors();
  std::vector<std::vector<partition::FlatLayout::Fragment>> by_bucket(masters.size());
  for (const auto& f : params.fragments()) by_bucket[static_cast<size_t>(f.bucket)].push_back(f);
  engine::NvmeWindow window(params.masters(), /*write_back=*/true);
  for (size_t k = 0; k < masters.size(); ++k) {
    window.enter(k);
    for (const auto& f : by_bucket[k]) {
      const at::Tensor& p = by_name.at(params.param_name(f.param));
      if (!chosen.count(p.unsafeGetTensorImpl())) continue;
      const at::Tensor source = p.detach().reshape(-1).slice(0, f.param_offset, f.param_offset + f.length);
      at::Tensor master = masters[k].slice(0, f.start, f.start + f.length);
      const at::Tensor wide = source.to(master.device(), at::kFloat);
      if (source.scalar_type() == at::kFloat) {
        master.copy_(wide);
      } else {
        const at::Tensor changed = master.to(source.scalar_type()).ne(source.to(master.device()));
        master.copy_(torch::where(changed, wide, master));
      }
    }
    params.masters().publish_bucket(k);
  }
  params.masters().publish();
  window.finish();
}

GatheredParameters Engine::gather_parameters(torch::nn::Module& module, std::optional<int> modifier_rank) {
  Impl& s = *impl_;
  partition::ShardedParams* sharded = s.sharded.get();
  std::vector<at::Tensor> trainable;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  if (modifier_rank) {
    const int ranks = s.mesh->zero_group()->size();
    if (*modifier_rank < 0 || *modifier_rank >= ranks) {
      throw EngineError("gather_parameters: modifier_rank " + std::to_string(*modifier_rank) +
                        " is not a data-parallel rank (0 to " + std::to_string(ranks - 1) + ")");
    }
  }
  std::vector<int> buckets = sharded->gather_buckets_of(module.parameters());
  if (!modifier_rank) {
    // In-place changes bump a tensor's version: they are what would be lost.
    std::vector<std::pair<at::Tensor, int64_t>> versions;
    for (const auto& p : module.named_parameters()) {
      if (p.value().requires_grad()) versions.emplace_back(p.value(), p.value()._version());
    }
    return GatheredParameters([sharded, buckets, versions] {
      for (const auto& [p, version] : versions) {
        if (p._version() != version) {
          log::warn_once("gather_parameters changed", "engine",
                         "a parameter was changed inside engine.gather_parameters(module) without a modifier_rank: "
                         "the change is this rank's copy only, and the next step overwrites it from the master "
                         "weights; pass modifier_rank (DeepSpeed's GatheredParameters(params, modifier_rank=0)) to "
                         "keep it (warned once)");
          break;
        }
      }
      if (!buckets.empty()) sharded->release_buckets(buckets);
    });
  }
  const int rank = *modifier_rank;
  return GatheredParameters([this, sharded, buckets, trainable, rank] {
    impl_->write_back_gathered(trainable, rank);
    if (!buckets.empty()) sharded->release_buckets(buckets);
  });
}

}  // namespace zero
