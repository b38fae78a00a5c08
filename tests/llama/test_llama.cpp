// The Llama family (zero/llama.h) against transformers' LlamaForCausalLM on the fixtures of
// tests/fixtures/llama (tools/fixtures/make_llama_fixtures.py): the same
// weights (loaded by Engine::load_weights from save_pretrained's files)
// give transformers' float32 logits within 1e-5 relative; config.json keys
// that change the architecture in ways not built are refused by name; bad
// weight files are refused naming the tensor.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "tests/llama/llama_reference.h"
#include "zero/llama.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using zero::llama::LlamaConfig;
using zero::llama::LlamaForCausalLM;

using llama_reference::first_sequence;
using llama_reference::kFixtures;

zero::Engine engine_for(LlamaForCausalLM& model) {
  return zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0}}})"),
      model);
}

// A fixture's model with its Hugging Face weights, in eval mode.
struct Loaded {
  explicit Loaded(const std::string& name)
      : model(LlamaConfig::from_file(kFixtures / name / "config.json")), engine(engine_for(model)) {
    engine.load_weights(kFixtures / name);
    model->eval();
  }
  LlamaForCausalLM model;
  zero::Engine engine;
};

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Llama, LogitsEqualTransformers) {
  for (const std::string name : {"gqa_untied", "tied_llama3"}) {
    SCOPED_TRACE(name);
    Loaded loaded(name);
    LlamaForCausalLM& model = loaded.model;
    const at::Tensor want = llama_reference::transformers_logits(name);
    torch::NoGradGuard no_grad;
    at::Tensor ids = torch::tensor(first_sequence(want.size(0))).unsqueeze(0);
    at::Tensor got = model->forward(ids)[0];
    const double error = llama_reference::relative_error(got, want);
    EXPECT_LT(error, 1e-5) << "largest difference, relative to the largest logit";
    std::printf("%s: logits within %.2e of transformers'\n", name.c_str(), error);
  }
}

// Long context's pieces on the fixtures: blockwise attention (4 query rows a
// block) and the MLPs over 3 tiles give transformers' logits, and the tiled
// loss with its gradients equals the plain one.
TEST(Llama, BlockwiseAttentionAndTiledMlpKeepTransformersLogits) {
  for (const std::string name : {"gqa_untied", "tied_llama3"}) {
    SCOPED_TRACE(name);
    Loaded loaded(name);
    LlamaForCausalLM& model = loaded.model;
    model->blockwise_attention(4);
    model->tiled(3, 3);
    const at::Tensor want = llama_reference::transformers_logits(name);
    torch::NoGradGuard no_grad;
    at::Tensor ids = torch::tensor(first_sequence(want.size(0))).unsqueeze(0);
    const double error = llama_reference::relative_error(model->forward(ids)[0], want);
    EXPECT_LT(error, 1e-5) << "largest difference, relative to the largest logit";
    std::printf("%s, blockwise attention and tiled MLPs: logits within %.2e of transformers'\n", name.c_str(), error);
  }
}

TEST(Llama, BlockwiseAttentionEqualsEagerForwardAndBackward) {
  torch::manual_seed(3);
  const at::Tensor q0 = torch::randn({2, 3, 23, 8}), k0 = torch::randn({2, 3, 23, 8}), v0 = torch::randn({2, 3, 23, 8});
  const at::Tensor d_out = torch::randn({2, 3, 23, 8});
  auto eager = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    at::Tensor s = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(8.0);
    s = s.masked_fill(torch::ones({23, 23}, torch::kBool).triu(1), -std::numeric_limits<float>::infinity());
    return torch::matmul(torch::softmax(s, -1), v);
  };
  auto run = [&](const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& attention) {
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
    at::Tensor out = attention(q, k, v);
    (out * d_out).sum().backward();
    return std::vector<at::Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
  };
  const auto want = run(eager);
  for (int64_t block : {1, 4, 7, 23, 64}) {  // uneven, the whole sequence, more than it
    const auto got = run([block](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
      return zero::llama::blockwise_causal_attention(q, k, v, block);
    });
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LT(llama_reference::relative_error(got[i], want[i]), 1e-6) << "block " << block << ", tensor " << i;
    }
  }
}

TEST(Llama, ConfigKeysThatChangeTheArchitectureAreRefusedByName) {
  const std::string good = text_of(kFixtures / "gqa_untied" / "config.json");
  auto message = [&](const std::string& key, const std::string& value) {
    auto j = nlohmann::json::parse(good);
    j[key] = nlohmann::json::parse(value);
    try {
      LlamaConfig::from_json_text(j.dump(), "config.json");
    } catch (const zero::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message("model_type", R"("mistral")").find("\"model_type\" is \"mistral\""), std::string::npos);
  EXPECT_NE(message("sliding_window", "4096").find("\"sliding_window\" is set"), std::string::npos);
  EXPECT_NE(message("hidden_act", R"("gelu")").find("\"hidden_act\""), std::string::npos);
  EXPECT_NE(message("rope_parameters", R"({"rope_type": "yarn", "rope_theta": 10000})").find("\"rope_type\" is \"yarn\""),
            std::string::npos);
  EXPECT_NE(message("num_key_value_heads", "3").find("multiple of \"num_key_value_heads\""), std::string::npos);
  EXPECT_NE(message("hidden_size", "-1").find("\"hidden_size\" must be a positive integer"), std::string::npos);
  EXPECT_EQ(message("use_cache", "false"), "(accepted)");  // no change to the architecture: ignored
  // transformers 4's spelling of the rope keys reads the same.
  auto old = nlohmann::json::parse(text_of(kFixtures / "tied_llama3" / "config.json"));
  old["rope_theta"] = old["rope_parameters"]["rope_theta"];
  old["rope_scaling"] = old["rope_parameters"];
  old.erase("rope_parameters");
  const LlamaConfig a = LlamaConfig::from_json_text(old.dump(), "old"), b = LlamaConfig::from_file(kFixtures / "tied_llama3" / "config.json");
  EXPECT_TRUE(a.llama3_rope && b.llama3_rope);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.original_max_position_embeddings, b.original_max_position_embeddings);
}

TEST(Llama, WeightsThatDisagreeWithTheConfigAreRefusedNamingTheTensor) {
  // A config whose intermediate_size is not the files': load_weights names the tensor.
  auto j = nlohmann::json::parse(text_of(kFixtures / "gqa_untied" / "config.json"));
  j["intermediate_size"] = 48;
  LlamaForCausalLM model(LlamaConfig::from_json_text(j.dump(), "config.json"));
  zero::Engine engine = engine_for(model);
  std::string message;
  try {
    engine.load_weights(kFixtures / "gqa_untied");
  } catch (const zero::CheckpointError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << message;
  // Tied embeddings where the files hold an lm_head: the extra tensor is named.
  j = nlohmann::json::parse(text_of(kFixtures / "gqa_untied" / "config.json"));
  j["tie_word_embeddings"] = true;
  LlamaForCausalLM tied(LlamaConfig::from_json_text(j.dump(), "config.json"));
  zero::Engine engine2 = engine_for(tied);
  message.clear();
  try {
    engine2.load_weights(kFixtures / "gqa_untied");
  } catch (const zero::CheckpointError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("lm_head.weight"), std::string::npos) << message;
}

}  // namespace
