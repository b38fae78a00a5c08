// zero's side of the DeepSpeed comparison (tests/peers/same_curve.sh) and of
// the checkpoint interop tests (tests/interop/): the GPT of examples/gpt
// trained by zero from a ds_config file, on the batches
// bench/deepspeed_peer.py trains DeepSpeed on.
//
//   zero-run --nproc N deepspeed_train --config CONFIG.json --out OUT.json --steps S
//       [--weights-out WEIGHTS.safetensors] [--load DIR] [--save DIR]
//       [--vocab 29] [--context 16] [--width 32] [--depth 2] [--heads 2]
//
// OUT: {"losses": [...], "grad_norms": [...], "lr": [...]}, one entry per
// optimizer step (the mean loss of its micro-batches over the ranks).
// --weights-out: rank 0 writes the weights the model starts from (by zero's
// parameter names) before the first step, for the peer to start from.
// --load: resume from a zero checkpoint first; the batches go on from its
// global step, as the peer's --load does. --save: save after the steps.
// The shape defaults are bench/deepspeed_peer.py's.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "gpt/gpt.h"
#include "zero/zero.h"

namespace {

// Rank r's micro-batch k of step s, as bench/deepspeed_peer.py makes it:
// row i is sample r * micro + i of the step, whatever the world size.
std::pair<at::Tensor, at::Tensor> batch(int64_t step, int64_t k, int64_t rank, int64_t micro, int64_t context,
                                        int64_t vocab) {
  at::Tensor sample = (rank * micro + torch::arange(micro, torch::kLong)).unsqueeze(1);
  at::Tensor j = torch::arange(context + 1, torch::kLong).unsqueeze(0);
  at::Tensor tokens = (7 * sample + 5 * step + 11 * k + j) % vocab;
  return {tokens.slice(1, 0, context), tokens.slice(1, 1, context + 1)};
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

struct Args {
  std::string config, out, weights_out, load, save;
  int64_t steps = 20, vocab = 29, context = 16, width = 32, depth = 2, heads = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string*> texts{{"--config", &a.config}, {"--out", &a.out}, {"--weights-out", &a.weights_out},
                                            {"--load", &a.load}, {"--save", &a.save}};
  std::map<std::string, int64_t*> numbers{{"--steps", &a.steps}, {"--vocab", &a.vocab},   {"--context", &a.context},
                                          {"--width", &a.width}, {"--depth", &a.depth}, {"--heads", &a.heads}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value");
    if (texts.count(flag)) {
      *texts[flag] = argv[i + 1];
    } else if (numbers.count(flag)) {
      *numbers[flag] = std::stoll(argv[i + 1]);
    } else {
      throw std::runtime_error("unknown option " + flag);
    }
  }
  if (a.config.empty() || a.out.empty()) throw std::runtime_error("--config and --out are required");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    at::set_num_threads(1);  // as the peer (--threads 1)
    const zero::Config config = zero::Config::from_file(args.config);
    zero_examples::GPTOptions o;
    o.vocab_size = args.vocab;
    o.context = args.context;
    o.width = args.width;
    o.depth = args.depth;
    o.heads = args.heads;
    torch::manual_seed(0);
    zero_examples::GPT model(o);
    auto world = zero::comm::init_process_group();
    zero::InitOptions init;
    init.group = world;
    zero::Engine engine = zero::initialize(config, model, init);
    const int rank = world->rank();
    if (!args.weights_out.empty()) {
      const auto state = engine.gathered_state_dict();
      if (rank == 0) write_weights(args.weights_out, state);
    }
    if (!args.load.empty()) engine.load_checkpoint(args.load);
    const int64_t first = engine.global_steps();
    const int64_t micro = config.batch.train_micro_batch_size_per_gpu.value_or(1);
    const int64_t accumulation = config.batch.gradient_accumulation_steps.value_or(1);
    std::vector<double> losses, norms, lrs;
    for (int64_t step = first; step < first + args.steps; ++step) {
      double total = 0;
      for (int64_t k = 0; k < accumulation; ++k) {
        auto [tokens, targets] = batch(step, k, rank, micro, args.context, args.vocab);
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
    if (!args.save.empty()) engine.save_checkpoint(args.save);
    if (rank == 0) {
      std::ofstream(args.out) << nlohmann::json{{"losses", losses}, {"grad_norms", norms}, {"lr", lrs}}.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepspeed_train: %s\n", e.what());
    return 1;
  }
}
