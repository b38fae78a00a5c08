// Engine::data_loader (DeepSpeed's deepspeed_io) on every rank of the job:
// the micro batch from the ds_config, rank d's rows of each global batch,
// every sample once per epoch across the ranks (all-gathered and counted),
// and the same global batches as the Accelerator's loader at the same size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "world_main.h"
#include "zero/zero.h"

namespace {

zero::Engine make_engine(int64_t micro) {
  auto model = torch::nn::Linear(2, 2);
  const std::string json = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) +
                           R"(, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}})";
  zero::InitOptions init;
  init.group = g_world;
  return zero::initialize(zero::Config::from_json(json), model, init);
}

std::shared_ptr<zero::Dataset> numbers(int64_t n) {
  return std::make_shared<zero::TensorDataset>(std::vector<at::Tensor>{torch::arange(n, torch::kLong)});
}

TEST(EngineDataLoader, InOrderRankDTakesItsRowsOfEachGlobalBatch) {
  auto engine = make_engine(3);
  const int ranks = g_world->size(), rank = g_world->rank();
  zero::DataLoaderOptions options;
  options.shuffle = false;
  options.drop_last = true;
  auto loader = engine.data_loader(numbers(20), options);
  EXPECT_EQ(loader.batch_size_per_rank(), 3);
  EXPECT_EQ(loader.global_batch_size(), 3 * ranks);
  int64_t b = 0;
  for (const auto& batch : loader) {
    const int64_t first = b * 3 * ranks + rank * 3;
    EXPECT_TRUE(torch::equal(batch[0], torch::arange(first, first + 3, torch::kLong))) << "batch " << b;
    ++b;
  }
  EXPECT_EQ(b, 20 / (3 * ranks));
}

TEST(EngineDataLoader, ShuffledEverySampleOncePerEpochAcrossTheRanks) {
  auto engine = make_engine(2);
  const int ranks = g_world->size();
  zero::DataLoaderOptions options;
  options.seed = 5;
  auto loader = engine.data_loader(numbers(16), options);  // 16 divides 2 * 1 and 2 * 2
  std::vector<at::Tensor> mine;
  for (const auto& batch : loader) mine.push_back(batch[0]);
  at::Tensor local = torch::cat(mine);
  at::Tensor all = torch::empty({local.numel() * ranks}, torch::kLong);
  g_world->all_gather(all, local);
  EXPECT_TRUE(torch::equal(std::get<0>(all.sort()), torch::arange(16, torch::kLong)));
  EXPECT_FALSE(torch::equal(all, torch::arange(16, torch::kLong)));  // shuffled
  EXPECT_EQ(loader.epoch(), 1);  // one pass moves the position to the next epoch
}

TEST(EngineDataLoader, BatchSizeOverridesTheMicroBatchAndBadInputIsNamed) {
  auto engine = make_engine(2);
  zero::DataLoaderOptions options;
  options.batch_size = 5;
  EXPECT_EQ(engine.data_loader(numbers(40), options).batch_size_per_rank(), 5);
  options.batch_size = 0;
  try {
    engine.data_loader(numbers(4), options);
    ADD_FAILURE() << "batch_size 0 was accepted";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size must be >= 1, got 0"), std::string::npos) << e.what();
  }
}

}  // namespace
