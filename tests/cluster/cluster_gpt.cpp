// ZeRO++'s convergence run (tests/cluster/cluster_zeropp_convergence.sh):
// examples/gpt's GPT, its blocks zero::Units, trained at stage 3 on the
// example's corpus, each step's batch a function of the step and the
// data-parallel rank only (gpt/corpus.h's Batcher), so every variant and a
// resumed run see the same data.
//
//   cluster_gpt --steps N [--zero-extra JSON] [--save-at S --save DIR] [--load DIR]
//
// Rank 0 prints each step's loss averaged over the data-parallel ranks in
// rank order ("step K loss %a %.9g"). --save-at S saves a checkpoint into
// DIR after step S and goes on; --load DIR resumes from one and runs up to
// step N. --zero-extra adds keys to zero_optimization (ZeRO++'s).
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "zero/zero.h"

using namespace zero_examples;

int main(int argc, char** argv) {
  int64_t steps = 0, save_at = 0;
  std::string zero_extra, save_dir, load_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--steps") steps = std::stoll(argv[i + 1]);
    else if (arg == "--zero-extra") zero_extra = ", " + std::string(argv[i + 1]);
    else if (arg == "--save-at") save_at = std::stoll(argv[i + 1]);
    else if (arg == "--save") save_dir = argv[i + 1];
    else if (arg == "--load") load_dir = argv[i + 1];
    else {
      std::cerr << "cluster_gpt: unknown option " << arg << "\n";
      return 2;
    }
  }
  if (steps <= 0 || (save_at > 0) != !save_dir.empty()) {
    std::cerr << "usage: cluster_gpt --steps N [--zero-extra JSON] [--save-at S --save DIR] [--load DIR]\n";
    return 2;
  }
  try {
    at::set_num_threads(1);   // four ranks share the machine's cores
    Corpus corpus;
    Batcher batcher(corpus.train_tokens(), BatcherOptions{0, 1});
    GPTOptions o;
    o.vocab_size = corpus.vocab_size();
    o.depth = 2;
    o.width = 64;
    o.heads = 4;
    o.context = 32;
    const int64_t micro = 8;
    torch::manual_seed(0);
    GPT model(o);
    // Every unit is gathered again for its backward (reuse distance 0), as
    // in a model larger than stage3_max_reuse_distance, so that hpZ's
    // secondary partition serves those gathers.
    auto engine = zero::initialize(
        zero::Config::from_json(std::string(R"({"train_micro_batch_size_per_gpu": 8,
        "steps_per_print": 1000000, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 20000, "stage3_prefetch_bucket_size": 20000,
                              "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0,
                              "zero_quantization_block_size": 256)") +
                                zero_extra + "}}"),
        model);
    const zero::Mesh& mesh = engine.mesh();
    const int rank = engine.group().rank(), dp = mesh.dp_group()->size(), dp_rank = mesh.dp_group()->rank();
    int64_t first = 0;
    if (!load_dir.empty()) {
      engine.load_checkpoint(load_dir);
      first = engine.global_steps();
    }
    for (int64_t step = first; step < steps; ++step) {
      Batch batch = batcher.next_batch(micro, o.context, dp_rank, dp, step, 0);
      at::Tensor loss = model->loss(batch.inputs, batch.targets);
      engine.backward(loss);
      engine.step();
      at::Tensor all = torch::empty({dp});
      mesh.dp_group()->all_gather(all, loss.detach().reshape({1}).contiguous());
      if (rank == 0) {
        double sum = 0;  // in rank order
        for (int r = 0; r < dp; ++r) sum += all[r].item<float>();
        std::printf("step %lld loss %a %.9g\n", static_cast<long long>(step + 1), sum / dp, sum / dp);
        std::fflush(stdout);
      }
      if (step + 1 == save_at) engine.save_checkpoint(save_dir);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
