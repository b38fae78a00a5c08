// Writers on a real full disk, on 2 ranks started by zero-run: a tmpfs this
// test mounts (size-limited, so a write past it fails with ENOSPC as on any
// full disk; skipped with the reason where mounting is not permitted).
// For csv_monitor, tensorboard, a checkpoint save and consolidation
// (zero-ckpt consolidate's writer, save_16bit_model), each on a disk full
// from the start or on one that fills mid-run, every rank must raise the
// error (EngineError for the monitors, CheckpointError for the checkpoint
// files; at the same step where a step raises it), naming the writer, the file and errno's text, well within 30 s
// of the disk filling (a fail-safe bound, not a benchmark); and the
// checkpoint saved before the disk filled must load back bit for bit.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "ckpt/checkpoint.h"    // consolidate, as zero-ckpt consolidate calls it
#include "monitor/monitor.h"  // tensorboard_available
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr double kBoundS = 30;
const std::string kNoSpace = std::strerror(ENOSPC);  // "No space left on device"

// A tmpfs of `mib` MiB mounted by rank 0 at a folder both ranks see;
// `error` says why not when it could not be mounted (on every rank).
struct Tmpfs {
  std::string dir, error;
  explicit Tmpfs(int mib) {
    at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
    g_world->broadcast(pid, 0);
    dir = (fs::temp_directory_path() / ("zero_full_disk_" + std::to_string(pid.item<int64_t>()))).string();
    at::Tensor ok = torch::ones({1}, at::kInt);
    if (g_world->rank() == 0) {
      fs::create_directories(dir);
      const std::string options = "size=" + std::to_string(mib) + "m";
      if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
        error = std::string("cannot mount a tmpfs (") + std::strerror(errno) + "); run as root to test a full disk";
        fs::remove(dir);
        ok.zero_();
      }
    }
    g_world->broadcast(ok, 0);
    if (ok.item<int>() == 0 && error.empty()) error = "rank 0 could not mount a tmpfs (see its output)";
  }
  ~Tmpfs() {
    g_world->barrier();
    if (g_world->rank() == 0 && error.empty()) {
      ::umount2(dir.c_str(), MNT_DETACH);
      std::error_code ignored;
      fs::remove(dir, ignored);
    }
  }
  // Rank 0 fills the disk, leaving about `leave` bytes free; every rank returns after.
  void fill(size_t leave = 0) const {
    if (g_world->rank() == 0) {
      std::FILE* f = std::fopen((dir + "/filler").c_str(), "a");
      std::setvbuf(f, nullptr, _IONBF, 0);
      std::vector<char> page(4096, 'x');
      while (std::fwrite(page.data(), 1, page.size(), f) == page.size()) {
      }
      std::fclose(f);
      if (leave > 0) fs::resize_file(dir + "/filler", fs::file_size(dir + "/filler") - leave);
    }
    g_world->barrier();
  }
};

#define SKIP_WITHOUT(tmpfs) \
  if (!(tmpfs).error.empty()) GTEST_SKIP() << (tmpfs).error

std::string config(const std::string& monitors, int stage = 1) {
  return R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": )" +
         std::to_string(stage) + "}" + monitors + "}";
}
std::string csv_monitor(const std::string& path) {
  return R"(, "csv_monitor": {"enabled": true, "output_path": ")" + path + R"(", "job_name": "run"})";
}
std::string tensorboard(const std::string& path) {
  return R"(, "tensorboard": {"enabled": true, "output_path": ")" + path + R"(", "job_name": "run"})";
}

torch::nn::Linear make_model() {
  torch::manual_seed(0);
  return torch::nn::Linear(64, 64);
}

zero::Engine make_engine(torch::nn::Linear& model, const std::string& json) {
  zero::InitOptions init;
  init.group = g_world;
  return zero::initialize(zero::Config::from_json(json), model, init);
}

void train_step(zero::Engine& engine, torch::nn::Linear& model, int step) {
  torch::manual_seed(100 + step + 1000 * g_world->rank());
  at::Tensor x = torch::randn({2, 64});
  engine.backward(torch::mse_loss(model(x), torch::zeros({2, 64})));
  engine.step();
}

std::map<std::string, at::Tensor> weights(torch::nn::Linear& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// A checkpoint in `dir`, saved before the disk fills; returns its weights.
std::map<std::string, at::Tensor> save_earlier_checkpoint(const std::string& dir) {
  torch::nn::Linear model = make_model();
  auto engine = make_engine(model, config(""));
  for (int s = 0; s < 2; ++s) train_step(engine, model, s);
  engine.save_checkpoint(dir);
  return weights(model);
}

// The earlier checkpoint loads into a fresh engine with exactly its weights.
void expect_earlier_checkpoint_intact(const std::string& dir, const std::map<std::string, at::Tensor>& saved) {
  std::ifstream latest(dir + "/latest");
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "global_step2") << "latest moved";
  EXPECT_FALSE(fs::exists(dir + "/.saving")) << "a failed save left its staging folder";
  torch::manual_seed(7);
  torch::nn::Linear model(64, 64);  // other initial weights
  auto engine = make_engine(model, config(""));
  engine.load_checkpoint(dir);
  const auto loaded = weights(model);
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [name, t] : saved) EXPECT_TRUE(torch::equal(t, loaded.at(name))) << name << " differs";
}

// How a run on the full disk ended on this rank.
struct Ended {
  std::string error;  // empty: it did not fail
  double seconds = 0;  // from `from` to the error
  int step = -1;       // the step number its message names
};

// Runs `body` until it throws `E`.
template <class E, class F>
Ended until_error(Clock::time_point from, F body) {
  Ended out;
  try {
    body();
  } catch (const E& e) {
    out.error = e.what();
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - from).count();
  std::smatch m;
  if (std::regex_search(out.error, m, std::regex("every rank stops at step (\\d+)"))) out.step = std::stoi(m[1]);
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The checks every case shares: this rank failed in time, naming the writer,
// a file under `under` and ENOSPC's text; every rank stopped at the same step.
void expect_failed(const Ended& e, const std::string& writer, const std::string& under, bool at_a_step = true) {
  ASSERT_FALSE(e.error.empty()) << "the run did not fail";
  std::printf("ended %.2f s after the disk filled with: %s\n", e.seconds, e.error.c_str());
  EXPECT_NE(e.error.find(writer), std::string::npos) << e.error;
  if (!under.empty()) EXPECT_NE(e.error.find(under + "/"), std::string::npos) << "names no file under " << under << ": " << e.error;
  EXPECT_NE(lower(e.error).find(lower(kNoSpace)), std::string::npos) << e.error;
  EXPECT_LT(e.seconds, kBoundS) << e.error;
  if (!at_a_step) return;
  at::Tensor step = torch::tensor({static_cast<double>(e.step)}, at::kDouble);
  at::Tensor all = torch::empty({g_world->size()}, at::kDouble);
  g_world->all_gather(all, step);
  EXPECT_GE(e.step, 1) << e.error;
  EXPECT_EQ(all.min().item<double>(), all.max().item<double>()) << "the ranks stopped at different steps";
}

// A monitor on the disk: full from the start, or filled after a few steps.
void monitor_case(const std::string& writer, bool full_at_start) {
  Tmpfs disk(4);
  SKIP_WITHOUT(disk);
  const auto saved = save_earlier_checkpoint(disk.dir + "/ckpt");
  const std::string out = disk.dir + "/monitors";
  if (full_at_start) disk.fill();
  torch::nn::Linear model = make_model();
  const std::string monitors = writer == "csv_monitor" ? csv_monitor(out) : tensorboard(out);
  auto from = Clock::now();
  Ended e = until_error<zero::EngineError>(from, [&] {
    auto engine = make_engine(model, config(monitors));
    int step = 0;
    if (!full_at_start) {
      for (; step < 3; ++step) train_step(engine, model, step);
      engine.save_checkpoint(disk.dir + "/ckpt_mid");  // flushes the monitors: rows are on disk
      if (g_world->rank() == 0) EXPECT_FALSE(fs::is_empty(out + "/run"));
      disk.fill();
      from = Clock::now();
    }
    // A full page of a file still takes appends: the writer fails once it needs a new one.
    for (; step < 3000; ++step) train_step(engine, model, step);
  });
  e.seconds = std::chrono::duration<double>(Clock::now() - from).count();
  // A tensorboard file on a disk full from the start fails at initialize.
  expect_failed(e, writer + ": writing " + out + "/run/", out, !(writer == "tensorboard" && full_at_start));
  expect_earlier_checkpoint_intact(disk.dir + "/ckpt", saved);
}

TEST(CsvMonitor, FullFromTheStart) { monitor_case("csv_monitor", true); }
TEST(CsvMonitor, FillsMidRun) { monitor_case("csv_monitor", false); }

// The failed write found by the flush a checkpoint starts with: every rank
// raises it before saving anything, and the earlier checkpoint stays.
TEST(CsvMonitor, FullAtACheckpoint) {
  Tmpfs disk(4);
  SKIP_WITHOUT(disk);
  const auto saved = save_earlier_checkpoint(disk.dir + "/ckpt");
  const std::string out = disk.dir + "/monitors";
  disk.fill();
  torch::nn::Linear model = make_model();
  auto engine = make_engine(model, config(csv_monitor(out)));
  train_step(engine, model, 0);  // its rows reach the writer with the checkpoint's flush
  Ended e = until_error<zero::EngineError>(Clock::now(), [&] { engine.save_checkpoint(disk.dir + "/ckpt"); });
  expect_failed(e, "csv_monitor: writing " + out + "/run/", out, /*at_a_step=*/false);
  EXPECT_NE(e.error.find("the checkpoint was not saved"), std::string::npos) << e.error;
  expect_earlier_checkpoint_intact(disk.dir + "/ckpt", saved);
}

TEST(Tensorboard, FullFromTheStart) {
  if (!zero::monitor::tensorboard_available()) GTEST_SKIP() << "this build has no tensorboard writer (no protobuf)";
  monitor_case("tensorboard", true);
}
TEST(Tensorboard, FillsMidRun) {
  if (!zero::monitor::tensorboard_available()) GTEST_SKIP() << "this build has no tensorboard writer (no protobuf)";
  monitor_case("tensorboard", false);
}

// The log (the progress line here; the comms logger's lines and the
// progress report of loads go the same way) on a full disk: rank 0's stdout
// made /dev/full. Every rank stops at the progress line after the failed one.
TEST(Log, StdoutOnAFullDisk) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  torch::nn::Linear model = make_model();
  auto engine = make_engine(model, R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})");
  std::fflush(stdout);
  const int kept = ::dup(1);
  if (g_world->rank() == 0) {
    const int full = ::open("/dev/full", O_WRONLY);
    ::dup2(full, 1);
    ::close(full);
  }
  const Ended e = until_error<zero::EngineError>(Clock::now(), [&] {
    for (int s = 0; s < 100; ++s) train_step(engine, model, s);
  });
  std::fflush(stdout);
  std::clearerr(stdout);
  ::dup2(kept, 1);
  ::close(kept);
  expect_failed(e, "log: writing stdout failed", "", /*at_a_step=*/true);
  EXPECT_EQ(e.step, 2) << "the line of step 1 failed: the next line stops every rank";
}

// A save on the disk: full from the start, or with room for a part of one
// checkpoint (the disk fills while the rank files are written).
void checkpoint_case(size_t leave) {
  Tmpfs disk(4);
  SKIP_WITHOUT(disk);
  const std::string dir = disk.dir + "/ckpt";
  const auto saved = save_earlier_checkpoint(dir);
  torch::nn::Linear model = make_model();
  auto engine = make_engine(model, config(""));
  for (int s = 0; s < 4; ++s) train_step(engine, model, s);
  disk.fill(leave);
  const Ended e = until_error<zero::CheckpointError>(Clock::now(), [&] { engine.save_checkpoint(dir); });
  expect_failed(e, ".safetensors", dir, /*at_a_step=*/false);
  EXPECT_FALSE(fs::exists(dir + "/global_step4"));
  g_world->barrier();
  expect_earlier_checkpoint_intact(dir, saved);
}

TEST(Checkpoint, FullFromTheStart) { checkpoint_case(0); }
// A rank file holds about 25 kB here: 16 kB free fills during the files' writes.
TEST(Checkpoint, FillsMidRun) { checkpoint_case(16 << 10); }

// Consolidation on the disk (ckpt::consolidate, which zero-ckpt consolidate
// runs, on rank 0): full from the start, or with room for half the file.
// It fails naming the output, leaves nothing at it or beside it, and the
// checkpoint it read stays whole.
void consolidate_case(size_t leave) {
  Tmpfs disk(4);
  SKIP_WITHOUT(disk);
  const std::string dir = disk.dir + "/ckpt", folder = disk.dir + "/consolidated";
  const auto saved = save_earlier_checkpoint(dir);
  if (g_world->rank() == 0) fs::create_directories(folder);
  disk.fill(leave);
  if (g_world->rank() == 0) {
    const std::string out = folder + "/model.safetensors";
    const Ended e = until_error<zero::CheckpointError>(Clock::now(), [&] { zero::ckpt::consolidate(dir, "global_step2", out); });
    expect_failed(e, out, folder, /*at_a_step=*/false);
    EXPECT_TRUE(fs::is_empty(folder)) << "a failed consolidation left a file in " << folder;
  }
  g_world->barrier();
  expect_earlier_checkpoint_intact(dir, saved);
}

// The Linear's weights consolidate to 16.6 kB: 8 kB free fills half-way.
TEST(Consolidation, FullFromTheStart) { consolidate_case(0); }
TEST(Consolidation, FillsMidWrite) { consolidate_case(8 << 10); }

// save_16bit_model (rank 0 writes the gathered weights): every rank raises
// rank 0's error, naming the file, and the earlier checkpoint stays.
TEST(Consolidation, Save16bitModelFillsMidWrite) {
  Tmpfs disk(4);
  SKIP_WITHOUT(disk);
  const std::string dir = disk.dir + "/ckpt", folder = disk.dir + "/weights";
  const auto saved = save_earlier_checkpoint(dir);
  torch::nn::Linear model = make_model();
  auto engine = make_engine(model, config(""));
  train_step(engine, model, 0);
  disk.fill(8 << 10);
  const Ended e = until_error<zero::CheckpointError>(Clock::now(), [&] { engine.save_16bit_model(folder); });
  expect_failed(e, "save_16bit_model: ", folder, /*at_a_step=*/false);
  EXPECT_NE(e.error.find(folder + "/model.safetensors"), std::string::npos) << e.error;
  if (g_world->rank() == 0) EXPECT_FALSE(fs::exists(folder + "/model.safetensors"));
  g_world->barrier();
  expect_earlier_checkpoint_intact(dir, saved);
}

}  // namespace
