// What a rank knows of its node: the node's identity (Note [One node]) and
// whether a process on it is alive.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "comm/internal.h"

namespace zero::comm {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_of(const char* path) {
  char link[128] = {0};
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  return n > 0 ? std::string(link, size_t(n)) : "";
}

}  // namespace

bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::string stat = read_first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Note [One node]: ranks share a node when they share a kernel (its boot
// id), a PID namespace (process_alive above signals peers by PID) and a
// network namespace. The last is what makes tools/netns-cluster.sh's
// emulated nodes separate nodes: their ranks could map one segment, but
// then nothing would cross the emulated link. Separate network namespaces
// on one kernel are otherwise containers, which mostly have their own
// /dev/shm and PID namespace anyway. The same identity decides the
// shared-memory transport (shm.cpp) and ProcessGroup::node() (process_group.cpp),
// so a group of ranks on one node is a shared-memory group.
std::string node_identity() {
  return read_first_line("/proc/sys/kernel/random/boot_id") + "|" + namespace_of("/proc/self/ns/pid") + "|" +
         namespace_of("/proc/self/ns/net");
}

}  // namespace zero::comm
