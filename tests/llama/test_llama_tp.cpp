// The Llama family (zero/llama.h) at tensor parallelism 2 (run on 2 ranks): the embedding and
// the head split by vocabulary rows, the decoder layers by AutoTP's Llama
// rules, each rank holding half of the split weights, and the gathered
// float32 logits equal to transformers' (the fixture's logits.safetensors)
// within 1e-5 relative on every rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "tests/llama/llama_reference.h"
#include "zero/llama.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using zero::llama::LlamaConfig;
using zero::llama::LlamaForCausalLM;

using llama_reference::first_sequence;
using llama_reference::kFixtures;

int64_t numel(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(LlamaTensorParallel, LogitsEqualTransformersAtTp2) {
  ASSERT_EQ(g_world->size(), 2) << "run on 2 ranks";
  for (const std::string name : {"gqa_untied", "tied_llama3"}) {
    SCOPED_TRACE(name);
    const LlamaConfig config = LlamaConfig::from_file(kFixtures / name / "config.json");
    auto mesh = std::make_shared<zero::Mesh>(g_world, 2, 1);
    LlamaForCausalLM model(config, mesh->tp_group());
    zero::tp::auto_tensor_parallel(*model, mesh->tp_group(), zero::tp::llama_rules());
    const int64_t whole = numel(*LlamaForCausalLM(config));
    // Only the norms are whole on each rank: the split weights are halves.
    EXPECT_LT(numel(*model), whole * 6 / 10) << "of " << whole << " parameters";
    zero::InitOptions init;
    init.group = g_world;
    init.mesh = mesh;
    zero::Engine engine = zero::initialize(
        zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2},
                                    "optimizer": {"type": "SGD", "params": {"lr": 0}}})"),
        model, init);
    engine.load_weights(kFixtures / name);
    model->eval();
    const at::Tensor want = llama_reference::transformers_logits(name);
    torch::NoGradGuard no_grad;
    at::Tensor ids = torch::tensor(first_sequence(want.size(0))).unsqueeze(0);
    at::Tensor got = model->forward(ids)[0];
    ASSERT_EQ(got.sizes(), want.sizes());
    const double error = llama_reference::relative_error(got, want);
    EXPECT_LT(error, 1e-5) << "largest difference, relative to the largest logit";
    if (g_world->rank() == 0) std::printf("%s: logits within %.2e of transformers' at tp 2\n", name.c_str(), error);
  }
}

}  // namespace
