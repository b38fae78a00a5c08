// A run killed mid-way with the monitors on: one process trains 3 steps,
// saves a checkpoint (which flushes the monitors' files), trains 2 more and
// then kills itself with SIGKILL, as the machine or an out-of-memory killer
// would: no destructor runs, nothing more is flushed. CTest then reads the
// files it left (read_events.py): the event file and the CSV files hold at
// least the 3 flushed steps, every whole record intact.
//   monitor_killed_run DIR
#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <iostream>

#include "zero/zero.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: monitor_killed_run DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::remove_all(dir);
  const std::string monitor = R"({"enabled": true, "output_path": ")" + dir + R"(", "job_name": "run"})";
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  auto engine = zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 1},
        "csv_monitor": )" + monitor + R"(, "tensorboard": )" + monitor + "}"),
      model);
  for (int step = 1; step <= 5; ++step) {
    at::Tensor x = torch::randn({4, 8});
    engine.backward(model(x).pow(2).mean());
    engine.step();
    if (step == 3) engine.save_checkpoint(dir + "/ckpt");
  }
  std::cout << "monitor_killed_run: killing itself after 5 steps\n" << std::flush;
  std::raise(SIGKILL);
  return 0;
}
