// core/byte_units.h: the one way bytes are written for people, against the
// formulas (decimal units; DeepSpeed's 1024-based convert_size).
#include <gtest/gtest.h>

#include <cmath>

#include "core/byte_units.h"

namespace {

using namespace zero::core;

TEST(ByteUnits, DecimalUnitByMagnitude) {
  EXPECT_EQ(human_bytes(1.5e9), "1.50 GB");
  EXPECT_EQ(human_bytes(999999999.0), "1000.00 MB");  // below 1e9 stays in MB
  EXPECT_EQ(human_bytes(170.4e6), "170.40 MB");
  EXPECT_EQ(human_bytes(512), "0.51 kB");
  EXPECT_EQ(human_bytes(0), "0.00 kB");
  EXPECT_STREQ(byte_unit_for(2e12).name, "GB");
}

TEST(ByteUnits, OneUnitForAColumn) {
  const ByteUnit unit = byte_unit_for(3e9);  // the column's largest value
  EXPECT_EQ(in_unit(3e9, unit), "3.00");
  EXPECT_EQ(in_unit(25e6, unit), "0.03");
}

TEST(ByteUnits, DeepSpeedSizeIs1024Based) {
  EXPECT_EQ(deepspeed_size(1.5 * std::pow(2.0, 20)), "1.50 MB");
  EXPECT_EQ(deepspeed_size(1023), "1023.00 B");
  EXPECT_EQ(deepspeed_size(std::pow(2.0, 30)), "1.00 GB");
  EXPECT_EQ(deepspeed_size(std::pow(2.0, 50)), "1024.00 TB");  // TB is its largest unit
}

}  // namespace
