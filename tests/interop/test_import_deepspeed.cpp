// zero-ckpt import --from deepspeed (interop/), on the DeepSpeed 0.19
// checkpoints of tests/fixtures/deepspeed (tools/fixtures/make_deepspeed_
// fixtures.py). The imported master weights must equal, bit for bit, what
// DeepSpeed's own zero_to_fp32 consolidates from the same folder (the
// fixture's reference/zero_to_fp32.safetensors); the counters must be the
// steps DeepSpeed ran (losses.json). Whether the optimizer states are right
// is what tests/interop/resume_from_deepspeed.sh shows: a zero run resumed
// from the import continues DeepSpeed's losses.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "interop/import_deepspeed.h"
#include "zero/error.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zero::ckpt;
using zero::interop::ImportOptions;

const fs::path kFixtures = ZERO_FIXTURES "/deepspeed";

std::vector<std::string> fixtures() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kFixtures))
    if (fs::is_directory(e.path() / "ckpt")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class Scratch {
 public:
  Scratch() {
    path_ = fs::temp_directory_path() / ("zero_import_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zero::CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// The DeepSpeed fixture's checkpoint copied to `to`, for damaging.
fs::path copy_fixture(const std::string& name, const fs::path& to) {
  fs::copy(kFixtures / name / "ckpt", to, fs::copy_options::recursive);
  return to;
}

void import(const fs::path& from, const fs::path& out, const std::map<std::string, std::string>& rename = {}) {
  ImportOptions o;
  o.from = from;
  o.out = out;
  o.rename = rename;
  zero::interop::import_deepspeed(o);
}

TEST(ImportDeepSpeed, MasterWeightsEqualZeroToFp32AndCountersTheStepsRun) {
  const auto names = fixtures();
  ASSERT_GE(names.size(), 14u);
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    Scratch scratch;
    const fs::path out = scratch.path() / "imported";
    import(kFixtures / name / "ckpt", out);
    const ck::Manifest m = ck::read_manifest(out, ck::read_latest(out));
    const nlohmann::json config = read_json(kFixtures / name / "config.json");
    EXPECT_EQ(m.stage, config["zero_optimization"]["stage"].get<int>());
    EXPECT_EQ(m.world_size, std::stoi(name.substr(name.rfind('_') + 1)));
    EXPECT_EQ(m.dtype, config.contains("bf16") ? "BF16" : "F32");
    EXPECT_EQ(m.optimizer, "AdamW");
    EXPECT_EQ(m.states, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));

    // DeepSpeed's consolidation, by DeepSpeed's names, in the same order.
    ck::SafetensorsFile expected(kFixtures / name / "reference" / "zero_to_fp32.safetensors");
    ASSERT_EQ(m.params.size(), expected.entries().size());
    ck::FragmentReader reader(out, m);
    for (const auto& p : m.params) {
      auto it = expected.entries().find(p.name);
      ASSERT_NE(it, expected.entries().end()) << p.name;
      EXPECT_EQ(p.shape, it->second.shape) << p.name;
      const int64_t n = static_cast<int64_t>((it->second.end - it->second.begin) / sizeof(float));
      std::vector<float> ours(n), theirs(n);
      reader.read_f32("fp32", p.name, 0, n, ours.data());
      expected.read(p.name, 0, n * sizeof(float), theirs.data());
      EXPECT_EQ(std::memcmp(ours.data(), theirs.data(), n * sizeof(float)), 0) << p.name << " differs from zero_to_fp32's";
      for (const auto& kind : m.states) EXPECT_EQ(reader.covered_elements(kind, p.name), n) << kind << " " << p.name;
    }

    // bf16 at stages 1-2: the model's weights DeepSpeed saved are the
    // masters rounded to bf16 (to nearest, ties to even), as zero derives
    // them from the imported masters.
    if (m.dtype == "BF16" && m.stage < 3) {
      ck::SafetensorsFile module(kFixtures / name / "reference" / "mp_rank_00_model_states.safetensors");
      for (const auto& p : m.params) {
        const auto& entry = module.entries().at("module/" + p.name);
        ASSERT_EQ(entry.dtype, ck::DType::BF16) << p.name;
        const int64_t n = static_cast<int64_t>((entry.end - entry.begin) / 2);
        std::vector<uint16_t> saved(n);
        module.read("module/" + p.name, 0, n * 2, saved.data());
        std::vector<float> master(n);
        reader.read_f32("fp32", p.name, 0, n, master.data());
        for (int64_t i = 0; i < n; ++i) {
          uint32_t bits;
          std::memcpy(&bits, &master[i], 4);
          const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
          ASSERT_EQ(rounded, saved[i]) << p.name << " element " << i;
        }
      }
    }

    // The steps DeepSpeed ran, and the lr its scheduler left.
    const nlohmann::json ran = read_json(kFixtures / name / "losses.json");
    const int64_t steps = static_cast<int64_t>(ran["losses"].size());
    EXPECT_EQ(m.engine["global_steps"], steps);
    EXPECT_EQ(m.engine["optimizer_steps"], steps);
    EXPECT_EQ(m.engine["scheduler_steps"], steps);
    EXPECT_EQ(m.engine["micro_steps"], steps);  // gradient_accumulation_steps 1
    EXPECT_DOUBLE_EQ(m.engine["next_lr"].get<double>(), ran["lr"].back().get<double>());  // get_lr() after the last step
  }
}

TEST(ImportDeepSpeed, TheNameMapRenamesEveryTensorItNames) {
  Scratch scratch;
  const auto ordered = zero::interop::read_name_map(kFixtures / "name_map.json");
  const std::map<std::string, std::string> map(ordered.begin(), ordered.end());
  ASSERT_FALSE(map.empty());
  import(kFixtures / "stage2_fp32_2ranks" / "ckpt", scratch.path() / "out", map);
  const ck::Manifest m = ck::read_manifest(scratch.path() / "out", "global_step3");
  ck::SafetensorsFile expected(kFixtures / "stage2_fp32_2ranks" / "reference" / "zero_to_fp32.safetensors");
  ck::FragmentReader reader(scratch.path() / "out", m);
  for (const auto& [from, to] : map) {
    auto p = std::find_if(m.params.begin(), m.params.end(), [&](const ck::ParamInfo& q) { return q.name == to; });
    ASSERT_NE(p, m.params.end()) << to;
    const auto& entry = expected.entries().at(from);
    const int64_t n = static_cast<int64_t>((entry.end - entry.begin) / sizeof(float));
    std::vector<float> ours(n), theirs(n);
    reader.read_f32("fp32", to, 0, n, ours.data());
    expected.read(from, 0, n * sizeof(float), theirs.data());
    EXPECT_EQ(ours, theirs) << from << " -> " << to;
  }

  // A map that names no tensor of the checkpoint is a typo, not a no-op.
  EXPECT_NE(message_of([&] { import(kFixtures / "stage2_fp32_2ranks" / "ckpt", scratch.path() / "typo", {{"gpt.wte.weigth", "wte.weight"}}); })
                .find("renames \"gpt.wte.weigth\", which"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              import(kFixtures / "stage2_fp32_2ranks" / "ckpt", scratch.path() / "twice",
                     {{"gpt.wte.weight", "x"}, {"gpt.wpe.weight", "x"}});
            }).find("would both be named \"x\""),
            std::string::npos);
  EXPECT_FALSE(fs::exists(scratch.path() / "typo"));
  EXPECT_FALSE(fs::exists(scratch.path() / "twice"));
}

// Each bad input: one error naming the file or key, and nothing at OUT.
TEST(ImportDeepSpeed, BadFoldersFailNamingTheFileAndLeaveNothing) {
  Scratch scratch;
  const fs::path out = scratch.path() / "out";
  auto expect_refused = [&](const fs::path& from, const std::string& needle) {
    const std::string message = message_of([&] { import(from, out); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(out)) << needle;
    for (const auto& e : fs::directory_iterator(scratch.path()))  // no staging folder left either
      EXPECT_EQ(e.path().filename().string().find(".out.staging"), std::string::npos) << e.path();
  };

  const fs::path no_tag = copy_fixture("stage2_fp32_2ranks", scratch.path() / "no_tag");
  std::ofstream(no_tag / "latest") << "global_step9";
  expect_refused(no_tag, "names tag \"global_step9\", but");

  // Note [Tag rule]: DeepSpeed's `latest` is read by zero's one rule, which
  // refuses names DeepSpeed's folders accepted before ("latest", hidden).
  for (const std::string tag : {"latest", ".global_step3"}) {
    const fs::path odd = copy_fixture("stage2_fp32_2ranks", scratch.path() / "odd_tag");
    std::ofstream(odd / "latest") << tag;
    expect_refused(odd, "invalid checkpoint tag \"" + tag + "\"");
    fs::remove_all(odd);
  }

  const fs::path missing = copy_fixture("stage2_fp32_2ranks", scratch.path() / "missing");
  fs::remove(missing / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt");
  expect_refused(missing, "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing");

  const fs::path mixed = copy_fixture("stage2_fp32_2ranks", scratch.path() / "mixed");
  fs::copy(kFixtures / "stage2_fp32_4ranks" / "ckpt" / "global_step3" / "zero_pp_rank_3_mp_rank_00_optim_states.pt",
           mixed / "global_step3");
  expect_refused(mixed, "mixes checkpoints of different world sizes");

  const fs::path mixed_count = copy_fixture("stage2_fp32_2ranks", scratch.path() / "mixed_count");
  fs::copy(kFixtures / "stage2_fp32_4ranks" / "ckpt" / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
           mixed_count / "global_step3", fs::copy_options::overwrite_existing);
  expect_refused(mixed_count, "partition_count is 4, but the model states say dp_world_size 2");

  const fs::path model_parallel = copy_fixture("stage2_fp32_2ranks", scratch.path() / "mp");
  fs::copy(model_parallel / "global_step3" / "mp_rank_00_model_states.pt", model_parallel / "global_step3" / "mp_rank_01_model_states.pt");
  expect_refused(model_parallel, "model-parallel (tensor-parallel) DeepSpeed checkpoint (mp_rank 01)");

  // A byte changed inside rank 1's data: found by its CRC-32 after rank 0's
  // file is already written, and the staged output goes.
  const fs::path damaged = copy_fixture("stage3_fp32_2ranks", scratch.path() / "damaged");
  const fs::path victim = damaged / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  std::string bytes;
  {
    std::ifstream in(victim, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("/data/0");  // the first storage entry's local header; its data follows
  ASSERT_NE(at, std::string::npos);
  bytes[at + 200] ^= 0x10;
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  expect_refused(damaged, "zero_pp_rank_1_mp_rank_00_optim_states/data/0 is damaged (CRC error)");

  EXPECT_NE(message_of([&] { import(kFixtures / "stage2_fp32_2ranks" / "ckpt", kFixtures / "stage2_fp32_2ranks" / "ckpt" / "zero"); })
                .find("is inside the input folder"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(kFixtures / "stage2_fp32_2ranks" / "ckpt" / "zero"));
  EXPECT_NE(message_of([&] { import(kFixtures / "stage2_fp32_2ranks" / "ckpt", kFixtures / "stage2_fp32_2ranks" / "ckpt/"); })
                .find("is the input folder"),
            std::string::npos);
  fs::create_directories(scratch.path() / "full");
  std::ofstream(scratch.path() / "full" / "keep") << "mine";
  EXPECT_NE(message_of([&] { import(kFixtures / "stage2_fp32_2ranks" / "ckpt", scratch.path() / "full"); })
                .find("already exists and is not empty"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(scratch.path() / "full" / "keep"));
}

}  // namespace

namespace {

// A load (engine.load_checkpoint, zero-ckpt inspect) of DeepSpeed's folder
// itself says how to convert it.
TEST(ImportDeepSpeed, LoadingADeepSpeedFolderSaysHowToConvertIt) {
  const std::string dir = kFixtures / "stage3_fp32_2ranks" / "ckpt";
  for (const auto& f : std::vector<std::function<void()>>{[&] { ck::read_latest(dir); },
                                                          [&] { ck::read_manifest(dir, "global_step3"); }}) {
    const std::string message = message_of(f);
    EXPECT_NE(message.find("is a DeepSpeed checkpoint (it holds zero_pp_rank_0_mp_rank_00_model_states.pt)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("zero-ckpt import --from deepspeed " + dir + " NEW_DIR"), std::string::npos) << message;
  }
}

}  // namespace
