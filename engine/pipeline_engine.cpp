// The engine with a pipeline module (include/zero/pipeline.h): train_batch
// and eval_batch with the 1F1B schedule, and the tied parameters' gradients.
#include <torch/torch.h>

#include <deque>
#include <optional>

#include "activations/activation_memory.h"
#include "engine/engine_impl.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

void Engine::Impl::setup_pipeline() {
  pipeline = dynamic_cast<pipe::PipelineModule*>(module.get());
  const MeshShape& shape = mesh->shape();
  if (!pipeline) {
    if (shape.pp > 1) {
      throw ConfigError("pipeline.stages is " + std::to_string(shape.pp) +
                        " but the model is not a zero::pipe::PipelineModule; build it as one "
                        "(include/zero/pipeline.h) or set pipeline.stages to 1");
    }
    return;
  }
  if (pipeline->num_stages() != shape.pp) {
    throw ConfigError("the pipeline module has " + std::to_string(pipeline->num_stages()) +
                      " stage(s) but the config asks for pipeline.stages " + std::to_string(shape.pp) +
                      "; build the module on the engine's mesh");
  }
  if (shape.pp > 1) links = std::make_unique<pipe::PipeLinks>(mesh->pp_group());
  log::info("pipeline", "stage " + std::to_string(pipeline->stage()) + " of " + std::to_string(shape.pp) +
                            " runs layers [" + std::to_string(pipeline->stage_bounds()[pipeline->stage()]) + ", " +
                            std::to_string(pipeline->stage_bounds()[pipeline->stage() + 1]) + ")");
}

// Each tied parameter has a group of its own (build_params), so a bucket of
// its own: the same size, so the same shards, on every stage that holds it.
void Engine::Impl::find_tied_buckets() {
  if (!pipeline) return;
  const auto& layout = sharded->layout();
  for (const auto& tie : pipeline->shared_ties()) {
    comm::Facts facts;
    for (const auto& name : tie.names) {
      for (const auto& p : layout.params()) {
        if (p.name != name) continue;
        const auto& bucket = layout.buckets()[p.bucket];
        if (bucket.params.size() != 1) throw EngineError("tied parameter " + name + " shares a gradient bucket");
        tied_buckets.emplace_back(static_cast<size_t>(p.bucket), tie.group);
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
void Engine::Impl::reduce_tied_grads() {
  for (auto& [bucket, group] : tied_buckets) {
    at::Tensor grad = sharded->reduced_grad(bucket);
    if (grad.defined()) group->all_reduce(grad, comm::ReduceOp::Sum);
  }
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
double Engine::Impl::pipeline_batch(const std::function<Engine::Batch()>& next_batch, bool train) {
  const int64_t m = gas;
  const int stages = pipeline->num_stages();
  const bool first = pipeline->is_first_stage(), last = pipeline->is_last_stage();
  const int64_t warmup = train ? std::min<int64_t>(stages - pipeline->stage() - 1, m) : m;
  const double scale = scaler ? scaler->scale() : 1.0;
  std::deque<InFlight> alive;
  at::Tensor loss_total = torch::zeros({}, torch::kDouble);
  const auto start = Clock::now();
  double backward_s = 0;

  // Activation memory (MemoryReport::activations_peak): what the forwards
  // in flight keep allocated, at most `stages - stage` micro-batches' worth.
  const int64_t allocated_before = activations::allocated_bytes(model_device);
  double wait_s = 0;
  auto timed = [&wait_s](auto&& receive) {
    const auto t0 = Clock::now();
    at::Tensor t = receive();
    wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
    return t;
  };
  auto forward_one = [&] {
    Engine::Batch batch;
    if (first || last) batch = next_batch();
    at::Tensor input =
        first ? batch.first.to(model_device) : timed([&] { return links->recv_activation(model_device); });
    if (!first && train && input.is_floating_point()) input.requires_grad_(true);
    at::Tensor output = pipeline->forward(input);
    if (last) {
      output = pipeline->loss(output, batch.second.to(output.device()));
      loss_total += output.detach().to(at::kCPU).to(at::kDouble);
    } else {
      links->send_activation(output);
    }
    if (train) alive.push_back({input, output});
    if (const int64_t now = activations::allocated_bytes(model_device); train && now >= 0 && allocated_before >= 0) {
      activations_peak = std::max(activations_peak, now - allocated_before);
    }
  };
  auto backward_one = [&](int64_t i) {
    const auto t0 = Clock::now();
    InFlight f = std::move(alive.front());
    alive.pop_front();
    sharded->begin_backward(/*boundary=*/i == m - 1);
    try {
      if (last) {
        (f.output * (scale / static_cast<double>(m))).backward();
      } else {
        const at::Tensor grad = timed([&] { return links->recv_gradient(model_device); });
        torch::autograd::backward({f.output}, {grad});
      }
    } catch (...) {
      sharded->end_backward();
      throw;
    }
    sharded->end_backward();
    if (!first && f.input.requires_grad()) links->send_gradient(f.input.grad());
    backward_s += std::chrono::duration<double>(Clock::now() - t0).count();
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
  if (links) links->finish_sends();

  // The last stage's mean, from its tp rank 0 of each data-parallel rank,
  // to every rank (one all-reduce over the world).
  at::Tensor mean = (last && mesh->coordinates().tp == 0) ? loss_total / static_cast<double>(m) : torch::zeros({}, torch::kDouble);
  mean = mean.reshape({1});
  pg->all_reduce(mean, comm::ReduceOp::Sum);
  const double loss = mean.item<double>() / mesh->shape().dp;
  if (train) {
    t_backward += backward_s;
    t_pipeline_wait += wait_s;
    t_forward += std::chrono::duration<double>(Clock::now() - start).count() - backward_s;
    at::Tensor agreed = torch::tensor(loss, at::kFloat);
    loss_sum = loss_sum.defined() ? loss_sum + agreed : agreed;
    ++loss_count;
  }
  return loss;
}

double Engine::train_batch(const std::function<Batch()>& next_batch) {
  Impl& s = *impl_;
  if (!s.pipeline) {
    throw EngineError("engine.train_batch runs a zero::pipe::PipelineModule; for other models call "
                      "engine.backward(loss) and engine.step() per micro-batch");
  }
  const double loss = s.pipeline_batch(next_batch, /*train=*/true);
  s.steps.micro_steps += s.gas;
  const auto start = Clock::now();
  s.take_step();
  s.t_step += std::chrono::duration<double>(Clock::now() - start).count();
  s.record_step(loss);
  s.log_progress();
  s.forward_starts();
  s.last_step_end = Clock::now();
  return loss;
}

int64_t Engine::pipeline_bytes_sent() const { return impl_->links ? impl_->links->bytes_sent() : 0; }

double Engine::eval_batch(const std::function<Batch()>& next_batch) {
  Impl& s = *impl_;
  if (!s.pipeline) throw EngineError("engine.eval_batch runs a zero::pipe::PipelineModule; call the model for others");
  const bool was_training = s.module->is_training();
  s.module->eval();
  double loss = 0;
  try {
    loss = s.pipeline_batch(next_batch, /*train=*/false);
  } catch (...) {
    s.module->train(was_training);
    throw;
  }
  s.module->train(was_training);
  return loss;
}

}  // namespace zero
