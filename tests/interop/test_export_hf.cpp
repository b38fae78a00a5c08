// zero-ckpt export --to hf (interop/export_hf.cpp): Hugging Face's layout
// of a checkpoint (a DeepSpeed fixture imported with zero's GPT names),
// read back by zero's own reader of it (ckpt::WeightFiles, which reads
// transformers' files), against the checkpoint's master weights and the
// IEEE rounding rules. (transformers reading the files is
// tests/interop/hf_export_loads_in_transformers.sh.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "interop/export_hf.h"
#include "interop/import_deepspeed.h"
#include "zero/error.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zero::ckpt;

const fs::path kFixtures = ZERO_FIXTURES "/deepspeed";

class Scratch {
 public:
  Scratch() {
    path_ = fs::temp_directory_path() / ("zero_hf_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

fs::path imported(const fs::path& dir) {
  zero::interop::ImportOptions o;
  o.from = kFixtures / "stage3_fp32_2ranks" / "ckpt";
  o.out = dir / "zero";
  for (const auto& [from, to] : zero::interop::read_name_map(kFixtures / "name_map.json")) o.rename[from] = to;
  zero::interop::import_deepspeed(o);
  return o.out;
}

uint16_t half_of(float f) {
  uint16_t h;
  ck::convert_from_f32(ck::DType::F16, &f, 1, &h);
  return h;
}

TEST(ExportHf, ShardsAnIndexAndTheMastersInTheRequestedDtype) {
  Scratch scratch;
  const fs::path zero = imported(scratch.path());
  const ck::Manifest m = ck::read_manifest(zero, "global_step3");
  ck::FragmentReader masters(zero, m);
  const auto map = zero::interop::read_name_map(kFixtures / "name_map.json");
  std::map<std::string, std::string> hf_name_of;
  for (const auto& [hf, z] : map) hf_name_of[z] = hf;

  for (const std::string dtype : {"bfloat16", "float32", "float16"}) {
    SCOPED_TRACE(dtype);
    const fs::path out = scratch.path() / dtype;
    zero::interop::HfExportOptions o;
    o.from = zero;
    o.out = out;
    o.dtype = dtype;
    o.max_shard_bytes = zero::interop::parse_size("2KB");
    o.rename = map;
    const auto summary = zero::interop::export_hf(o);
    ASSERT_GT(summary.shards, 1);
    // The index names every tensor's shard, and its total is the data's.
    std::ifstream in(out / "model.safetensors.index.json");
    const auto index = nlohmann::json::parse(in);
    EXPECT_EQ(index["weight_map"].size(), m.params.size());
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), summary.bytes);
    EXPECT_TRUE(fs::exists(out / ("model-00001-of-0000" + std::to_string(summary.shards) + ".safetensors")));
    for (const auto& e : fs::directory_iterator(out)) {  // no shard past the limit, unless one tensor is
      if (e.path().extension() != ".safetensors") continue;
      ck::SafetensorsFile shard(e.path());
      EXPECT_EQ(shard.metadata().at("format"), "pt");
      uint64_t bytes = 0;
      for (const auto& [name, entry] : shard.entries()) bytes += entry.end - entry.begin;
      EXPECT_TRUE(bytes <= 2000 || shard.entries().size() == 1) << e.path() << " holds " << bytes << " bytes";
    }
    // Every tensor: Hugging Face's name, the master weights rounded.
    ck::WeightFiles files(out.string());
    ASSERT_EQ(files.tensors().size(), m.params.size());
    for (const auto& p : m.params) {
      const std::string name = hf_name_of.at(p.name);
      const auto& t = files.tensors().at(name);
      EXPECT_EQ(t.shape, p.shape);
      const int64_t n = static_cast<int64_t>(std::accumulate(p.shape.begin(), p.shape.end(), int64_t{1}, std::multiplies<>()));
      std::vector<float> master(n);
      masters.read_f32("fp32", p.name, 0, n, master.data());
      std::vector<uint8_t> stored(n * ck::dtype_size(t.dtype));
      files.read(name, 0, stored.size(), stored.data());
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &master[i], 4);
        if (dtype == "float32") {
          ASSERT_EQ(std::memcmp(stored.data() + 4 * i, &master[i], 4), 0) << name;
        } else if (dtype == "bfloat16") {
          const uint16_t want = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
          ASSERT_EQ(stored[2 * i] | (stored[2 * i + 1] << 8), want) << name << " " << i;
        } else {
          // The half read back is the float nearest the master (ties are not met in these weights).
          float back;
          ck::convert_to_f32(ck::DType::F16, stored.data() + 2 * i, 1, &back);
          uint16_t h = static_cast<uint16_t>(stored[2 * i] | (stored[2 * i + 1] << 8));
          // Its neighbours, one step up and down in magnitude (either side of a zero).
          const bool zero = (h & 0x7fff) == 0;
          uint16_t above = zero ? 0x0001 : h + 1, below = zero ? 0x8001 : h - 1;
          float a, b;
          ck::convert_to_f32(ck::DType::F16, &above, 1, &a);
          ck::convert_to_f32(ck::DType::F16, &below, 1, &b);
          ASSERT_LE(std::fabs(back - master[i]), std::fabs(a - master[i])) << name << " " << i;
          ASSERT_LE(std::fabs(back - master[i]), std::fabs(b - master[i])) << name << " " << i;
        }
      }
    }
  }
}

TEST(ExportHf, OneFileWhenItFitsAndTheConfigBeside) {
  Scratch scratch;
  const fs::path zero = imported(scratch.path());
  std::ofstream(scratch.path() / "config.json") << R"({"model_type": "gpt", "torch_dtype": "bfloat16"})";
  zero::interop::HfExportOptions o;
  o.from = zero;
  o.out = scratch.path() / "hf";
  o.config = (scratch.path() / "config.json").string();
  const auto summary = zero::interop::export_hf(o);
  EXPECT_EQ(summary.shards, 1);
  EXPECT_EQ(summary.dtype, "BF16");  // config.json's torch_dtype
  EXPECT_TRUE(fs::exists(o.out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(o.out + "/model.safetensors.index.json"));
  std::ifstream in(o.out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(in)["model_type"], "gpt");
  ck::SafetensorsFile file(o.out + "/model.safetensors");
  for (const auto& [name, entry] : file.entries()) EXPECT_EQ(entry.dtype, ck::DType::BF16) << name;
}

// IEEE 754 binary16, rounded to nearest with ties to even.
TEST(ExportHf, Float16RoundsAsIeee) {
  EXPECT_EQ(half_of(1.0f), 0x3c00);
  EXPECT_EQ(half_of(-2.0f), 0xc000);
  EXPECT_EQ(half_of(65504.0f), 0x7bff);                 // the largest half
  EXPECT_EQ(half_of(65519.0f), 0x7bff);                 // below the midpoint to infinity
  EXPECT_EQ(half_of(65520.0f), 0x7c00);                 // the midpoint rounds to even: infinity
  EXPECT_EQ(half_of(std::ldexp(1.0f, -24)), 0x0001);    // the smallest subnormal
  EXPECT_EQ(half_of(std::ldexp(1.0f, -25)), 0x0000);    // half of it: ties to even, zero
  EXPECT_EQ(half_of(std::ldexp(3.0f, -25)), 0x0002);    // 1.5 subnormal steps: to even, 2
  EXPECT_EQ(half_of(std::ldexp(1.0f, -14)), 0x0400);    // the smallest normal
  EXPECT_EQ(half_of(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie between 1 and 1 + 2^-10: even
  EXPECT_EQ(half_of(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // a tie between odd and even steps: up
  EXPECT_EQ(half_of(INFINITY), 0x7c00);
  EXPECT_EQ(half_of(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(half_of(NAN) & 0x03ff, 0);
}

TEST(ExportHf, BadSizesAndNamesAreRefused) {
  for (const std::string bad : {"", "GB", "5XB", "-5GB", "0", "5.5GB", "17179869184GiB", "999999999999TB"}) {
    std::string message;
    try {
      zero::interop::parse_size(bad);
    } catch (const zero::CheckpointError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("is not a shard size"), std::string::npos) << bad;
  }
  EXPECT_EQ(zero::interop::parse_size("5GB"), 5000000000u);
  EXPECT_EQ(zero::interop::parse_size("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(zero::interop::parse_size("500mb"), 500000000u);
  Scratch scratch;
  zero::interop::HfExportOptions o;
  o.from = imported(scratch.path());
  o.out = scratch.path() / "hf";
  o.rename = {{"lm_head.weight", "no.such.weight"}};
  std::string message;
  try {
    zero::interop::export_hf(o);
  } catch (const zero::CheckpointError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("maps \"lm_head.weight\" to \"no.such.weight\", which"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(o.out));
}

}  // namespace
