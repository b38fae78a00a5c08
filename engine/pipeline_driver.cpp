// PipelineDriver (pipeline_driver.h): train_batch and eval_batch with the
// 1F1B schedule, and the tied parameters' gradients.
#include "engine/pipeline_driver.h"

#include <deque>
#include <optional>

#include "activations/activation_memory.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {

using telemetry::Clock;
using telemetry::seconds_since;

std::unique_ptr<PipelineDriver> PipelineDriver::of(torch::nn::Module& module, const Mesh& mesh) {
  auto* pipeline = dynamic_cast<pipe::PipelineModule*>(&module);
  const MeshShape& shape = mesh.shape();
  if (!pipeline) {
    if (shape.pp > 1) {
      throw ConfigError("pipeline.stages is " + std::to_string(shape.pp) +
                        " but the model is not a zero::pipe::PipelineModule; build it as one "
                        "(include/zero/pipeline.h) or set pipeline.stages to 1");
    }
    return nullptr;
  }
  if (pipeline->num_stages() != shape.pp) {
    throw ConfigError("the pipeline module has " + std::to_string(pipeline->num_stages()) +
                      " stage(s) but the config asks for pipeline.stages " + std::to_string(shape.pp) +
                      "; build the module on the engine's mesh");
  }
  std::unique_ptr<PipelineDriver> driver(new PipelineDriver(*pipeline));
  if (shape.pp > 1) driver->links_ = std::make_unique<pipe::PipeLinks>(mesh.pp_group());
  log::info("pipeline", "stage " + std::to_string(pipeline->stage()) + " of " + std::to_string(shape.pp) +
                            " runs layers [" + std::to_string(pipeline->stage_bounds()[pipeline->stage()]) + ", " +
                            std::to_string(pipeline->stage_bounds()[pipeline->stage() + 1]) + ")");
  return driver;
}

std::map<std::string, int> PipelineDriver::tied_copies() const {
  std::map<std::string, int> copies;
  for (const auto& tie : pipeline_.shared_ties()) {
    for (const auto& name : tie.names) copies[name] = tie.group->size();
  }
  return copies;
}

// Each tied parameter has a group of its own (isolate_params), so a bucket
// of its own: the same size, so the same shards, on every stage that holds it.
void PipelineDriver::find_tied_buckets(const partition::ShardedParams& params) {
  const auto& layout = params.layout();
  for (const auto& tie : pipeline_.shared_ties()) {
    comm::Facts facts;
    for (const auto& name : tie.names) {
      for (const auto& p : layout.params()) {
        if (p.name != name) continue;
        const auto& bucket = layout.buckets()[p.bucket];
        if (bucket.params.size() != 1) throw EngineError("tied parameter " + name + " shares a gradient bucket");
        tied_buckets_.emplace_back(static_cast<size_t>(p.bucket), tie.group);
        facts.emplace_back(name, std::to_string(bucket.numel) + " elements, " + std::to_string(bucket.shard_numel) +
                                     " per shard");
      }
    }
    const std::string differs = comm::disagreement(*tie.group, facts);
    if (!differs.empty()) {
      throw EngineError("zero::initialize: the stages sharing tied module \"" + tie.key + "\" hold it differently: " +
                        differs + "; give it the same trainable parameters on every stage");
    }
  }
}

// The gradients of a tied module are summed over the stages holding it, as
// if one module had served all its layers; every stage then takes the same step.
void PipelineDriver::reduce_tied_grads(partition::ShardedParams& params) {
  for (auto& [bucket, group] : tied_buckets_) {
    at::Tensor grad = params.reduced_grad(bucket);
    if (grad.defined()) group->all_reduce(grad, comm::ReduceOp::Sum);
  }
}

std::set<std::string> PipelineDriver::written_elsewhere(torch::nn::Module& module) const {
  std::set<std::string> names;
  for (const auto& tie : pipeline_.shared_ties()) {
    if (tie.group->rank() == 0) continue;  // the first stage holding it writes it
    const std::string prefix = "tied_" + tie.key + ".";
    for (const auto& p : module.named_parameters()) {
      if (p.key().rfind(prefix, 0) == 0) names.insert(p.key());
    }
    for (const auto& b : module.named_buffers()) {
      if (b.key().rfind(prefix, 0) == 0) names.insert(b.key());
    }
  }
  return names;
}

namespace {

// One micro-batch between its forward and its backward on this stage.
struct InFlight {
  at::Tensor input;   // received from the previous stage (its gradient goes back)
  at::Tensor output;  // sent on, or the loss on the last stage
};

}  // namespace

// Note [1F1B]: stage s of P runs min(P - s - 1, m) forwards first (warm-up),
// then alternates one forward and one backward, then the backwards left;
// so at most P - s micro-batches are alive on it, and the last stage starts
// each backward right after its forward. Sends are asynchronous (Note
// [Pipeline links]); the optimizer step follows the last backward.
PipelineDriver::Batch PipelineDriver::run(const std::function<Engine::Batch()>& next_batch, bool train, int64_t gas,
                                          double loss_scale, partition::ShardedParams& params, const Mesh& mesh,
                                          comm::ProcessGroup& world, at::Device device) {
  const int64_t m = gas;
  const int stages = pipeline_.num_stages();
  const bool first = pipeline_.is_first_stage(), last = pipeline_.is_last_stage();
  const int64_t warmup = train ? std::min<int64_t>(stages - pipeline_.stage() - 1, m) : m;
  std::deque<InFlight> alive;
  at::Tensor loss_total = torch::zeros({}, torch::kDouble);
  const auto start = Clock::now();
  Batch out;
  telemetry::PipelineTimes& times = out.times;

  // Activation memory (MemoryReport::activations_peak): what the forwards
  // in flight keep allocated, at most `stages - stage` micro-batches' worth.
  const int64_t allocated_before = activations::allocated_bytes(device);
  auto timed = [&times](auto&& receive) {
    const auto t0 = Clock::now();
    at::Tensor t = receive();
    times.wait_s += seconds_since(t0);
    return t;
  };
  auto forward_one = [&] {
    Engine::Batch batch;
    if (first || last) batch = next_batch();
    at::Tensor input = first ? batch.first.to(device) : timed([&] { return links_->recv_activation(device); });
    if (!first && train && input.is_floating_point()) input.requires_grad_(true);
    at::Tensor output = pipeline_.forward(input);
    if (last) {
      output = pipeline_.loss(output, batch.second.to(output.device()));
      loss_total += output.detach().to(at::kCPU).to(at::kDouble);
    } else {
      links_->send_activation(output);
    }
    if (train) alive.push_back({input, output});
    if (const int64_t now = activations::allocated_bytes(device); train && now >= 0 && allocated_before >= 0) {
      times.activations = std::max(times.activations, now - allocated_before);
    }
  };
  auto backward_one = [&](int64_t i) {
    const auto t0 = Clock::now();
    InFlight f = std::move(alive.front());
    alive.pop_front();
    params.begin_backward(/*boundary=*/i == m - 1);
    try {
      if (last) {
        (f.output * (loss_scale / static_cast<double>(m))).backward();
      } else {
        const at::Tensor grad = timed([&] { return links_->recv_gradient(device); });
        torch::autograd::backward({f.output}, {grad});
      }
    } catch (...) {
      params.end_backward();
      throw;
    }
    params.end_backward();
    if (!first && f.input.requires_grad()) links_->send_gradient(f.input.grad());
    times.backward_s += seconds_since(t0);
  };

  {
    std::optional<torch::NoGradGuard> no_grad;
    if (!train) no_grad.emplace();
    for (int64_t i = 0; i < warmup; ++i) forward_one();
    for (int64_t i = warmup; i < m; ++i) {
      forward_one();
      backward_one(i - warmup);
    }
    if (train) {
      for (int64_t i = m - warmup; i < m; ++i) backward_one(i);
    }
  }
  if (links_) links_->finish_sends();

  // The last stage's mean, from its tp and sp rank 0 of each data-parallel
  // rank (sp ranks each hold the whole sequence's), to every rank (one
  // all-reduce over the world).
  const bool reports = last && mesh.coordinates().tp == 0 && mesh.coordinates().sp == 0;
  at::Tensor mean = reports ? loss_total / static_cast<double>(m) : torch::zeros({}, torch::kDouble);
  mean = mean.reshape({1});
  world.all_reduce(mean, comm::ReduceOp::Sum);
  out.loss = mean.item<double>() / mesh.shape().dp;
  times.forward_s = seconds_since(start) - times.backward_s;
  return out;
}

}  // namespace zero::engine
