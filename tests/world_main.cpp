#include "world_main.h"

#include <gtest/gtest.h>

std::shared_ptr<zero::comm::ProcessGroup> g_world;

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = zero::comm::init_process_group();
  const int rc = RUN_ALL_TESTS();
  g_world->barrier();  // no rank leaves while another still runs collectives
  g_world.reset();
  return rc;
}
