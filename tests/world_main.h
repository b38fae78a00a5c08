#pragma once
// The main() of gtest programs that run on every rank of a job started by
// zero-run (zero_add_rank_test): the world group, joined before the tests
// and left together after them.
#include <memory>

#include "zero/comm.h"

extern std::shared_ptr<zero::comm::ProcessGroup> g_world;
