// The shortest use of zero: a model, a ds_config, three lines in the loop.
//   zero-run --nproc 2 zero-minimal
#include <torch/torch.h>
#include <zero/zero.h>

int main() {
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
