// Partitioned construction (zero::Init, Note [Partitioned construction]) on
// 1-3 ranks: a model built under zero::Init trains bitwise as the same
// model built whole (same seed, each rank seeded differently so that rank
// 0's weights must win both ways), the random number generator ends where a
// whole construction leaves it, and while the model is built no rank holds
// much more than one unit beyond its parts (peak RSS, read from the kernel).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "gpt/gpt.h"
#include "peak_rss.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

using zero_examples::GPT;
using zero_examples::GPTOptions;

constexpr int64_t kVocab = 29, kContext = 16, kMicro = 2;

GPTOptions gpt_options() {
  GPTOptions o;
  o.vocab_size = kVocab;
  o.context = kContext;
  o.width = 32;
  o.depth = 4;
  o.heads = 2;
  o.dropout = 0.1;  // training draws from the generator: it must be in step
  return o;
}

std::string config_json(int stage, const std::string& extra = "") {
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << kMicro
    << R"(, "gradient_accumulation_steps": 1, "steps_per_print": 1000, "gradient_clipping": 1.0,
       "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
       "zero_optimization": {"stage": )"
    << stage << R"(, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 0)" << extra << "}}";
  return c.str();
}

// This rank's micro-batch of step `step`: tokens from arithmetic, not the
// generator (which the model's dropout uses).
std::pair<at::Tensor, at::Tensor> batch(int step) {
  const int64_t row = g_world->rank() * kMicro;
  at::Tensor base = torch::arange(kMicro * (kContext + 1), torch::kLong).reshape({kMicro, kContext + 1});
  at::Tensor tokens = (base * 7 + step * 5 + row * 3) % kVocab;
  return {tokens.slice(1, 0, kContext), tokens.slice(1, 1, kContext + 1)};
}

struct TrainingRun {
  at::Tensor drawn;  // from the generator right after construction
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> state;
  int64_t part_bytes = 0;
};

TrainingRun train(const std::string& json, bool partitioned, const std::string& remote_device = "") {
  const zero::Config config = zero::Config::from_json(json);
  torch::manual_seed(100 + g_world->rank());
  GPT model{nullptr};
  TrainingRun run;
  if (partitioned) {
    zero::PartitionedInitOptions options;
    options.group = g_world;
    options.remote_device = remote_device;
    zero::Init init(config, options);
    model = GPT(gpt_options());
    run.part_bytes = init.part_bytes();
    EXPECT_EQ(init.partitioned_params(), 12 * gpt_options().depth);  // every block parameter, nothing else
  } else {
    model = GPT(gpt_options());
  }
  run.drawn = torch::rand({4});
  zero::InitOptions init_options;
  init_options.group = g_world;
  zero::Engine engine = zero::initialize(config, model, init_options);
  for (int step = 0; step < 3; ++step) {
    auto [tokens, targets] = batch(step);
    at::Tensor loss = model->loss(tokens, targets);
    engine.backward(loss);
    engine.step();
    run.losses.push_back(loss.item<double>());
  }
  run.state = engine.gathered_state_dict();
  return run;
}

void expect_same(const TrainingRun& whole, const TrainingRun& parted) {
  EXPECT_TRUE(torch::equal(whole.drawn, parted.drawn)) << "the generator is not where a whole construction leaves it";
  ASSERT_EQ(whole.losses.size(), parted.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i) EXPECT_EQ(whole.losses[i], parted.losses[i]) << "step " << i;
  ASSERT_EQ(whole.state.size(), parted.state.size());
  for (size_t i = 0; i < whole.state.size(); ++i) {
    EXPECT_EQ(whole.state[i].first, parted.state[i].first);
    EXPECT_TRUE(torch::equal(whole.state[i].second, parted.state[i].second)) << whole.state[i].first;
  }
}

TEST(PartitionedConstruction, Stage3TrainsAsTheWholeModel) {
  const std::string json = config_json(3);
  TrainingRun whole = train(json, false);
  TrainingRun parted = train(json, true);
  expect_same(whole, parted);
  EXPECT_GT(parted.part_bytes, 0);
}

TEST(PartitionedConstruction, Stage3Bf16WithOffloadTrainsAsTheWholeModel) {
  const std::string json = config_json(3, R"(, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"})") ;
  std::string with_bf16 = json.substr(0, json.size() - 1) + R"(, "bf16": {"enabled": true}})";
  expect_same(train(with_bf16, false), train(with_bf16, true));
}

TEST(PartitionedConstruction, Stage2GathersThePartsAndTrainsAsTheWholeModel) {
  const std::string json = config_json(2);
  expect_same(train(json, false), train(json, true));
}

TEST(PartitionedConstruction, PartsOnNvmeTrainAsTheWholeModel) {
  // One path for every rank (the config must agree): the launcher's pid.
  const std::string folder = (std::filesystem::temp_directory_path() /
                              ("zero_init_nvme_" + std::to_string(getppid()))).string();
  std::filesystem::create_directories(folder);
  const std::string json = config_json(3, R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + folder + R"("})");
  TrainingRun whole = train(json, false);
  TrainingRun parted = train(json, true, "nvme");
  expect_same(whole, parted);
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(folder);
}

// ---- memory while the model is built -----------------------------------------

using peak_rss::kUnitBytes;
using peak_rss::kWidth;
using peak_rss::Layer;
using peak_rss::reset_peak;
using peak_rss::status_bytes;
using peak_rss::Tower;
constexpr int64_t kUnits = 24;


TEST(PartitionedConstruction, PeakWhileBuildingStaysNearOneUnitPlusTheParts) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: RSS does not show what is held";
#endif
  if (!reset_peak()) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak RSS here";
  const zero::Config config = zero::Config::from_json(config_json(3));
  torch::manual_seed(7);
  zero::PartitionedInitOptions options;
  options.group = g_world;
  int64_t baseline = 0, peak = 0, parts = 0;
  {
    // First-use costs outside both measurements: LibTorch's and the
    // allocator's, and the pages of the transport's shared memory a
    // broadcast of a parameter's size touches.
    Layer warm;
    at::Tensor weight = warm->a->weight.detach().clone();
    for (int i = 0; i < 4; ++i) g_world->broadcast(weight, 0);  // both sets of slots (comm/shm.cpp)
  }
  Tower tower{nullptr};
  {
    zero::Init init(config, options);
    ASSERT_TRUE(reset_peak());
    baseline = status_bytes("VmRSS");
    tower = Tower(kUnits);
    peak = status_bytes("VmHWM");
    parts = init.part_bytes();
  }
  const int world = g_world->size();
  EXPECT_EQ(parts, kUnits * 2 * ((kWidth * kWidth + world - 1) / world + (kWidth + world - 1) / world) * 4);
  const double bound = 1.2 * static_cast<double>(kUnitBytes + parts);
  if (g_world->rank() == 0) {
    std::cout << "building " << kUnits << " units of " << kUnitBytes << " bytes under zero::Init raised peak RSS by "
              << peak - baseline << " bytes (parts " << parts << ", bound " << static_cast<int64_t>(bound) << ")\n";
  }
  EXPECT_LT(static_cast<double>(peak - baseline), bound)
      << "peak " << peak << " over a baseline of " << baseline << " bytes; one unit is " << kUnitBytes
      << " bytes and this rank's parts " << parts;

  // The same measurement sees a whole construction (so it can fail).
  tower = nullptr;
  ASSERT_TRUE(reset_peak());
  baseline = status_bytes("VmRSS");
  Tower whole(kUnits);
  peak = status_bytes("VmHWM");
  EXPECT_GT(static_cast<double>(peak - baseline), 0.9 * static_cast<double>(kUnits * kUnitBytes));
  if (g_world->rank() == 0) std::cout << "built whole, the same model raised it by " << peak - baseline << " bytes\n";
}

// With offload_param and offload_optimizer on NVMe, initialize writes each
// bucket's shard and master weights as it makes them, and registers the
// optimizer's states without making them (they start at zero), and a step
// reads and writes them sub-group by sub-group: what a rank holds at once
// is the gradient partition and a few buckets, not the 16 bytes an element
// of the training state (ZeRO-Infinity's point). The same measurements with
// offload "cpu", which keeps it all in memory, show the difference.
struct Peaks {
  int64_t initialize = 0, steps = 0;  // peak RSS beyond the RSS before each
};

Peaks offload_peaks(const std::string& offload) {
  const std::string folder = (std::filesystem::temp_directory_path() /
                              ("zero_init_peak_" + std::to_string(getppid()))).string();
  std::filesystem::create_directories(folder);
  const std::string where = offload == "nvme" ? R"({"device": "nvme", "nvme_path": ")" + folder + R"("})"
                                              : R"({"device": "cpu"})";
  // Every tensor its own sub-group (sub_group_size): the step holds three.
  // Every unit released after its forward (stage3_max_reuse_distance 0).
  const zero::Config config = zero::Config::from_json(config_json(
      3, R"(, "sub_group_size": 3000, "stage3_max_reuse_distance": 0, "offload_param": )" + where +
             R"(, "offload_optimizer": )" + where));
  torch::manual_seed(7);
  zero::PartitionedInitOptions options;
  options.group = g_world;
  options.remote_device = offload;
  Tower tower{nullptr};
  {
    zero::Init init(config, options);
    tower = Tower(kUnits);
  }
  zero::InitOptions init_options;
  init_options.group = g_world;
  Peaks peaks;
  EXPECT_TRUE(reset_peak());
  int64_t baseline = status_bytes("VmRSS");
  {
    zero::Engine engine = zero::initialize(config, tower, init_options);
    peaks.initialize = status_bytes("VmHWM") - baseline;
    const at::Tensor x = torch::randn({kMicro, kWidth});
    EXPECT_TRUE(reset_peak());
    baseline = status_bytes("VmRSS");
    for (int step = 0; step < 2; ++step) {
      engine.backward(tower(x).square().mean());
      engine.step();
    }
    peaks.steps = status_bytes("VmHWM") - baseline;
    const zero::MemoryReport report = engine.memory_report();
    if (g_world->rank() == 0) std::cout << offload << ": " << report.describe() << "\n";
    // Stage 3's gathered units are their own item, not part of the activations.
    EXPECT_GT(report.gathered_params_peak, 0);
    EXPECT_NE(report.describe().find("; gathered units (peak) "), std::string::npos) << report.describe();
  }
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(folder);
  return peaks;
}

TEST(PartitionedConstruction, NvmeOffloadHoldsAFewBucketsNotTheState) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: RSS does not show what is held";
#endif
  if (!reset_peak()) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak RSS here";
  const Peaks nvme = offload_peaks("nvme");
  const Peaks cpu = offload_peaks("cpu");
  const int64_t numel = kUnits * kUnitBytes / 4 / g_world->size();  // this rank's partition, in elements
  const int64_t weight_shard = kWidth * kWidth / g_world->size();    // the largest tensor's shard, in elements
  // Initialize: the fp32 gradient partition stays in memory (4 bytes an
  // element); each bucket is made whole in fp32 once (reduce_bucket_size is
  // far below one unit, so a bucket is at most one unit) with its shard,
  // master and two moments beside it, and two shards and two masters are in
  // flight to their files.
  const double init_bound = 1.2 * static_cast<double>(4 * numel + kUnitBytes + 8 * kUnitBytes / g_world->size());
  // A step, beyond what initialize left: two units gathered (the one
  // running and the one prefetched) and one unit's gradients before they
  // are reduced; three sub-groups of master weights and moments (12 bytes
  // an element) and three parameter shards on their way to their files.
  const double step_bound = 1.2 * static_cast<double>(3 * kUnitBytes + 3 * 12 * weight_shard + 3 * 4 * weight_shard);
  if (g_world->rank() == 0) {
    std::cout << "a partition of " << numel << " elements: initialize raised peak RSS by " << nvme.initialize
              << " bytes with NVMe offload (bound " << static_cast<int64_t>(init_bound) << "), " << cpu.initialize
              << " with CPU offload; two steps by " << nvme.steps << " (bound " << static_cast<int64_t>(step_bound)
              << "), " << cpu.steps << " with CPU offload\n";
  }
  EXPECT_LT(static_cast<double>(nvme.initialize), init_bound);
  EXPECT_LT(static_cast<double>(nvme.steps), step_bound);
  // CPU offload keeps the parameters' shards and the master weights (8
  // bytes an element) from initialize, and the moments (8) from the first step.
  EXPECT_GT(static_cast<double>(cpu.initialize), 0.9 * 8.0 * static_cast<double>(numel));
  EXPECT_GT(static_cast<double>(cpu.steps), 0.9 * 8.0 * static_cast<double>(numel));
}

// ---- what is refused ---------------------------------------------------------

struct PairImpl : torch::nn::Module {
  PairImpl(zero::Unit<Layer> first, zero::Unit<Layer> second) {
    a = register_module("first", std::move(first));
    b = register_module("second", std::move(second));
  }
  zero::Unit<Layer> a{nullptr}, b{nullptr};
};
TORCH_MODULE(Pair);

TEST(PartitionedConstruction, AUnitBuiltOutsideIsNamed) {
  const zero::Config config = zero::Config::from_json(config_json(3));
  zero::PartitionedInitOptions options;
  options.group = g_world;
  zero::Unit<Layer> outside(Layer{});
  zero::Unit<Layer> inside{nullptr};
  {
    zero::Init init(config, options);
    inside = zero::Unit<Layer>(Layer{});
  }
  Pair pair(outside, inside);
  zero::InitOptions init_options;
  init_options.group = g_world;
  try {
    zero::initialize(config, pair, init_options);
    FAIL() << "a unit built outside zero::Init was accepted";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("unit first was built outside zero::Init"), std::string::npos) << e.what();
  }
}

TEST(PartitionedConstruction, AWriteAfterConstructionIsRefused) {
  const zero::Config config = zero::Config::from_json(config_json(3));
  zero::PartitionedInitOptions options;
  options.group = g_world;
  Tower tower{nullptr};
  {
    zero::Init init(config, options);
    tower = Tower(kUnits);
  }
  bool written = true;
  try {
    torch::nn::init::ones_(tower->layers->ptr<zero::UnitImpl<Layer>>(3)->inner()->b->bias);
  } catch (const c10::Error&) {
    written = false;  // LibTorch refused the write itself: nothing was lost
  }
  if (!written) GTEST_SKIP() << "this LibTorch refuses fill_ into the partitioned parameter already";
  zero::InitOptions init_options;
  init_options.group = g_world;
  try {
    zero::initialize(config, tower, init_options);
    FAIL() << "a parameter written after its unit was built was accepted";
  } catch (const zero::PartitionError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.b.bias was written after"), std::string::npos) << e.what();
  }
}

TEST(PartitionedConstruction, AnNvmePathThatCannotBeMadeIsRefusedBeforeAnythingIsBuilt) {
  // Under a device file: no folder can be made there (a missing one is made).
  const zero::Config config = zero::Config::from_json(
      config_json(3, R"(, "offload_param": {"device": "nvme", "nvme_path": "/dev/null/zero_parts"})"));
  zero::PartitionedInitOptions options;
  options.group = g_world;
  try {
    zero::Init init(config, options);
    FAIL() << "a missing nvme_path was accepted";
  } catch (const zero::OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/null/zero_parts"), std::string::npos) << e.what();
  }
}

// Parts in host memory that would outgrow the machine are named before they
// are allocated. The node's memory is shared by LOCAL_WORLD_SIZE ranks: a
// node of 10^9 ranks leaves each less than one unit's part.
TEST(PartitionedConstruction, PartsAboveTheMachinesMemoryAreRefusedBeforeAllocation) {
  const zero::Config config = zero::Config::from_json(config_json(3));
  zero::PartitionedInitOptions options;
  options.group = g_world;
  const char* had = std::getenv("LOCAL_WORLD_SIZE");
  const std::string saved = had ? had : "";
  zero::Init init(config, options);
  setenv("LOCAL_WORLD_SIZE", "1000000000", 1);
  std::string message;
  try {
    peak_rss::Tower tower(2);
  } catch (const zero::OffloadError& e) {
    message = e.what();
  }
  if (had) setenv("LOCAL_WORLD_SIZE", saved.c_str(), 1);
  else unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_NE(message.find("remote_device \"cpu\""), std::string::npos) << message;
  EXPECT_NE(message.find("1000000000 rank(s) on this node, above this machine's"), std::string::npos) << message;
  EXPECT_EQ(init.partitioned_params(), 0) << "a part was kept before the refusal";
}

TEST(PartitionedConstruction, TensorParallelismIsRefused) {
  const std::string json = config_json(3);
  const zero::Config config =
      zero::Config::from_json(json.substr(0, json.size() - 1) + R"(, "tensor_parallel": {"autotp_size": 2}})");
  zero::PartitionedInitOptions options;
  options.group = g_world;
  EXPECT_THROW(zero::Init(config, options), zero::ConfigError);
}

}  // namespace
