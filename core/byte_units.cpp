#include "core/byte_units.h"

#include <cstdio>

namespace zero::core {

ByteUnit byte_unit_for(double bytes) {
  if (bytes >= 1e9) return {"GB", 1e9};
  if (bytes >= 1e6) return {"MB", 1e6};
  return {"kB", 1e3};
}

std::string in_unit(double bytes, ByteUnit unit) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes / unit.bytes);
  return text;
}

std::string human_bytes(double bytes) {
  const ByteUnit unit = byte_unit_for(bytes);
  return in_unit(bytes, unit) + " " + unit.name;
}

std::string deepspeed_size(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f %s", bytes, units[u]);
  return text;
}

}  // namespace zero::core
