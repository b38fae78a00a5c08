// A Hugging Face Llama fixture trained a few steps by zero, for the tests of
// tests/llama: loads the weights (Engine::load_weights), takes STEPS AdamW
// steps on the token file's sequences, saves a zero checkpoint and writes
// the logits of the first sequence after training:
//
//   zero-run --nproc N llama_steps HF_DIR TOKENS CTX STEPS CKPT_DIR LOGITS.safetensors
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "llama/llama.h"
#include "zero/zero.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: llama_steps HF_DIR TOKENS CTX STEPS CKPT_DIR LOGITS.safetensors\n");
    return 2;
  }
  try {
    at::set_num_threads(1);
    const std::string hf = argv[1];
    const int64_t ctx = std::stoll(argv[3]), steps = std::stoll(argv[4]);
    const auto config = zero_examples::llama::LlamaConfig::from_file(hf + "/config.json");
    std::vector<int64_t> tokens;  // little-endian uint16 ids (this machine's order)
    std::ifstream in(argv[2], std::ios::binary);
    for (uint16_t t; in.read(reinterpret_cast<char*>(&t), 2);) tokens.push_back(t);
    torch::manual_seed(0);
    zero_examples::llama::LlamaForCausalLM model(config);
    zero::Engine engine = zero::initialize(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 2}})"),
                                           model);
    engine.load_weights(hf);
    const int rank = engine.group().rank(), world = engine.group().size();
    const int64_t sequences = static_cast<int64_t>(tokens.size()) / ctx;
    auto sequence = [&](int64_t s) {
      return torch::tensor(std::vector<int64_t>(tokens.begin() + s * ctx, tokens.begin() + (s + 1) * ctx)).unsqueeze(0);
    };
    for (int64_t step = 0; step < steps; ++step) {
      at::Tensor ids_t = sequence((step * world + rank) % sequences);
      at::Tensor loss = model->loss(ids_t.slice(1, 0, ctx - 1), ids_t.slice(1, 1, ctx));
      engine.backward(loss);
      engine.step();
    }
    engine.save_checkpoint(argv[5]);
    if (rank == 0) {
      torch::NoGradGuard no_grad;
      at::Tensor logits = model->forward(sequence(0)).to(torch::kFloat)[0].contiguous();
      zero::ckpt::TensorData d;
      d.name = "logits";
      d.shape = logits.sizes().vec();
      d.data = logits.data_ptr();
      d.bytes = logits.nbytes();
      zero::ckpt::write_safetensors(argv[6], {d});
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_steps: %s\n", e.what());
    return 1;
  }
}
