// The batch triad against DeepSpeed's rule train_batch_size =
// train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size,
// with the expectations computed here from that formula.
#include "config_test_util.h"

namespace {

using zero::Config;
using zero_test::config_error;
using zero_test::parse;

struct Triad {
  int64_t tbs, micro, gas;
};

// A config with the given keys; a negative value leaves the key out, 0 writes "auto".
std::string batch_json(int64_t tbs, int64_t micro, int64_t gas) {
  std::string out = "{";
  auto add = [&](const char* key, int64_t v) {
    if (v < 0) return;
    if (out.size() > 1) out += ", ";
    out += std::string("\"") + key + "\": " + (v == 0 ? std::string("\"auto\"") : std::to_string(v));
  };
  add("train_batch_size", tbs);
  add("train_micro_batch_size_per_gpu", micro);
  add("gradient_accumulation_steps", gas);
  return out + "}";
}

Triad resolved(const std::string& json, int ws) {
  Config c = parse(json);
  c.resolve(ws);
  EXPECT_TRUE(c.resolved());
  EXPECT_EQ(c.world_size(), ws);
  return {*c.batch.train_batch_size, *c.batch.train_micro_batch_size_per_gpu, *c.batch.gradient_accumulation_steps};
}

void expect_triad(const Triad& got, int64_t tbs, int64_t micro, int64_t gas) {
  EXPECT_EQ(got.tbs, tbs);
  EXPECT_EQ(got.micro, micro);
  EXPECT_EQ(got.gas, gas);
}

class BatchTriad : public ::testing::TestWithParam<int> {};

// Any two determine the third; "auto" reads as missing.
TEST_P(BatchTriad, TwoGivenDetermineTheThird) {
  const int ws = GetParam();
  for (int64_t micro : {1, 2, 3, 8}) {
    for (int64_t gas : {1, 2, 5}) {
      const int64_t tbs = micro * gas * ws;
      SCOPED_TRACE("micro " + std::to_string(micro) + " gas " + std::to_string(gas));
      expect_triad(resolved(batch_json(-1, micro, gas), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(0, micro, gas), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(tbs, micro, -1), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(tbs, micro, 0), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(tbs, -1, gas), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(tbs, 0, gas), ws), tbs, micro, gas);
      expect_triad(resolved(batch_json(tbs, micro, gas), ws), tbs, micro, gas);
    }
  }
}

// One given: DeepSpeed assumes no gradient accumulation.
TEST_P(BatchTriad, OneGivenMeansNoAccumulation) {
  const int ws = GetParam();
  for (int64_t micro : {1, 4, 7}) {
    expect_triad(resolved(batch_json(-1, micro, -1), ws), micro * ws, micro, 1);
    expect_triad(resolved(batch_json(0, micro, 0), ws), micro * ws, micro, 1);
    expect_triad(resolved(batch_json(micro * ws, -1, -1), ws), micro * ws, micro, 1);
    expect_triad(resolved(batch_json(micro * ws, 0, 0), ws), micro * ws, micro, 1);
  }
}

TEST_P(BatchTriad, InconsistentTriadPrintsAllNumbers) {
  const int ws = GetParam();
  const int64_t micro = 4, gas = 3, tbs = micro * gas * ws + 1;
  std::string message = config_error([&] { resolved(batch_json(tbs, micro, gas), ws); });
  const std::vector<std::string> parts = {"train_batch_size " + std::to_string(tbs), "train_micro_batch_size_per_gpu 4",
                                          "gradient_accumulation_steps 3", "world_size " + std::to_string(ws),
                                          "= " + std::to_string(micro * gas * ws)};
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
}

TEST_P(BatchTriad, RemainderIsAnError) {
  const int ws = GetParam();
  const int64_t micro = 4, tbs = micro * 3 * ws + 2;   // not a multiple of micro * ws
  std::string message = config_error([&] { resolved(batch_json(tbs, micro, -1), ws); });
  EXPECT_NE(message.find("train_batch_size " + std::to_string(tbs) + " is not divisible"), std::string::npos) << message;
  EXPECT_NE(message.find("= " + std::to_string(micro * ws)), std::string::npos) << message;
  message = config_error([&] { resolved(batch_json(tbs, -1, 3), ws); });
  EXPECT_NE(message.find("not divisible"), std::string::npos) << message;
  if (ws > 1) {
    message = config_error([&] { resolved(batch_json(ws + 1, -1, -1), ws); });
    EXPECT_NE(message.find("world_size " + std::to_string(ws)), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BatchTriad, ::testing::Values(1, 2, 3, 4, 8));

TEST(Batch, AccumulationStepsAloneOrNothingIsAnError) {
  EXPECT_NE(config_error([] { resolved(batch_json(-1, -1, 4), 1); }).find("gradient_accumulation_steps alone"),
            std::string::npos);
  for (const std::string& json : {std::string("{}"), batch_json(0, 0, 0)}) {
    std::string message = config_error([&] { resolved(json, 2); });
    EXPECT_NE(message.find("train_micro_batch_size_per_gpu"), std::string::npos) << message;
    EXPECT_NE(message.find("train_batch_size"), std::string::npos) << message;
  }
}

TEST(Batch, ValuesMustBePositiveIntegers) {
  EXPECT_NE(config_error([] { parse(R"({"train_batch_size": 0})"); }).find("train_batch_size must be an integer >= 1"),
            std::string::npos);
  EXPECT_NE(config_error([] { parse(R"({"train_micro_batch_size_per_gpu": 2.5})"); }).find("found 2.5"),
            std::string::npos);
  EXPECT_NE(config_error([] { parse(R"({"train_micro_batch_size_per_gpu": "8"})"); }).find("without quotes"),
            std::string::npos);
  expect_triad(resolved(R"({"train_micro_batch_size_per_gpu": 8.0})", 1), 8, 8, 1);   // integral double
}

TEST(Batch, WorldSizeMustBePositive) {
  Config c = parse(batch_json(-1, 8, 1));
  EXPECT_NE(config_error([&] { c.resolve(0); }).find("world size"), std::string::npos);
  EXPECT_NE(config_error([&] { c.resolve(-3); }).find("-3"), std::string::npos);
  EXPECT_FALSE(c.resolved());
}

TEST(Batch, OverflowIsAnError) {
  std::string message = config_error([] { resolved(batch_json(-1, int64_t{1} << 30, int64_t{1} << 30), 1 << 20); });
  EXPECT_NE(message.find("overflow"), std::string::npos) << message;
}

// 2^32 samples a step (or 2^31 accumulation steps) is a typo, not a run.
TEST(Batch, ValuesBeyondTwoToThe31AreRefused) {
  std::string message = config_error([] { resolved(batch_json(int64_t{1} << 32, -1, int64_t{1} << 31), 2); });
  EXPECT_NE(message.find("train_batch_size is 4294967296, above 2147483647; is it a typo?"), std::string::npos) << message;
  message = config_error([] { resolved(batch_json(-1, 8, int64_t{1} << 31), 2); });
  EXPECT_NE(message.find("gradient_accumulation_steps is 2147483648, above 2147483647"), std::string::npos) << message;
  expect_triad(resolved(batch_json(-1, 8, (int64_t{1} << 31) - 1), 1), int64_t{8} * ((int64_t{1} << 31) - 1), 8,
               (int64_t{1} << 31) - 1);
}

// A resolved config keeps its three values: resolving again checks them.
TEST(Batch, ResolvingAgainChecksTheValues) {
  Config c = parse(batch_json(-1, 8, 2));
  c.resolve(2);
  EXPECT_EQ(*c.batch.train_batch_size, 32);
  EXPECT_NO_THROW(c.resolve(2));
  EXPECT_NE(config_error([&] { c.resolve(4); }).find("world_size 4"), std::string::npos);
}

// A program may fill in what the file left "auto", as Hugging Face's Trainer does.
TEST(Batch, ProgramFillsAutoBeforeResolve) {
  Config c = parse(batch_json(0, 0, 0));
  EXPECT_FALSE(c.batch.train_micro_batch_size_per_gpu.has_value());
  c.batch.train_micro_batch_size_per_gpu = 6;
  c.batch.gradient_accumulation_steps = 2;
  c.resolve(4);
  expect_triad({*c.batch.train_batch_size, *c.batch.train_micro_batch_size_per_gpu, *c.batch.gradient_accumulation_steps},
               6 * 2 * 4, 6, 2);
  EXPECT_TRUE(c.warnings().empty());   // batch "auto" is resolved, not defaulted: no warning
}

TEST(Batch, ToJsonShowsUnresolvedValuesAsNull) {
  Config c = parse(batch_json(-1, 8, -1));
  auto j = zero_test::as_json(c);
  EXPECT_TRUE(j["train_batch_size"].is_null());
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  c.resolve(2);
  j = zero_test::as_json(c);
  EXPECT_EQ(j["train_batch_size"], 16);
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
}

}  // namespace

namespace {

// With tensor parallelism the triad counts data-parallel ranks only:
// train_batch_size = micro * gas * world / tp (Megatron and DeepSpeed).
TEST(BatchTriad, TensorParallelRanksShareOneBatch) {
  for (int tp : {1, 2, 4}) {
    Config c = parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
                         "tensor_parallel": {"autotp_size": )" + std::to_string(tp) + "}}");
    c.resolve(8);
    EXPECT_EQ(c.world_size(), 8);
    EXPECT_EQ(c.data_parallel_size(), 8 / tp);
    EXPECT_EQ(*c.batch.train_batch_size, 3 * 2 * (8 / tp));
  }
  Config spelled = parse(R"({"train_batch_size": 12, "tensor_parallel": {"tp": {"tp_size": 2}}})");
  spelled.resolve(4);
  EXPECT_EQ(*spelled.batch.train_micro_batch_size_per_gpu * *spelled.batch.gradient_accumulation_steps, 6);
  const std::string e = config_error([] { parse(R"({"train_batch_size": 12, "tensor_parallel": {"autotp_size": 4}})").resolve(6); });
  EXPECT_NE(e.find("a world of 6 rank(s) does not divide into tensor parallel 4 x pipeline 1"), std::string::npos) << e;
  EXPECT_NE(e.find("2x3"), std::string::npos) << e;
}

}  // namespace
