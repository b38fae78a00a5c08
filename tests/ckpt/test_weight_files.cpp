// ckpt::WeightFiles, torch-free: Hugging Face's weight layouts (one file,
// an index and its shards, a folder holding either) read by element range
// with dtype conversion, and the ways an index and its shards can disagree,
// each refused naming the file and the tensor.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_test_support.h"

using namespace ckpt_test;

namespace {

class WeightFilesTest : public CkptTest {
 protected:
  // Two F32 tensors "a" [2,3] = 0..5 and "b" [4] = 10..13, and a BF16 "c" [2] = {1.5, -2}.
  void write_shards(const std::string& index_text) {
    write_safetensors(dir_ + "/model-00001-of-00002.safetensors",
                      {{"a", DType::F32, {2, 3}, a_.data(), a_.size() * 4}, {"b", DType::F32, {4}, b_.data(), 16}});
    write_safetensors(dir_ + "/model-00002-of-00002.safetensors", {{"c", DType::BF16, {2}, c_.data(), 4}});
    spit(dir_ + "/model.safetensors.index.json", index_text);
  }
  const std::string good_index_ =
      R"({"metadata": {"total_size": 44}, "weight_map": {"a": "model-00001-of-00002.safetensors",
          "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})";
  std::vector<float> a_{0, 1, 2, 3, 4, 5}, b_{10, 11, 12, 13};
  std::vector<uint16_t> c_{0x3fc0, 0xc000};  // bf16 1.5 and -2
};

TEST_F(WeightFilesTest, AnIndexAndItsShardsReadByElementRange) {
  write_shards(good_index_);
  for (const std::string& path : {dir_, dir_ + "/model.safetensors.index.json"}) {
    WeightFiles files(path);
    ASSERT_EQ(files.tensors().size(), 3u);
    EXPECT_EQ(files.tensors().at("a").shape, (std::vector<int64_t>{2, 3}));
    float out[3] = {};
    files.read_f32("a", 2, 3, out);  // elements 2..4
    EXPECT_EQ(out[0], 2);
    EXPECT_EQ(out[2], 4);
    files.read_f32("c", 0, 2, out);  // BF16 converted
    EXPECT_EQ(out[0], 1.5f);
    EXPECT_EQ(out[1], -2.0f);
  }
}

TEST_F(WeightFilesTest, OneFileOrAFolderHoldingIt) {
  write_safetensors(dir_ + "/model.safetensors", {{"b", DType::F32, {4}, b_.data(), 16}});
  float out[4] = {};
  WeightFiles(dir_).read_f32("b", 0, 4, out);
  EXPECT_EQ(out[3], 13);
  WeightFiles(dir_ + "/model.safetensors").read_f32("b", 1, 1, out);
  EXPECT_EQ(out[0], 11);
}

TEST_F(WeightFilesTest, DisagreementsAreNamed) {
  // A shard outside the index's folder.
  write_shards(R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "not a file in the index's folder");
  // The index places a tensor in a shard without it.
  write_shards(R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                   "c": "model-00001-of-00002.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "places \"c\" in model-00001-of-00002.safetensors");
  // A shard holds a tensor the index does not list.
  write_shards(R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "holds \"b\", which");
  // No weight_map, and a folder without weights.
  write_shards(R"({"metadata": {}})");
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "no \"weight_map\"");
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "holds neither");
}

TEST_F(WeightFilesTest, ATensorInTwoShardsIsRefused) {
  write_safetensors(dir_ + "/one.safetensors", {{"a", DType::F32, {2, 3}, a_.data(), 24}});
  write_safetensors(dir_ + "/two.safetensors",
                    {{"a", DType::F32, {2, 3}, a_.data(), 24}, {"b", DType::F32, {4}, b_.data(), 16}});
  spit(dir_ + "/model.safetensors.index.json", R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})");
  EXPECT_CONTAINS(error_of([&] { WeightFiles files(dir_); }), "a tensor lies in one shard");
}

}  // namespace
