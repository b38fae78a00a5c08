// zero's side of the DeepSpeed comparison (tests/peers/same_curve.sh): the
// GPT of examples/gpt trained by zero from a ds_config file, on the batches
// bench/deepspeed_peer.py trains DeepSpeed on.
//
//   zero-run --nproc 2 deepspeed_train CONFIG.json WEIGHTS_OUT.safetensors OUT.json STEPS
//
// Rank 0 writes the weights the model starts from (by zero's parameter
// names) to WEIGHTS_OUT before the first step, for the peer to start from,
// and OUT: {"losses": [...], "grad_norms": [...], "lr": [...]}, one entry per
// optimizer step (the mean loss of its micro-batches over the ranks). The
// shape is bench/deepspeed_peer.py's default: vocab 29, context 16, width
// 32, depth 2, heads 2.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "gpt/gpt.h"
#include "zero/zero.h"

namespace {

constexpr int64_t kVocab = 29, kContext = 16;

// Rank r's micro-batch k of step s, as bench/deepspeed_peer.py makes it.
std::pair<at::Tensor, at::Tensor> batch(int64_t step, int64_t k, int64_t rank, int64_t micro) {
  at::Tensor i = torch::arange(micro, torch::kLong).unsqueeze(1);
  at::Tensor j = torch::arange(kContext + 1, torch::kLong).unsqueeze(0);
  at::Tensor tokens = (7 * i + 5 * step + 3 * (rank * micro) + 11 * k + j) % kVocab;
  return {tokens.slice(1, 0, kContext), tokens.slice(1, 1, kContext + 1)};
}

void write_weights(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::vector<zero::ckpt::TensorData> tensors;
  std::vector<at::Tensor> kept;
  for (const auto& [name, t] : state) {
    kept.push_back(t.to(at::kFloat).contiguous());
    zero::ckpt::TensorData d;
    d.name = name;
    d.dtype = zero::ckpt::DType::F32;
    d.shape = kept.back().sizes().vec();
    d.data = kept.back().data_ptr();
    d.bytes = kept.back().nbytes();
    tensors.push_back(d);
  }
  zero::ckpt::write_safetensors(path, tensors);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: deepspeed_train CONFIG.json WEIGHTS_OUT.safetensors OUT.json STEPS\n");
    return 2;
  }
  try {
    at::set_num_threads(1);  // as the peer (--threads 1)
    const zero::Config config = zero::Config::from_file(argv[1]);
    zero_examples::GPTOptions o;
    o.vocab_size = kVocab;
    o.context = kContext;
    o.width = 32;
    o.depth = 2;
    o.heads = 2;
    torch::manual_seed(0);
    zero_examples::GPT model(o);
    auto world = zero::comm::init_process_group();
    zero::InitOptions init;
    init.group = world;
    zero::Engine engine = zero::initialize(config, model, init);
    const int rank = world->rank();
    const auto state = engine.gathered_state_dict();
    if (rank == 0) write_weights(argv[2], state);
    const int64_t micro = config.batch.train_micro_batch_size_per_gpu.value_or(1);
    const int64_t accumulation = config.batch.gradient_accumulation_steps.value_or(1);
    std::vector<double> losses, norms, lrs;
    for (int64_t step = 0; step < std::stoll(argv[4]); ++step) {
      double total = 0;
      for (int64_t k = 0; k < accumulation; ++k) {
        auto [tokens, targets] = batch(step, k, rank, micro);
        at::Tensor loss = model->loss(tokens, targets);
        engine.backward(loss);
        engine.step();
        total += loss.item<double>();
      }
      at::Tensor mean = torch::tensor({total / static_cast<double>(accumulation)}, torch::kDouble);
      world->all_reduce(mean, zero::comm::ReduceOp::Sum);
      losses.push_back(mean.item<double>() / world->size());
      norms.push_back(engine.last_grad_norm());
      lrs.push_back(engine.lr());
    }
    if (rank == 0) {
      std::ofstream(argv[3]) << nlohmann::json{{"losses", losses}, {"grad_norms", norms}, {"lr", lrs}}.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepspeed_train: %s\n", e.what());
    return 1;
  }
}
