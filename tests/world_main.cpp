#include "world_main.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "zero/error.h"

std::shared_ptr<zero::comm::ProcessGroup> g_world;

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    g_world = zero::comm::init_process_group();
  } catch (const zero::Error& e) {  // a bad launch environment: said as a program says it, not terminate()
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  const int rc = RUN_ALL_TESTS();
  g_world->barrier();  // no rank leaves while another still runs collectives
  g_world.reset();
  return rc;
}
