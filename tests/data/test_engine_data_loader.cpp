// Engine::data_loader (DeepSpeed's deepspeed_io) on every rank of the job:
// the micro batch from the ds_config, rank d's rows of each global batch,
// every sample once per epoch across the ranks (all-gathered and counted),
// and the same global batches as the Accelerator's loader at the same size.
#include <gtest/gtest.h>
#include <filesystem>
#include <optional>
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

// Note [Data that resumes]: save_checkpoint inside the training loop keeps
// the loader's position, and a new engine that loads the checkpoint goes on
// with the uninterrupted run's next batch, with no client_state: whether
// the loader is made before the load or after it. The reference is the
// uninterrupted run's batches.
TEST(EngineDataLoader, ACheckpointResumesTheSamples) {
  const std::string dir = ::testing::TempDir() + "/zero_loader_resume_" + std::to_string(g_world->size());
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
  g_world->barrier();
  zero::DataLoaderOptions options;
  options.seed = 3;
  auto data = numbers(40);
  std::vector<at::Tensor> uninterrupted;
  {
    auto engine = make_engine(2);
    auto loader = engine.data_loader(data, options);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (const auto& batch : loader) {
        uninterrupted.push_back(batch[0]);
        // Mid-epoch, inside the body, as a user saves.
        if (uninterrupted.size() == 3) engine.save_checkpoint(dir, "mid");
      }
    }
  }
  const size_t per_epoch = uninterrupted.size() / 2;
  for (const bool made_before_load : {true, false}) {
    SCOPED_TRACE(made_before_load ? "loader made before the load" : "loader made after the load");
    auto engine = make_engine(2);
    std::optional<zero::DataLoader> loader;
    if (made_before_load) loader = engine.data_loader(data, options);
    EXPECT_EQ(engine.load_checkpoint(dir, "mid"), "{}");
    if (!made_before_load) loader = engine.data_loader(data, options);
    std::vector<at::Tensor> resumed;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (const auto& batch : *loader) resumed.push_back(batch[0]);
    ASSERT_EQ(resumed.size(), uninterrupted.size() - 3);
    for (size_t i = 0; i < resumed.size(); ++i)
      EXPECT_TRUE(torch::equal(resumed[i], uninterrupted[i + 3])) << "batch " << i + 3 << " of " << 2 * per_epoch;
  }
  // Another dataset, seed or shuffle: its position would name other samples.
  {
    auto engine = make_engine(2);
    auto other = engine.data_loader(numbers(41), options);
    try {
      engine.load_checkpoint(dir, "mid");
      ADD_FAILURE() << "a loader over 41 samples took the position of one over 40";
    } catch (const zero::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("data loader 0 (in the order engine.data_loader made them) was saved in"),
                std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("over 40 samples (shuffled, seed 3) and this one reads 41 samples"),
                std::string::npos) << e.what();
    }
  }
  // In order, a longer dataset (a run planned for more steps) keeps the position.
  {
    zero::DataLoaderOptions in_order;
    in_order.shuffle = false;
    std::vector<at::Tensor> first;
    {
      auto engine = make_engine(2);
      auto loader = engine.data_loader(numbers(40), in_order);
      for (const auto& batch : loader) {
        first.push_back(batch[0]);
        if (first.size() == 2) {
          engine.save_checkpoint(dir, "in_order");
          break;
        }
      }
    }
    auto engine = make_engine(2);
    EXPECT_EQ(engine.load_checkpoint(dir, "in_order"), "{}");
    auto longer = engine.data_loader(numbers(60), in_order);
    const int64_t global = 2 * g_world->size();
    const int64_t next = 2 * global + g_world->rank() * 2;
    EXPECT_TRUE(torch::equal((*longer.begin())[0], torch::arange(next, next + 2, torch::kLong)));
  }
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
