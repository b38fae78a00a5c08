// zero::DataLoader's sharding, counted: every sample once per epoch across
// the ranks, the same global batches at any world size, the last batch
// filled up or dropped, and a position that carries over to another world
// size. The loaders of all ranks are built in one process (the rank is just
// a number to the loader).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "data/data_loader.h"
#include "zero/error.h"

namespace {

using zero::DataLoader;

std::shared_ptr<zero::Dataset> numbers(int64_t n) {
  return std::make_shared<zero::TensorDataset>(std::vector<at::Tensor>{torch::arange(n, torch::kLong),
                                                                        torch::arange(n, torch::kLong) * 10});
}

DataLoader loader_for(int64_t n, int rank, int ranks, int64_t per_rank, bool drop_last, bool shuffle = true) {
  auto s = std::make_shared<DataLoader::State>();
  s->dataset = numbers(n);
  s->options.batch_size = per_rank;
  s->options.drop_last = drop_last;
  s->options.shuffle = shuffle;
  s->seed = 7;
  s->per_rank = per_rank;
  s->dp_rank = rank;
  s->dp_size = ranks;
  return DataLoader(s);
}

// The global batches of one epoch: every rank's rows of batch k, in rank order.
std::vector<std::vector<int64_t>> epoch_batches(std::vector<DataLoader>& ranks) {
  std::vector<std::vector<int64_t>> out;
  std::vector<DataLoader::iterator> its;
  for (auto& l : ranks) its.push_back(l.begin());
  while (its[0] != ranks[0].end()) {
    std::vector<int64_t> global;
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_NE(its[r], ranks[r].end());
      const auto& batch = *its[r];
      EXPECT_TRUE(torch::equal(batch[1], batch[0] * 10));  // the columns stay together
      for (int64_t i = 0; i < batch[0].size(0); ++i) global.push_back(batch[0][i].item<int64_t>());
      ++its[r];
    }
    out.push_back(global);
  }
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(its[r], ranks[r].end());
  return out;
}

std::vector<DataLoader> world(int64_t n, int ranks, int64_t per_rank, bool drop_last) {
  std::vector<DataLoader> out;
  for (int r = 0; r < ranks; ++r) out.push_back(loader_for(n, r, ranks, per_rank, drop_last));
  return out;
}

TEST(DataLoader, EverySampleOncePerEpochAcrossRanks) {
  for (int ranks : {1, 2, 3, 4}) {
    for (int64_t n : {24, 25, 37}) {
      auto loaders = world(n, ranks, 3, /*drop_last=*/false);
      const int64_t global = 3 * ranks;
      const auto batches = epoch_batches(loaders);
      ASSERT_EQ(static_cast<int64_t>(batches.size()), (n + global - 1) / global);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), loaders[0].batches_per_epoch());
      std::map<int64_t, int> seen;
      for (size_t b = 0; b < batches.size(); ++b) {
        // A batch's real rows come first; the rest fill up the last batch.
        const int64_t real = std::min<int64_t>(global, n - static_cast<int64_t>(b) * global);
        for (int64_t i = 0; i < real; ++i) ++seen[batches[b][static_cast<size_t>(i)]];
      }
      ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << ranks << " ranks, " << n << " samples";
      for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << "sample " << index;
    }
  }
}

TEST(DataLoader, DropLastDropsOnlyTheIncompleteBatch) {
  for (int ranks : {1, 2, 4}) {
    auto loaders = world(37, ranks, 3, /*drop_last=*/true);
    const int64_t global = 3 * ranks;
    const auto batches = epoch_batches(loaders);
    ASSERT_EQ(static_cast<int64_t>(batches.size()), 37 / global);
    std::map<int64_t, int> seen;
    for (const auto& b : batches) {
      for (int64_t i : b) ++seen[i];
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 37 / global * global);
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1);
  }
}

TEST(DataLoader, TheSameGlobalBatchesAtAnyWorldSize) {
  auto one = world(50, 1, 12, false);
  auto two = world(50, 2, 6, false);
  auto four = world(50, 4, 3, false);
  const auto reference = epoch_batches(one);
  EXPECT_EQ(epoch_batches(two), reference);
  EXPECT_EQ(epoch_batches(four), reference);
}

TEST(DataLoader, EachEpochHasItsOwnOrderFromTheSeed) {
  auto a = world(40, 2, 4, false);
  const auto epoch0 = epoch_batches(a);
  EXPECT_EQ(a[0].epoch(), 1);  // the end of an epoch moves on to the next
  const auto epoch1 = epoch_batches(a);
  EXPECT_NE(epoch0, epoch1);
  auto b = world(40, 2, 4, false);
  for (auto& l : b) l.set_epoch(1);
  EXPECT_EQ(epoch_batches(b), epoch1);
  for (auto& l : b) l.set_epoch(0);
  EXPECT_EQ(epoch_batches(b), epoch0);
  auto ordered = loader_for(10, 0, 1, 10, false, /*shuffle=*/false);
  EXPECT_TRUE(torch::equal((*ordered.begin())[0], torch::arange(10, torch::kLong)));
}

TEST(DataLoader, APositionCarriesOverToAnotherWorldSize) {
  // 2 ranks x 6 rows, stopped after 3 batches of epoch 1; 4 ranks x 3 rows
  // (the same global batch) take over and see the rest of the epoch in order.
  auto full = world(100, 2, 6, false);
  for (auto& l : full) l.set_epoch(1);
  const auto reference = epoch_batches(full);

  auto first = world(100, 2, 6, false);
  for (auto& l : first) l.set_epoch(1);
  std::vector<DataLoader::iterator> its;
  for (auto& l : first) its.push_back(l.begin());
  for (int b = 1; b < 3; ++b) {
    for (auto& it : its) ++it;
  }
  // Inside the third batch's body: the position is past it.
  EXPECT_EQ(first[0].position().epoch, 1);
  EXPECT_EQ(first[0].position().samples, 36);

  auto second = world(100, 4, 3, false);
  for (auto& l : second) {
    l.set_position(first[0].position());
    l.set_epoch(1);  // a resumed loop calls it again: the position stays
  }
  EXPECT_EQ(second[0].remaining_batches(), static_cast<int64_t>(reference.size()) - 3);
  const auto rest = epoch_batches(second);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(reference.begin() + 3, reference.end()));
}

// ---- TokenDataset: the ids read back against the bytes written --------------

// Writes `ids` as little-endian integers of `width` bytes; returns the path.
std::string token_file(const std::string& name, const std::vector<uint32_t>& ids, int width) {
  const std::string path = (std::filesystem::temp_directory_path() / ("zero_test_data_" + name)).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (uint32_t id : ids)
    for (int b = 0; b < width; ++b) out.put(static_cast<char>((id >> (8 * b)) & 0xff));
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zero::EngineError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenDataset, SequencesAreTheFileCutInOrderAndTheRemainderDropped) {
  for (int width : {2, 4}) {
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 23; ++i) ids.push_back(width == 2 ? 65535 - 7 * i : 70000 + 1000 * i);  // beyond one byte
    const std::string path = token_file("cut" + std::to_string(width), ids, width);
    zero::TokenDataset data(path, 5, width);
    EXPECT_EQ(data.tokens(), 23);
    EXPECT_EQ(data.size(), 4);  // 3 tokens left over
    const at::Tensor batch = data.get_batch({3, 0})[0];
    ASSERT_EQ(batch.sizes(), (std::vector<int64_t>{2, 5}));
    EXPECT_EQ(batch.scalar_type(), torch::kLong);
    for (int64_t j = 0; j < 5; ++j) {
      EXPECT_EQ(batch[0][j].item<int64_t>(), ids[15 + j]);
      EXPECT_EQ(batch[1][j].item<int64_t>(), ids[j]);
    }
    EXPECT_TRUE(torch::equal(data.get(2)[0], torch::tensor(std::vector<int64_t>(ids.begin() + 10, ids.begin() + 15), torch::kLong)));
    EXPECT_NE(error_of([&] { data.get_batch({4}); }).find("sequence 4 is out of range (4 sequences of 5)"), std::string::npos);
    std::remove(path.c_str());
  }
}

TEST(TokenDataset, BadFilesAndIdsAreNamed) {
  const std::string odd = token_file("odd", {1, 2, 3}, 1);  // 3 bytes
  EXPECT_NE(error_of([&] { zero::TokenDataset(odd, 1, 2); }).find("has 3 bytes, not a multiple of 2"), std::string::npos);
  EXPECT_NE(error_of([&] { zero::TokenDataset(odd + ".missing", 1, 2); }).find("cannot read the token file"), std::string::npos);
  // A FIFO would block the open until a writer came: refused at once.
  const std::string fifo = odd + ".fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { zero::TokenDataset(fifo, 1, 2); }).find(fifo + " is a FIFO, not a regular file"), std::string::npos);
  ::unlink(fifo.c_str());
  EXPECT_NE(error_of([&] { zero::TokenDataset(odd, 1, 3); }).find("bytes_per_token must be 2 (uint16) or 4 (uint32)"),
            std::string::npos);
  const std::string big = token_file("big", {1, 2, 3, 96, 4, 4000}, 2);
  zero::TokenDataset data(big, 2, 2);
  EXPECT_NO_THROW(data.check_ids(4001));
  EXPECT_NE(error_of([&] { data.check_ids(96); }).find("holds id 96 at byte offset 6, not below the model's vocab_size 96"),
            std::string::npos);
  zero::TokenDataset first_two(big, 4, 2);  // the last 2 ids are not in a whole sequence: not checked
  EXPECT_NO_THROW(first_two.check_ids(97));
  std::remove(odd.c_str());
  std::remove(big.c_str());
}

// The width mistaken: uint32 ids read as uint16 are refused at once, naming
// both; uint16 ids read as uint32 make ids of 65536 and above, and the id
// check names the other width.
TEST(TokenDataset, AFileOfTheOtherWidthIsNamed) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(1 + (i * 7919) % 50000);  // GPT-2's vocabulary
  const std::string wide = token_file("wide", ids, 4);
  EXPECT_NO_THROW(zero::TokenDataset(wide, 8, 4).check_ids(50257));
  const std::string message = error_of([&] { zero::TokenDataset(wide, 8, 2); });
  EXPECT_NE(message.find("looks like uint32 ids read as uint16"), std::string::npos) << message;
  EXPECT_NE(message.find("--tokens-dtype uint32"), std::string::npos) << message;
  const std::string narrow = token_file("narrow", ids, 2);
  EXPECT_NO_THROW(zero::TokenDataset(narrow, 8, 2).check_ids(50257));
  zero::TokenDataset misread(narrow, 8, 4);
  const std::string ids_message = error_of([&] { misread.check_ids(50257); });
  EXPECT_NE(ids_message.find("read it with 2 bytes per token"), std::string::npos) << ids_message;
  // Short files and files with ids in both halves are read as asked.
  const std::string short_wide = token_file("short_wide", std::vector<uint32_t>(ids.begin(), ids.begin() + 20), 4);
  EXPECT_NO_THROW(zero::TokenDataset(short_wide, 8, 2));
  std::remove(wide.c_str());
  std::remove(narrow.c_str());
  std::remove(short_wide.c_str());
}

// A token file cut shorter while it is read (another job rewriting it)
// would kill the rank with SIGBUS at the first page past the new end: the
// next read names the file and both sizes instead, and reads nothing.
TEST(TokenDataset, AFileCutWhileReadIsNamedNotABusError) {
  std::vector<uint32_t> ids(100);
  for (uint32_t i = 0; i < 100; ++i) ids[i] = 1 + i;
  const std::string path = token_file("cut_while_read", ids, 2);
  zero::TokenDataset data(path, 5, 2);
  EXPECT_EQ(data.get_batch({19})[0][0][4].item<int64_t>(), 100);
  std::filesystem::resize_file(path, 20);
  const std::string message = error_of([&] { data.get_batch({19}); });
  EXPECT_NE(message.find("the token file " + path + " was cut from 200 to 20 bytes while it was being read"),
            std::string::npos) << message;
  EXPECT_NE(error_of([&] { data.check_ids(1000); }).find("was cut from 200 to 20 bytes"), std::string::npos);
  std::remove(path.c_str());
}

TEST(TokenDataset, ALoaderOverItHandsOutItsSequences) {
  std::vector<uint32_t> ids(40);
  for (uint32_t i = 0; i < 40; ++i) ids[i] = i;
  const std::string path = token_file("loader", ids, 2);
  auto s = std::make_shared<DataLoader::State>();
  s->dataset = std::make_shared<zero::TokenDataset>(path, 4, 2);  // 10 sequences
  s->options.shuffle = false;
  s->per_rank = 2;
  s->dp_rank = 1;
  s->dp_size = 2;
  DataLoader loader(s);
  std::vector<int64_t> firsts;
  for (const auto& batch : loader) {
    ASSERT_EQ(batch[0].sizes(), (std::vector<int64_t>{2, 4}));
    firsts.push_back(batch[0][0][0].item<int64_t>());
  }
  // Global batches of 4 sequences, rank 1 taking the 3rd and 4th; the last filled up from the start.
  EXPECT_EQ(firsts, (std::vector<int64_t>{8, 24, 0}));
  std::remove(path.c_str());
}

}  // namespace
