// zero-ckpt export --to deepspeed (interop/) without DeepSpeed: what the
// export writes must read back, through the import, to the checkpoint it
// came from, bit for bit, at another world size and stage; the pickles it
// writes must read back as the values written. (DeepSpeed itself resuming
// the export is tests/interop/export_to_deepspeed.sh.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "interop/export_deepspeed.h"
#include "interop/import_deepspeed.h"
#include "torchsave/pickle_writer.h"
#include "torchsave/torch_save.h"
#include "zero/error.h"

namespace {

namespace fs = std::filesystem;
namespace ck = zero::ckpt;
using zero::torchsave::Py;

const fs::path kFixtures = ZERO_FIXTURES "/deepspeed";

class Scratch {
 public:
  Scratch() {
    path_ = fs::temp_directory_path() / ("zero_export_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
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

fs::path write_config(const fs::path& dir, nlohmann::json config) {
  const fs::path path = dir / "ds_config.json";
  std::ofstream(path) << config.dump();
  return path;
}

nlohmann::json config_of(const std::string& fixture) {
  std::ifstream in(kFixtures / fixture / "config.json");
  return nlohmann::json::parse(in);
}

fs::path import(const std::string& fixture, const fs::path& out) {
  zero::interop::ImportOptions o;
  o.from = kFixtures / fixture / "ckpt";
  o.out = out;
  zero::interop::import_deepspeed(o);
  return out;
}

void export_to(const fs::path& from, const fs::path& out, const fs::path& config, int world,
               std::vector<std::pair<std::string, std::string>> rename = {}) {
  zero::interop::ExportOptions o;
  o.from = from;
  o.out = out;
  o.config = config;
  o.world_size = world;
  o.rename = std::move(rename);
  zero::interop::export_deepspeed(o);
}

// Every kind of every parameter of `a` equals `b`'s, bit for bit.
void expect_same_checkpoint(const fs::path& a, const fs::path& b, const std::string& what) {
  const ck::Manifest ma = ck::read_manifest(a, ck::read_latest(a)), mb = ck::read_manifest(b, ck::read_latest(b));
  ASSERT_EQ(ma.params.size(), mb.params.size()) << what;
  EXPECT_EQ(ma.states, mb.states) << what;
  for (const char* key : {"global_steps", "optimizer_steps", "scheduler_steps", "skipped_steps", "next_lr"})
    EXPECT_EQ(ma.engine[key], mb.engine[key]) << what << " " << key;
  ck::FragmentReader ra(a, ma), rb(b, mb);
  std::vector<std::string> kinds{"fp32"};
  kinds.insert(kinds.end(), ma.states.begin(), ma.states.end());
  for (const auto& p : ma.params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    for (const auto& kind : kinds) {
      std::vector<float> x(n), y(n);
      ra.read_f32(kind, p.name, 0, n, x.data());
      rb.read_f32(kind, p.name, 0, n, y.data());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), n * sizeof(float)), 0) << what << ": " << kind << " of " << p.name;
    }
  }
}

TEST(ExportDeepSpeed, ReadsBackBitForBitAtEveryStageAndWorldSize) {
  for (const std::string fixture : {"stage2_fp32_2ranks", "stage3_bf16_4ranks", "stage1_fp32_4ranks"}) {
    Scratch scratch;
    const fs::path zero = import(fixture, scratch.path() / "zero");
    for (int stage : {1, 2, 3}) {
      for (int world : {1, 3, 4}) {  // 3: partitions that do not divide the parameters
        const std::string what = fixture + " exported for stage " + std::to_string(stage) + " on " + std::to_string(world);
        nlohmann::json config = config_of(fixture);
        config["zero_optimization"] = {{"stage", stage}};
        const fs::path dir = scratch.path() / ("s" + std::to_string(stage) + "w" + std::to_string(world));
        fs::create_directories(dir);
        export_to(zero, dir / "deepspeed", write_config(dir, config), world);
        zero::interop::ImportOptions o;
        o.from = dir / "deepspeed";
        o.out = dir / "back";
        const auto summary = zero::interop::import_deepspeed(o);
        EXPECT_EQ(summary.stage, stage) << what;
        EXPECT_EQ(summary.world_size, world) << what;
        expect_same_checkpoint(zero, dir / "back", what);
      }
    }
  }
}

// A rank's optimizer file from a later save of the same run, dropped into
// an earlier tag's folder: the same layout, another step. The import names
// it instead of writing weights of mixed steps. The later save is the same
// checkpoint with its step counts moved on, exported alike.
TEST(ExportDeepSpeed, ARankFileOfAnotherStepIsRefused) {
  Scratch scratch;
  const fs::path zero = import("stage2_fp32_2ranks", scratch.path() / "zero");
  const fs::path later = scratch.path() / "later";
  fs::copy(zero, later, fs::copy_options::recursive);
  const std::string tag = ck::read_latest(later);
  const fs::path manifest = later / tag / "manifest.json";
  nlohmann::json m;
  {
    std::ifstream in(manifest);
    m = nlohmann::json::parse(in);
  }
  m["engine"]["optimizer_steps"] = m["engine"]["optimizer_steps"].get<int64_t>() + 2;
  m["engine"]["global_steps"] = m["engine"]["global_steps"].get<int64_t>() + 2;
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  const fs::path config = write_config(scratch.path(), config_of("stage2_fp32_2ranks"));
  export_to(zero, scratch.path() / "ds_early", config, 2);
  export_to(later, scratch.path() / "ds_later", config, 2);
  auto latest_of = [](const fs::path& deepspeed) {  // DeepSpeed's `latest`: the tag, one line
    std::string tag;
    std::ifstream(deepspeed / "latest") >> tag;
    return tag;
  };
  const fs::path rank1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  ASSERT_NE(latest_of(scratch.path() / "ds_later"), "");
  fs::copy_file(scratch.path() / "ds_later" / latest_of(scratch.path() / "ds_later") / rank1,
                scratch.path() / "ds_early" / latest_of(scratch.path() / "ds_early") / rank1,
                fs::copy_options::overwrite_existing);
  zero::interop::ImportOptions o;
  o.from = scratch.path() / "ds_early";
  o.out = scratch.path() / "back";
  const std::string message = message_of([&] { zero::interop::import_deepspeed(o); });
  EXPECT_NE(message.find("zero_pp_rank_1_mp_rank_00_optim_states.pt: its optimizer states have taken 5 steps"),
            std::string::npos) << message;
  EXPECT_NE(message.find("the folder mixes checkpoints of different steps"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(scratch.path() / "back"));
}

TEST(ExportDeepSpeed, TheNameMapGivesDeepSpeedsNamesAndOrder) {
  Scratch scratch;
  zero::interop::ImportOptions in;
  in.from = kFixtures / "stage2_fp32_2ranks" / "ckpt";
  in.out = scratch.path() / "zero";
  const auto map = zero::interop::read_name_map(kFixtures / "name_map.json");
  for (const auto& [from, to] : map) in.rename[from] = to;
  zero::interop::import_deepspeed(in);
  export_to(in.out, scratch.path() / "ds", write_config(scratch.path(), config_of("stage2_fp32_2ranks")), 2, map);
  // The model states list DeepSpeed's names in the map's order, as the
  // original folder does.
  zero::torchsave::TorchSaveFile ours(scratch.path() / "ds" / "global_step3" / "mp_rank_00_model_states.pt");
  zero::torchsave::TorchSaveFile original(kFixtures / "stage2_fp32_2ranks" / "ckpt" / "global_step3" / "mp_rank_00_model_states.pt");
  auto names = [](const zero::torchsave::TorchSaveFile& f) {
    std::vector<std::string> out;
    for (const auto& [k, v] : f.root().at("param_shapes", "x").items[0]->entries) out.push_back(k->text);
    return out;
  };
  EXPECT_EQ(names(ours), names(original));
  // And the folder is what the original was, to the bit, in its masters.
  zero::interop::ImportOptions back;
  back.from = scratch.path() / "ds";
  back.out = scratch.path() / "back";
  zero::interop::import_deepspeed(back);
  Scratch plain;
  expect_same_checkpoint(import("stage2_fp32_2ranks", plain.path() / "z"), scratch.path() / "back", "renamed twice");
}

TEST(ExportDeepSpeed, PicklesReadBackAsWritten) {
  Scratch scratch;
  std::vector<float> values{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  Py root = Py::dict();
  root.set("small", Py::integer(7)).set("two_bytes", Py::integer(300)).set("negative", Py::integer(-5));
  root.set("big", Py::integer(int64_t{1} << 40)).set("real", Py::real(-0.125)).set("text", Py::str("é and \n"));
  root.set("list", Py::list({Py::boolean(true), Py::none(), Py::tuple({Py::integer(1), Py::integer(2)})}));
  Py ordered = Py::ordered_dict();
  ordered.set("b", Py::integer(1)).set("a", Py::integer(2));
  root.set("ordered", std::move(ordered)).set("size", Py::size({3, 2}));
  root.set("tensor", Py::tensor("0", ck::DType::F32, {2, 3}));
  root.set("stage", Py::call("deepspeed.runtime.zero.config", "ZeroStageEnum", {Py::integer(3)}));
  const fs::path path = scratch.path() / "values.pt";
  zero::torchsave::write_torch_save(path, root, {{"0", values.data(), values.size() * sizeof(float)}});
  zero::torchsave::TorchSaveFile file(path);
  const auto& v = file.root();
  EXPECT_EQ(v.at("small", "").as_int(""), 7);
  EXPECT_EQ(v.at("two_bytes", "").as_int(""), 300);
  EXPECT_EQ(v.at("negative", "").as_int(""), -5);
  EXPECT_EQ(v.at("big", "").as_int(""), int64_t{1} << 40);
  EXPECT_EQ(v.at("real", "").as_float(""), -0.125);
  EXPECT_EQ(v.at("text", "").as_string(""), "é and \n");
  ASSERT_EQ(v.at("list", "").items.size(), 3u);
  EXPECT_TRUE(v.at("list", "").items[1]->is_none());
  EXPECT_EQ(v.at("ordered", "").entries[0].first->text, "b");
  EXPECT_EQ(v.at("size", "").items.size(), 2u);
  EXPECT_EQ(v.at("stage", "").items[0]->integer, 3);
  const auto& t = v.at("tensor", "").as_tensor("");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> back(6);
  file.read(t, back.data());
  EXPECT_EQ(back, values);
  file.verify();  // the CRC-32s libzip wrote
}

TEST(ExportDeepSpeed, RefusesWhatItCannotWriteAndLeavesNothing) {
  Scratch scratch;
  const fs::path zero = import("stage2_fp32_2ranks", scratch.path() / "zero");
  const fs::path out = scratch.path() / "out";
  auto refused = [&](nlohmann::json config, const std::string& needle, std::vector<std::pair<std::string, std::string>> rename = {}) {
    const std::string message = message_of([&] { export_to(zero, out, write_config(scratch.path(), config), 2, rename); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(out)) << needle;
  };
  nlohmann::json config = config_of("stage2_fp32_2ranks");
  config["fp16"] = {{"enabled", true}};
  refused(config, "enables fp16");
  config = config_of("stage2_fp32_2ranks");
  config["zero_optimization"]["stage"] = 0;
  refused(config, "has zero_optimization.stage 0; export writes ZeRO stages 1, 2 and 3");
  config = config_of("stage2_fp32_2ranks");
  config["optimizer"]["type"] = "Lamb";
  refused(config, "has optimizer type \"Lamb\"");
  refused(config_of("stage2_fp32_2ranks"), "maps \"gpt.x\" to \"x.weight\", which", {{"gpt.x", "x.weight"}});
  EXPECT_NE(message_of([&] { export_to(zero, zero / "inside", write_config(scratch.path(), config_of("stage2_fp32_2ranks")), 2); })
                .find("is inside the input folder"),
            std::string::npos);
}

}  // namespace
