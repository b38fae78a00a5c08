// The record of a failed write (core/write_failure.h, Note [Failed writes]).
#include "core/write_failure.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "zero/log.h"

namespace zero::write_failure {
namespace {

std::mutex g_mu;
std::string g_first;  // guarded by g_mu
std::atomic<bool> g_pending{false};

}  // namespace

std::string report(const std::string& writer, const std::string& path, int error_number) {
  const std::string text = writer + ": writing " + path + " failed: " + std::strerror(error_number);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_pending.load()) return text;
    g_first = text;
    g_pending.store(true);
  }
  // Outside the lock: a failing log reports through here (core/log.cpp).
  log::error("write", text + "; training stops at the next step boundary, on every rank");
  return text;
}

bool pending() { return g_pending.load(std::memory_order_relaxed); }

std::string take() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_pending.store(false);
  std::string first;
  first.swap(g_first);
  return first;
}

bool is_disk_error(int error_number) {
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EIO:
    case EROFS: return true;
    default: return false;
  }
}

}  // namespace zero::write_failure
