// Fault injection for a shared checkpoint folder: one job saves and loads
// in a loop while another job keeps saving into the same folder
// (tests/ckpt/concurrent_saver.sh starts both).
//   ckpt_concurrent_saver save DIR STOP_FILE   saves every step until STOP_FILE exists
//   ckpt_concurrent_saver loop DIR N           N rounds of: a step, a save, a load of `latest`
//   ckpt_concurrent_saver audit DIR -          afterwards: nothing saved was lost or left broken
// Every checkpoint either job saves carries, in its client_state, the sum of
// the weights it holds (an independent record of what was saved). A load
// must be whole (the loaded weights sum to what its saver recorded) and
// agreed (every rank loaded the same tag, or every rank got the error);
// loads and saves that fail with a CheckpointError naming the cause are
// counted, not failures. Anything else (a crash, a hang, ranks at different
// steps, weights that are not what was saved) is. Before Note [Concurrent
// saves] in engine/checkpoint_save.cpp, `latest` came to name a tag without
// a manifest, and tags without their rank files were moved into place.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "small_job.h"
#include "zero/zero.h"

namespace {

using small_job::make_engine;
using small_job::make_model;
using small_job::step;

// The sum of every weight the engine holds, in double: the record a load is checked against.
double weight_sum(zero::Engine& engine) {
  double sum = 0;
  for (const auto& [name, t] : engine.gathered_state_dict()) sum += t.to(at::kDouble).sum().item<double>();
  return sum;
}

std::string client_state(zero::Engine& engine) {
  return nlohmann::json{{"sum", weight_sum(engine)}, {"step", engine.global_steps()}}.dump();
}

int fail(zero::Engine& engine, const std::string& why) {
  std::cout << "FAIL: rank " << engine.group().rank() << ": " << why << std::endl;
  return 1;
}

// Every tag folder the two jobs left is a whole checkpoint (its manifest,
// and each file it lists with the listed size and checksum), and `latest`
// names one: a save that failed took nothing with it.
int audit(const std::string& dir) {
  namespace fs = std::filesystem;
  int tags = 0, broken = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string tag = entry.path().filename().string();
    if (!entry.is_directory() || tag[0] == '.') continue;
    ++tags;
    try {
      const zero::ckpt::Manifest m = zero::ckpt::read_manifest(dir, tag);
      for (const auto& f : m.files) {
        const zero::ckpt::FileInfo on_disk = zero::ckpt::hash_file(zero::ckpt::tag_dir(dir, tag) + "/" + f.name);
        if (on_disk.bytes != f.bytes || on_disk.xxh3 != f.xxh3)
          throw zero::CheckpointError(f.name + " is not the file its manifest lists");
      }
    } catch (const zero::CheckpointError& e) {
      if (++broken <= 5) std::cout << "FAIL: tag " << tag << " is broken: " << std::string(e.what()).substr(0, 300) << std::endl;
    }
  }
  try {
    zero::ckpt::read_manifest(dir, zero::ckpt::read_latest(dir));
  } catch (const zero::CheckpointError& e) {
    std::cout << "FAIL: latest names no whole checkpoint: " << e.what() << std::endl;
    return 1;
  }
  std::cout << "audit: " << tags << " tags, " << broken << " broken" << std::endl;
  return broken == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: ckpt_concurrent_saver save DIR STOP_FILE | loop DIR N | audit DIR -\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  if (mode == "audit") return audit(dir);
  auto model = make_model();
  auto engine = make_engine(model);
  zero::comm::ProcessGroup& pg = engine.group();

  if (mode == "save") {
    const std::string stop = argv[3];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    int saved = 0, refused = 0;
    while (!std::filesystem::exists(stop) && std::chrono::steady_clock::now() < deadline) {
      step(engine, model);
      try {
        engine.save_checkpoint(dir, "", client_state(engine));
        ++saved;
      } catch (const zero::CheckpointError& e) {
        ++refused;  // the other job's save took the folder from under this one
        if (refused <= 3) std::cout << "saver: a save failed: " << e.what() << std::endl;
      }
    }
    std::cout << "saver: " << saved << " saves, " << refused << " failed" << std::endl;
    return saved > 0 ? 0 : 1;
  }

  if (mode != "loop") return 2;
  const int rounds = std::stoi(argv[3]);
  int whole = 0, refused_loads = 0, refused_saves = 0;
  std::set<int64_t> steps_seen;
  for (int round = 0; round < rounds; ++round) {
    step(engine, model);
    try {
      engine.save_checkpoint(dir, "", client_state(engine));
    } catch (const zero::CheckpointError& e) {
      ++refused_saves;
      if (refused_saves <= 3 && pg.rank() == 0) std::cout << "loop: a save failed: " << e.what() << std::endl;
    }
    // Load whatever `latest` names now, possibly the other job's.
    std::string client, error;
    for (int attempt = 0; attempt < 20; ++attempt) {  // a failed load leaves the engine unusable until one succeeds
      try {
        client = engine.load_checkpoint(dir);
        error.clear();
        break;
      } catch (const zero::CheckpointError& e) {
        error = e.what();
        ++refused_loads;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the other job moves on meanwhile
        if (refused_loads <= 3 && pg.rank() == 0) std::cout << "loop: a load failed: " << error << std::endl;
      }
    }
    // Agreed: every rank succeeded, or every rank failed.
    at::Tensor mine = torch::tensor({error.empty() ? 1L : 0L, engine.global_steps()}, at::kLong);
    at::Tensor all = torch::empty({2 * pg.size()}, at::kLong);
    pg.all_gather(all, mine);
    for (int r = 1; r < pg.size(); ++r) {
      if (all[2 * r].item<int64_t>() != all[0].item<int64_t>())
        return fail(engine, "round " + std::to_string(round) + ": rank 0 and rank " + std::to_string(r) +
                                " disagree on whether the load succeeded (" + error + ")");
      if (all[2 * r + 1].item<int64_t>() != all[1].item<int64_t>())
        return fail(engine, "round " + std::to_string(round) + ": rank 0 loaded step " + std::to_string(all[1].item<int64_t>()) +
                                ", rank " + std::to_string(r) + " step " + std::to_string(all[2 * r + 1].item<int64_t>()));
    }
    if (!error.empty()) return fail(engine, "20 loads in a row failed, the last: " + error);
    // Whole: the weights are those the saver recorded for that step.
    const nlohmann::json record = nlohmann::json::parse(client);
    const double sum = weight_sum(engine);
    if (record.at("step").get<int64_t>() != engine.global_steps() || record.at("sum").get<double>() != sum)
      return fail(engine, "round " + std::to_string(round) + ": loaded step " + std::to_string(engine.global_steps()) +
                              " with weights summing to " + std::to_string(sum) + ", its saver recorded step " +
                              record.at("step").dump() + " summing to " + record.at("sum").dump());
    ++whole;
    steps_seen.insert(engine.global_steps());
  }
  if (pg.rank() == 0)
    std::cout << "loop: " << whole << " loads whole and agreed by " << pg.size() << " ranks (" << steps_seen.size()
              << " different steps), " << refused_loads << " loads and " << refused_saves
              << " saves refused with a CheckpointError" << std::endl;
  return 0;
}
