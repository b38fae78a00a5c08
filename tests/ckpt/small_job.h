#pragma once
// The small stage-2 job that the checkpoint fault-injection programs
// (ckpt_killed_save, ckpt_concurrent_saver) train, save and load.
#include <torch/torch.h>

#include "zero/zero.h"

namespace small_job {

inline torch::nn::Sequential make_model() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

inline zero::Engine make_engine(torch::nn::Sequential& model) {
  return zero::initialize(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 20}})"),
                          model);
}

// One step on data that depends only on the step and the rank, so a resumed
// job sees what an uninterrupted one would.
inline void step(zero::Engine& engine, torch::nn::Sequential& model) {
  auto gen = at::detail::createCPUGenerator(10 * engine.global_steps() + engine.group().rank());
  engine.backward(model->forward(torch::randn({4, 6}, gen)).pow(2).mean());
  engine.step();
}

}  // namespace small_job
