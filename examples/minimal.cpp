// The shortest use of zero: a model, a ds_config, three lines in the loop.
//   zero-run --nproc 2 zero-minimal
#include <torch/torch.h>
#include <zero/zero.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1) {  // no options; -h or --help asks for this line
    const bool help = argc == 2 && (!std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help"));
    std::fputs("usage: zero-run --nproc 2 zero-minimal (no options)\n", help ? stdout : stderr);
    return help ? 0 : 2;
  }
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  auto engine = zero::initialize(zero::Config::from_json(R"({
      "train_micro_batch_size_per_gpu": 32, "steps_per_print": 100,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "zero_optimization": {"stage": 2}})"),
                                 model);
  torch::manual_seed(1 + engine.group().rank());  // each rank its own data
  for (int step = 0; step < 300; ++step) {
    auto x = torch::randn({32, 8});
    auto loss = torch::mse_loss(model->forward(x), x.sum(1, true).sin());
    engine.backward(loss);
    engine.step();
  }
  return 0;
}
