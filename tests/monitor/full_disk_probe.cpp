// The issue's probe: a user's program with csv_monitor on a disk that is
// full (or fills after step FILL_AT, rank 0 filling it), which catches
// nothing, as most training scripts do. full_disk_probe.sh runs it on 2
// ranks under zero-run and checks that the job ends in time with a message
// naming the file.
//   full_disk_probe DIR [FILL_AT]
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "zero/zero.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: full_disk_probe DIR [FILL_AT]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int fill_at = argc > 2 ? std::stoi(argv[2]) : -1;
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  auto engine = zero::initialize(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 1},
      "csv_monitor": {"enabled": true, "output_path": ")" + dir + R"(", "job_name": "run"}})"),
                                 model);
  for (int step = 1; step <= 100000; ++step) {
    engine.backward(model(torch::randn({4, 8})).pow(2).mean());
    engine.step();
    if (step == fill_at && engine.group().rank() == 0) {
      std::FILE* f = std::fopen((dir + "/filler").c_str(), "a");
      std::setvbuf(f, nullptr, _IONBF, 0);
      std::vector<char> page(4096, 'x');
      while (std::fwrite(page.data(), 1, page.size(), f) == page.size()) {
      }
      std::fclose(f);
    }
  }
  std::printf("full_disk_probe: the run never failed\n");
  return 0;
}
