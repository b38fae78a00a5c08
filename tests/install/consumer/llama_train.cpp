// README's "Fine-tuning a Hugging Face model" program, built against an
// installed zero with find_package(zero) and the target zero::llama: a
// Llama from a Hugging Face folder, fine-tuned on a token file and saved
// as a folder transformers loads.
//   consumer_llama HF_DIR DS_CONFIG TOKENS STEPS OUT
#include <torch/torch.h>
#include <zero/llama.h>
#include <zero/zero.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: consumer_llama HF_DIR DS_CONFIG TOKENS STEPS OUT\n");
    return 2;
  }
  const std::string hf_dir = argv[1], out = argv[5];
  const int64_t steps = std::stoll(argv[4]), ctx = 16;

  const auto config = zero::llama::LlamaConfig::from_file(hf_dir + "/config.json");
  zero::llama::LlamaForCausalLM model(config);
  auto engine = zero::initialize(zero::Config::from_file(argv[2]), model);
  engine.load_weights(hf_dir);  // model.safetensors, or an index and its shards

  // uint16 token ids cut into sequences of ctx tokens, each ctx - 1 next-token predictions.
  auto tokens = std::make_shared<zero::TokenDataset>(argv[3], ctx, 2);
  zero::DataLoaderOptions in_order;
  in_order.shuffle = false;
  zero::DataLoader loader = engine.data_loader(tokens, in_order);
  for (int64_t step = 0; step < steps;) {
    for (const auto& batch : loader) {  // one epoch; the next pass starts the next
      const at::Tensor& rows = batch[0];  // [micro, ctx]
      at::Tensor loss = model->loss(rows.slice(1, 0, ctx - 1), rows.slice(1, 1, ctx));
      engine.backward(loss);
      engine.step();
      ++step;
      if (engine.group().rank() == 0) std::printf("step %lld loss %.10g\n", static_cast<long long>(step), loss.item<double>());
      if (step == steps) break;
    }
  }
  // model.safetensors, beside the config.json the model was built from.
  engine.save_16bit_model(out);
  if (engine.group().rank() == 0) {
    std::filesystem::copy_file(hf_dir + "/config.json", out + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
  }
  return 0;
}
