// The training run of the emulated-cluster tests (tests/cluster/): a small
// model of stage-3 units trained on data that depends only on the step and
// the data-parallel rank, so that 1 node x 4 ranks and 2 nodes x 2 ranks
// see the same batches.
//
//   cluster_train --steps N --out FILE [--step-sleep-ms M] [--zero-extra JSON]
//   cluster_train --layout-tp T
//
// Every rank prints its node and its node groups (Mesh::dp_intra_node_group,
// dp_inter_node_group) as world ranks with their transport; rank 0 prints
// each step's loss, averaged over the ranks in rank order, exactly (%a) and
// in decimal, and writes the final parameters' bytes, in state-dict order,
// to FILE. --step-sleep-ms slows the steps down so that a test can act
// while the job is mid-run. --zero-extra adds keys to zero_optimization
// (ZeRO++'s, for cluster.zeropp), e.g. '"zero_quantized_weights": true'.
// --layout-tp T only builds a zero::Mesh of tp T over the world and prints
// the layout line (no training).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "zero/zero.h"

namespace {

constexpr int64_t kIn = 16, kHidden = 48, kRows = 8;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out) { fc = register_module("fc", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(7);
    a = register_module("a", zero::Unit<Block>(Block(kIn, kHidden)));
    b = register_module("b", zero::Unit<Block>(Block(kHidden, kHidden)));
    head = register_module("head", torch::nn::Linear(kHidden, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(b(a(x))).squeeze(1); }
  zero::Unit<Block> a{nullptr}, b{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

std::string describe(const std::shared_ptr<zero::comm::ProcessGroup>& g) {
  if (!g) return "none";
  std::ostringstream out;
  out << "[";
  for (int r = 0; r < g->size(); ++r) out << (r ? "," : "") << g->global_rank(r);
  out << "] " << g->host_transport();
  return out.str();
}

void print_layout(zero::comm::ProcessGroup& world, const zero::Mesh& mesh) {
  std::printf("layout: rank %d node %d of %d; world %s; dp intra %s; dp inter %s\n", world.rank(),
              world.node(world.rank()), mesh.nodes(), world.host_transport().c_str(),
              describe(mesh.dp_intra_node_group()).c_str(), describe(mesh.dp_inter_node_group()).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 0, sleep_ms = 0, tp = 0;
  std::string out_path, zero_extra;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--steps") steps = std::stoll(argv[i + 1]);
    else if (arg == "--out") out_path = argv[i + 1];
    else if (arg == "--step-sleep-ms") sleep_ms = std::stoll(argv[i + 1]);
    else if (arg == "--layout-tp") tp = std::stoll(argv[i + 1]);
    else if (arg == "--zero-extra") zero_extra = ", " + std::string(argv[i + 1]);
    else {
      std::cerr << "cluster_train: unknown option " << arg << "\n";
      return 2;
    }
  }
  if ((steps <= 0 || out_path.empty()) && tp <= 0) {
    std::cerr << "usage: cluster_train --steps N --out FILE [--step-sleep-ms M] [--zero-extra JSON] | --layout-tp T\n";
    return 2;
  }
  try {
    if (tp > 0) {
      auto world = zero::comm::init_process_group();
      const zero::Mesh mesh(world, static_cast<int>(tp), 1);
      print_layout(*world, mesh);
      return 0;
    }
    Net model;
    auto engine = zero::initialize(zero::Config::from_json(std::string(R"({"train_micro_batch_size_per_gpu": 8,
        "steps_per_print": 1000000, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                              "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 0)") +
                                                           zero_extra + "}}"),
                                   model);
    auto& world = engine.group();
    const zero::Mesh& mesh = engine.mesh();
    const int rank = world.rank(), size = mesh.dp_group()->size();
    const int dp_rank = mesh.dp_group()->rank();
    print_layout(world, mesh);
    for (int64_t step = 0; step < steps; ++step) {
      // One global batch per step; this rank takes its rows.
      auto gen = at::detail::createCPUGenerator(1000 + step);
      auto x = torch::randn({size * kRows, kIn}, gen).narrow(0, dp_rank * kRows, kRows);
      auto y = torch::randn({size * kRows}, gen).narrow(0, dp_rank * kRows, kRows);
      auto loss = (model->forward(x) - y).pow(2).mean();
      engine.backward(loss);
      engine.step();
      auto all = torch::empty({size});
      mesh.dp_group()->all_gather(all, loss.detach().reshape({1}).contiguous());
      if (rank == 0) {
        double sum = 0;  // in rank order, the same on every layout
        for (int r = 0; r < size; ++r) sum += all[r].item<float>();
        std::printf("step %lld loss %a %.9g\n", static_cast<long long>(step + 1), sum / size, sum / size);
        std::fflush(stdout);
      }
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    const auto state = engine.gathered_state_dict();
    if (rank == 0) {
      std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
      for (const auto& [name, t] : state) {
        auto c = t.detach().contiguous();
        out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      }
      if (!out) throw std::runtime_error("cannot write " + out_path);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
