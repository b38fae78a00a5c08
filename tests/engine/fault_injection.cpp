// A training run that can be killed anywhere and resumed: `train DIR STEPS
// SAVE_EVERY [STAGE [IN_MEMORY]]` loads DIR's newest complete checkpoint if there is
// one, trains to STEPS global steps saving every SAVE_EVERY, and rank 0
// writes the final parameters' bytes to DIR/final.bin. fp16 with dynamic
// loss scaling and AdamW: inputs get an inf on one rank at steps chosen by
// a hash of the step, so overflows (skipped steps, scale changes) happen
// throughout and must resume exactly too. fault_injection.sh kills ranks
// with ZERO_FAULT and checks that the resumed run's final.bin equals an
// uninterrupted run's, byte for byte. IN_MEMORY > 0 sets
// checkpoint.in_memory.interval (Note [In-memory copies]).
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>

#include "tests/engine/elementwise_model.h"
#include "zero/zero.h"

namespace {

using zero_test::Elementwise;
using zero_test::kN;

bool overflows_at(int64_t step) { return (static_cast<uint64_t>(step) * 2654435761u) % 11 == 0; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::string(argv[1]) != "train") {
    std::cerr << "usage: fault_injection train DIR STEPS SAVE_EVERY [STAGE [IN_MEMORY]]\n";
    return 2;
  }
  const std::string dir = argv[2];
  const int64_t steps = std::stoll(argv[3]), save_every = std::stoll(argv[4]);
  const std::string stage = argc > 5 ? argv[5] : "2";
  const std::string in_memory = argc > 6 ? argv[6] : "0";
  Elementwise model;
  auto engine = zero::initialize(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4,
      "steps_per_print": 1000000, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 20}},
      "fp16": {"enabled": true, "initial_scale_power": 10, "loss_scale_window": 8, "hysteresis": 2},
      "checkpoint": {"in_memory": {"interval": )" + in_memory + R"(}},
      "zero_optimization": {"stage": )" + stage + R"(, "reduce_bucket_size": 16}})"),
                                 model);
  const int rank = engine.group().rank(), world = engine.group().size();
  engine.load_checkpoint_if_present(dir);  // a restart resumes here (Note [Restarts] in tools/launcher/launcher.cpp)
  while (engine.global_steps() < steps) {
    const int64_t step = engine.global_steps();
    auto gen = at::detail::createCPUGenerator(1000 + step * 7 + rank);
    auto x = torch::randn({4, kN}, gen).to(at::kHalf);
    if (overflows_at(step) && rank == step % world) x[0][0] = std::numeric_limits<float>::infinity();
    engine.backward((model->forward(x).to(at::kFloat) - 1.0).pow(2).mean());
    engine.step();
    if (engine.global_steps() % save_every == 0) engine.save_checkpoint(dir);
  }
  if (rank == 0) {
    auto flat = torch::cat({model->w.detach().flatten(), model->b.detach().flatten()}).contiguous();
    std::ofstream out(dir + "/final.bin", std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(flat.data_ptr()), static_cast<std::streamsize>(flat.nbytes()));
  }
  return 0;
}
