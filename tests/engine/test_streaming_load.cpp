// Engine::load_weights on 1-3 ranks: weights written to safetensors files
// (one file, or Hugging Face's index and shards, in F32 or BF16) stream
// into a model partitioned as it was built and come back bitwise (BF16: as
// rounded); a file that does not match the model is refused naming each
// tensor before anything changes; and loading holds no more than about one
// bucket beyond the partition (peak RSS, read from the kernel).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "gpt/gpt.h"
#include "peak_rss.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using zero_examples::GPT;
using zero_examples::GPTOptions;

GPTOptions gpt_options() {
  GPTOptions o;
  o.vocab_size = 29;
  o.context = 16;
  o.width = 32;
  o.depth = 3;
  o.heads = 2;
  return o;
}

zero::Config config(int stage, int64_t bucket = 3000) {
  return zero::Config::from_json(
      R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": )" +
      std::to_string(stage) + R"(, "reduce_bucket_size": )" + std::to_string(bucket) +
      R"(, "stage3_param_persistence_threshold": 0}})");
}

using State = std::vector<std::pair<std::string, at::Tensor>>;

State state_of(torch::nn::Module& m) {
  State out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value().detach().clone());
  return out;
}

// One folder for every rank (the launcher's pid), made by all, written by rank 0.
std::string shared_folder(const std::string& name) {
  const fs::path folder = fs::temp_directory_path() / (name + "_" + std::to_string(getppid()));
  fs::create_directories(folder);
  return folder.string();
}

// `state` written by rank 0 into `files` safetensors files (tensors dealt
// round-robin) in `dtype`, names with `prefix`; with more than one file,
// Hugging Face's index beside them. Every rank waits for it.
void write_weights(const std::string& folder, const State& state, int files, at::ScalarType dtype,
                   const std::string& prefix = "") {
  if (g_world->rank() == 0) {
    std::vector<std::vector<zero::ckpt::TensorData>> shards(files);
    std::vector<at::Tensor> kept;
    nlohmann::json map = nlohmann::json::object();
    for (size_t i = 0; i < state.size(); ++i) {
      at::Tensor t = at::isFloatingType(state[i].second.scalar_type()) ? state[i].second.to(dtype).contiguous()
                                                                      : state[i].second.contiguous();
      kept.push_back(t);
      zero::ckpt::TensorData d;
      d.name = prefix + state[i].first;
      d.dtype = t.scalar_type() == at::kBFloat16 ? zero::ckpt::DType::BF16
                : t.scalar_type() == at::kLong   ? zero::ckpt::DType::I64
                                                 : zero::ckpt::DType::F32;
      d.shape = t.sizes().vec();
      d.data = t.data_ptr();
      d.bytes = t.nbytes();
      shards[i % files].push_back(d);
    }
    if (files == 1) {
      zero::ckpt::write_safetensors(folder + "/model.safetensors", shards[0]);
    } else {
      for (int f = 0; f < files; ++f) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, files);
        zero::ckpt::write_safetensors(folder + "/" + name, shards[f]);
        for (const auto& d : shards[f]) map[d.name] = name;
      }
      std::ofstream(folder + "/model.safetensors.index.json") << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump();
    }
  }
  g_world->barrier();
}

void expect_state(const State& want, const State& got) {
  ASSERT_EQ(want.size(), got.size());
  std::map<std::string, at::Tensor> by_name(got.begin(), got.end());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, by_name[name])) << name;
  }
}

zero::Engine partitioned_engine(const zero::Config& c, GPT& model, int seed) {
  torch::manual_seed(seed);
  zero::PartitionedInitOptions options;
  options.group = g_world;
  {
    zero::Init init(c, options);
    model = GPT(gpt_options());
  }
  zero::InitOptions init_options;
  init_options.group = g_world;
  return zero::initialize(c, model, init_options);
}

TEST(StreamingLoad, OneFileIntoAPartitionedModel) {
  torch::manual_seed(11);
  GPT reference(gpt_options());
  const State want = state_of(*reference);
  const std::string folder = shared_folder("zero_load_single");
  write_weights(folder, want, 1, at::kFloat);
  GPT model{nullptr};
  zero::Engine engine = partitioned_engine(config(3), model, 12);
  engine.load_weights(folder);  // the folder's model.safetensors
  expect_state(want, engine.gathered_state_dict());
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(folder);
}

TEST(StreamingLoad, ShardedBf16FilesWithANameMap) {
  torch::manual_seed(21);
  GPT reference(gpt_options());
  const State written = state_of(*reference);
  const std::string folder = shared_folder("zero_load_sharded");
  write_weights(folder, written, 3, at::kBFloat16, "model.");
  State want;  // what BF16 keeps of each value
  for (const auto& [name, t] : written) {
    want.emplace_back(name, at::isFloatingType(t.scalar_type()) ? t.to(at::kBFloat16).to(at::kFloat) : t);
  }
  for (int stage : {2, 3}) {
    GPT model{nullptr};
    zero::Engine engine = partitioned_engine(config(stage), model, 22);
    zero::WeightsLoadOptions options;
    options.name_in_files = [](const std::string& name) { return "model." + name; };
    engine.load_weights(folder + "/model.safetensors.index.json", options);
    expect_state(want, engine.gathered_state_dict());
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(folder);
}

// zero's own way out and back in: a sharded checkpoint consolidated into one
// fp32 file (what `zero-ckpt consolidate` writes) loads into a fresh
// partitioned model at another stage as the weights that were saved.
TEST(StreamingLoad, AConsolidatedCheckpointLoads) {
  const std::string folder = shared_folder("zero_load_consolidated");
  State want;
  {
    GPT model{nullptr};
    zero::Engine engine = partitioned_engine(config(2), model, 51);
    want = engine.gathered_state_dict();
    engine.save_checkpoint(folder + "/ckpt", "t");
  }
  if (g_world->rank() == 0) zero::ckpt::consolidate(folder + "/ckpt", "t", folder + "/consolidated.safetensors");
  g_world->barrier();
  GPT model{nullptr};
  zero::Engine engine = partitioned_engine(config(3), model, 52);
  engine.load_weights(folder + "/consolidated.safetensors");
  expect_state(want, engine.gathered_state_dict());
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(folder);
}

TEST(StreamingLoad, MismatchesAreNamedAndNothingIsLoaded) {
  torch::manual_seed(31);
  GPT reference(gpt_options());
  State written;
  for (auto& [name, t] : state_of(*reference)) {
    if (name == "ln_f.weight") continue;                                           // missing
    written.emplace_back(name, name == "wpe.weight" ? t.narrow(0, 0, 8).contiguous() : t);  // reshaped
  }
  written.emplace_back("bogus.weight", torch::ones({3}));  // left over
  const std::string folder = shared_folder("zero_load_mismatch");
  write_weights(folder, written, 1, at::kFloat);
  GPT model{nullptr};
  zero::Engine engine = partitioned_engine(config(3), model, 32);
  const State before = engine.gathered_state_dict();
  try {
    engine.load_weights(folder + "/model.safetensors");
    FAIL() << "weights that do not match the model were loaded";
  } catch (const zero::CheckpointError& e) {
    const std::string what = e.what();
    for (const char* name : {"ln_f.weight", "wpe.weight [8,32]", "bogus.weight", "nothing was loaded"}) {
      EXPECT_NE(what.find(name), std::string::npos) << name << " in: " << what;
    }
  }
  expect_state(before, engine.gathered_state_dict());
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(folder);
}

// A read failing half-way (the third bucket, on the last rank; ZERO_FAULT)
// leaves the parameters partly loaded: every rank raises, and the engine
// will neither train nor save until a load succeeds.
TEST(StreamingLoad, AReadFailingHalfWayLeavesNoModelToTrainOrSave) {
  torch::manual_seed(41);
  GPT reference(gpt_options());
  const State want = state_of(*reference);
  const std::string folder = shared_folder("zero_load_halfway");
  write_weights(folder, want, 2, at::kFloat);
  GPT model{nullptr};
  zero::Engine engine = partitioned_engine(config(3), model, 42);
  const std::string fault = "weights.read:" + std::to_string(g_world->size() - 1) + ":3";
  ::setenv("ZERO_FAULT", fault.c_str(), 1);
  try {
    engine.load_weights(folder);
    ::unsetenv("ZERO_FAULT");
    FAIL() << "a failed read was not reported";
  } catch (const zero::CheckpointError& e) {
    ::unsetenv("ZERO_FAULT");
    EXPECT_NE(std::string(e.what()).find("partly loaded"), std::string::npos) << e.what();
  }
  at::Tensor tokens = torch::arange(2 * 17, torch::kLong).reshape({2, 17}) % 29;
  auto expect_refused = [&](const std::function<void()>& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " ran on a partly loaded model";
    } catch (const zero::EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("partly loaded"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ZERO_FAULT"), std::string::npos) << "the failure is named: " << e.what();
    }
  };
  expect_refused([&] { engine.backward(model->loss(tokens.slice(1, 0, 16), tokens.slice(1, 1, 17))); }, "backward");
  expect_refused([&] { engine.step(); }, "step");
  const std::string checkpoint = shared_folder("zero_load_halfway_ckpt");
  expect_refused([&] { engine.save_checkpoint(checkpoint); }, "save_checkpoint");
  EXPECT_FALSE(fs::exists(fs::path(checkpoint) / "latest")) << "nothing was saved";

  engine.load_weights(folder);  // loaded again: usable
  expect_state(want, engine.gathered_state_dict());
  engine.backward(model->loss(tokens.slice(1, 0, 16), tokens.slice(1, 1, 17)));
  engine.step();
  g_world->barrier();
  if (g_world->rank() == 0) {
    fs::remove_all(folder);
    fs::remove_all(checkpoint);
  }
}

// ---- memory while loading ----------------------------------------------------

using peak_rss::kUnitBytes;
using peak_rss::reset_peak;
using peak_rss::status_bytes;
using peak_rss::Tower;
constexpr int64_t kUnits = 16;


TEST(StreamingLoad, PeakWhileLoadingStaysUnderABucket) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: RSS does not show what is held";
#endif
  if (!reset_peak()) GTEST_SKIP() << "/proc/self/clear_refs cannot reset the peak RSS here";
  const zero::Config c = config(3, 3000000);
  const std::string folder = shared_folder("zero_load_peak");
  State want;
  {
    torch::manual_seed(41);
    Tower reference(kUnits);
    want = state_of(*reference);
    write_weights(folder, want, 2, at::kFloat);
  }
  torch::manual_seed(42);
  Tower tower{nullptr};
  zero::PartitionedInitOptions options;
  options.group = g_world;
  {
    zero::Init init(c, options);
    tower = Tower(kUnits);
  }
  zero::InitOptions init_options;
  init_options.group = g_world;
  zero::Engine engine = zero::initialize(c, tower, init_options);
  ASSERT_TRUE(reset_peak());
  const int64_t baseline = status_bytes("VmRSS");
  engine.load_weights(folder);
  const int64_t peak = status_bytes("VmHWM");
  const int64_t bucket = kUnitBytes;  // one unit: its bucket
  if (g_world->rank() == 0) {
    std::cout << "loading " << kUnits * bucket << " bytes of weights raised peak RSS by " << peak - baseline
              << " bytes (one bucket: " << bucket << ")\n";
  }
  EXPECT_LT(static_cast<double>(peak - baseline), 1.2 * static_cast<double>(bucket))
      << "peak " << peak << " over a baseline of " << baseline;
  expect_state(want, engine.gathered_state_dict());
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(folder);
}

}  // namespace
