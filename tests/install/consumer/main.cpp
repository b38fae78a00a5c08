#include <torch/torch.h>
#include <zero/zero.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

// A user's program built against an installed zero (find_package(zero)),
// written from the README alone; run alone and under the installed zero-run.
//   consumer                                   each rank gets its own slice of a reduce-scatter
//   consumer train STAGE STEPS CKPT LOG        trains an MLP to global step STEPS at ZeRO stage STAGE,
//                                              resuming from CKPT if it holds a checkpoint, then saves
//                                              there; rank 0 appends "step N loss X" lines to LOG
//   consumer compare LOG REFERENCE TOLERANCE   the same steps, losses within TOLERANCE relative

struct BlockImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  explicit BlockImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(width, width)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
};
TORCH_MODULE(Block);

struct Mlp : torch::nn::Module {
  std::vector<zero::Unit<Block>> blocks;  // stage 3 gathers each block as a whole
  torch::nn::Linear head{nullptr};
  Mlp() {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(zero::Unit<Block>(Block(16)));
      register_module("block" + std::to_string(i), blocks.back());
    }
    head = register_module("head", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return head(x);
  }
};

int reduce_scatter() {
  auto world = zero::comm::init_process_group();
  auto input = torch::arange(6).to(torch::kFloat);
  const int64_t n = 6 / world->size();
  auto output = torch::empty({n});
  world->reduce_scatter(output, input);
  const bool ok = output.equal(input.slice(0, world->rank() * n, (world->rank() + 1) * n) * world->size());
  std::printf("consumer: reduce_scatter on %d rank(s): %s\n", world->size(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}

int train(int stage, int64_t steps, const std::string& ckpt, const std::string& log) {
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>();
  // The same global batch of 8 at any world size: the micro batch follows.
  const std::string json = R"({"train_batch_size": 8, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": )" + std::to_string(stage) + "}}";
  auto engine = zero::initialize(zero::Config::from_json(json), model);
  const bool resumed = engine.load_checkpoint_if_present(ckpt).has_value();
  torch::manual_seed(1);
  const auto x = torch::randn({64, 16});
  const auto y = x.sum(1, true).sin();
  zero::DataLoaderOptions in_order;
  in_order.shuffle = false;
  auto loader = engine.data_loader(std::make_shared<zero::TensorDataset>(std::vector<torch::Tensor>{x, y}), in_order);
  const int64_t per_epoch = loader.batches_per_epoch();
  const int64_t done = engine.global_steps();
  loader.set_position({done / per_epoch, done % per_epoch * loader.global_batch_size()});
  std::ofstream out;
  if (engine.group().rank() == 0) {
    out.open(log, std::ios::app);
    out.precision(17);
  }
  while (engine.global_steps() < steps) {
    for (const auto& batch : loader) {
      auto loss = torch::mse_loss(model->forward(batch[0]), batch[1]);
      engine.backward(loss);
      engine.step();
      auto mean = loss.detach().clone();
      engine.mesh().dp_group()->all_reduce(mean, zero::comm::ReduceOp::Avg);
      if (out.is_open()) out << "step " << engine.global_steps() << " loss " << mean.item<double>() << "\n";
      if (engine.global_steps() == steps) break;
    }
  }
  engine.save_checkpoint(ckpt);
  if (engine.group().rank() == 0) {
    std::printf("consumer: stage %d on %d rank(s)%s, to step %lld\n", stage, engine.group().size(),
                resumed ? ", resumed" : "", static_cast<long long>(steps));
  }
  return 0;
}

std::vector<std::pair<int64_t, double>> read_log(const std::string& path) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(path);
  std::string word1, word2;
  int64_t step = 0;
  double loss = 0;
  while (in >> word1 >> step >> word2 >> loss) out.emplace_back(step, loss);
  return out;
}

int compare(const std::string& log, const std::string& reference, double tolerance) {
  const auto a = read_log(log), b = read_log(reference);
  double worst = 0;
  bool ok = !a.empty() && a.size() == b.size();
  for (size_t i = 0; ok && i < a.size(); ++i) {
    ok = a[i].first == b[i].first;
    worst = std::max(worst, std::abs(a[i].second - b[i].second) / std::abs(b[i].second));
  }
  ok = ok && worst <= tolerance;
  std::printf("consumer: %zu steps against %zu, largest relative difference %.2e: %s\n", a.size(), b.size(), worst,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode.empty()) return reduce_scatter();
    if (mode == "train" && argc == 6) return train(std::stoi(argv[2]), std::stoll(argv[3]), argv[4], argv[5]);
    if (mode == "compare" && argc == 5) return compare(argv[2], argv[3], std::stod(argv[4]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: consumer | consumer train STAGE STEPS CKPT LOG | consumer compare LOG REFERENCE TOLERANCE\n");
  return 2;
}
