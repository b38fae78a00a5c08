#pragma once
// The main() of gtest programs that run on every rank of a job started by
// zero-run (zero_add_rank_test): the world group, joined before the tests
// and left together after them.
#include <memory>

#include "zero/comm.h"

extern std::shared_ptr<zero::comm::ProcessGroup> g_world;

// This rank's own group of one (made once, collectively, on first use):
// for reference runs of one process inside a multi-rank test.
inline std::shared_ptr<zero::comm::ProcessGroup> alone() {
  static std::shared_ptr<zero::comm::ProcessGroup> mine = [] {
    std::shared_ptr<zero::comm::ProcessGroup> kept;
    for (int r = 0; r < g_world->size(); ++r) {
      if (auto g = g_world->new_group({r})) kept = g;
    }
    return kept;
  }();
  return mine;
}
