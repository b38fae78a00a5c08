// zero::Init and zero::initialize without a group, as a DeepSpeed user
// writes them, on 2 ranks: the ranks are joined once (engine::join keeps the
// group while anything holds it), initialize continues on the group the
// model was partitioned over, and a second zero::Init beside the engine
// joins nothing new. Its own main(): nothing joins before the test does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "gpt/gpt.h"
#include "zero/zero.h"

namespace {

TEST(InitJoinsOnce, InitThenInitializeShareOneRendezvous) {
  const zero::Config config = zero::Config::from_json(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})");
  zero_examples::GPTOptions o;
  o.vocab_size = 17;
  o.context = 8;
  o.width = 16;
  o.depth = 2;
  o.heads = 2;
  torch::manual_seed(3);
  zero_examples::GPT model{nullptr};
  std::shared_ptr<zero::comm::ProcessGroup> joined;
  {
    zero::Init init(config);
    model = zero_examples::GPT(o);
    joined = init.group();
    EXPECT_GT(init.partitioned_params(), 0);
  }
  zero::Engine engine = zero::initialize(config, model);
  EXPECT_EQ(&engine.group(), joined.get());
  zero::Init again(config);
  EXPECT_EQ(again.group().get(), joined.get());
  at::Tensor tokens = torch::arange(2 * 9, torch::kLong).reshape({2, 9}) % o.vocab_size;
  at::Tensor loss = model->loss(tokens.slice(1, 0, 8), tokens.slice(1, 1, 9));
  engine.backward(loss);
  engine.step();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}

}  // namespace
