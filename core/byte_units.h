#pragma once
// Bytes for people, one way everywhere: decimal units ("1.50 GB",
// "12.34 MB", "0.50 kB"), a unit per value or one for a whole column.
// DeepSpeed's comms logger prints 1024-based sizes (its convert_size);
// zero's comms summary matches it with deepspeed_size.
#include <cstdint>
#include <string>

namespace zero::core {

struct ByteUnit {
  const char* name;  // "GB", "MB" or "kB"
  double bytes;      // 1e9, 1e6 or 1e3
};

// GB from 1e9 bytes on, MB from 1e6, kB below.
ByteUnit byte_unit_for(double bytes);
// "%.2f" of `bytes` in `unit`, without the unit's name (a table's column).
std::string in_unit(double bytes, ByteUnit unit);
// In its own unit: "1.50 GB".
std::string human_bytes(double bytes);
// 1024-based, DeepSpeed's units and format: "1.50 MB" for 1.5 * 2^20 bytes.
std::string deepspeed_size(double bytes);

}  // namespace zero::core
