// An interrupted save: `save DIR` (2 ranks) saves tag "first", then rank 1
// is killed in the middle of saving "second" (ZERO_FAULT). `resume DIR`
// then finds `latest` still naming "first", no "second", and loads it.
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "small_job.h"
#include "zero/zero.h"

namespace {

using small_job::make_engine;
using small_job::make_model;

void train(zero::Engine& engine, torch::nn::Sequential& model, int steps) {
  for (int i = 0; i < steps; ++i) small_job::step(engine, model);
}

int fail(const std::string& why) {
  std::cerr << "ckpt_killed_save: " << why << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: ckpt_killed_save save|resume DIR");
  const std::string mode = argv[1], dir = argv[2];
  auto model = make_model();
  auto engine = make_engine(model);
  if (mode == "save") {
    if (engine.group().rank() == 0) std::filesystem::remove_all(dir);
    engine.group().barrier();
    train(engine, model, 2);
    engine.save_checkpoint(dir, "first");
    setenv("ZERO_FAULT", "save.written:1", 1);
    train(engine, model, 2);
    engine.save_checkpoint(dir, "second");  // rank 1 dies in here
    return fail("the save of \"second\" returned");
  }
  std::string latest;
  std::ifstream(dir + "/latest") >> latest;
  if (latest != "first") return fail("latest names \"" + latest + "\", not \"first\"");
  if (std::filesystem::exists(dir + "/second")) return fail(dir + "/second exists after an interrupted save");
  engine.load_checkpoint(dir);
  if (engine.global_steps() != 2) return fail("loaded step " + std::to_string(engine.global_steps()));
  train(engine, model, 1);  // and training goes on
  engine.save_checkpoint(dir, "second");  // a new save of the same tag completes
  std::ifstream(dir + "/latest") >> latest;
  if (engine.group().rank() == 0) std::cout << "resumed from \"first\" after the interrupted save\n";
  return 0;
}
