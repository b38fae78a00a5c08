// launcher_probe: a rank for test_launcher. Its arguments are a little
// script, run in order; "@R" before a command runs it on rank R only (the
// rank is $RANK). Commands:
//
//   env                 print "env NAME=value" (or "env NAME unset") for the launch variables
//   args ...            print "arg <a>" for every remaining argument, then stop
//   print T / eprint T  print line T to stdout / stderr
//   partial T / epartial T   write T without a newline to stdout / stderr
//   lines N / elines N  write N lines "line <rank> <i> <x...>" in small pieces
//   exit C              exit with code C
//   kill S              die by signal S (default disposition, then raise)
//   sleep S             sleep S seconds (returns early after a caught signal, see on-signal)
//   on-signal DIR       on SIGTERM/SIGINT append its name to DIR/signal.<rank>,
//                       then exit 0 after 300 ms (a second delivery would be recorded)
//   ignore-term         ignore SIGTERM and SIGINT
//   ready DIR           create DIR/ready.<rank>
//   wait-file PATH      wait (up to 10 s) until PATH exists
//   grandchild DIR      fork a process that, on SIGTERM, creates DIR/grandchild.<rank>;
//                       it creates DIR/gcready.<rank> when its handler is in place
//   daemon S            fork a process that keeps stdout/stderr open for S seconds
//   fds                 print "fds" and the open descriptors above 2 (or "fds none")
//   heap                print "heap <name>": the malloc this process runs with (core/heap.h)
//   blas                print "blas <name>": the kernels OpenBLAS picks when this
//                       process loads it, "blas none" without OpenBLAS (core/blas_kernels.h)
//   bind-master         bind a TCP socket to MASTER_ADDR:MASTER_PORT with SO_REUSEADDR and
//                       listen, as a store server does; print "bind ok" or the error
//   take-master         the same without SO_REUSEADDR, as another program would;
//                       print "take ok" or the error
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/blas_kernels.h"
#include "core/heap.h"

namespace {

int g_rank = 0;
char g_signal_file[4096];
char g_grandchild_file[4096];
volatile sig_atomic_t g_signalled = 0;

void write_fd(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void touch(const std::string& path, const std::string& content = "") {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  write_fd(fd, content);
  ::close(fd);
}

extern "C" void record_signal(int sig) {
  int fd = ::open(g_signal_file, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    const char* name = sig == SIGTERM ? "SIGTERM\n" : sig == SIGINT ? "SIGINT\n" : "OTHER\n";
    ssize_t ignored = ::write(fd, name, std::strlen(name));
    (void)ignored;
    ::close(fd);
  }
  g_signalled = 1;
}

extern "C" void grandchild_term(int) {
  int fd = ::open(g_grandchild_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) ::close(fd);
  ::_exit(0);
}

void sleep_for(double seconds) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  const auto end = start + duration_cast<steady_clock::duration>(duration<double>(seconds));
  steady_clock::time_point signalled_at{};
  while (steady_clock::now() < end) {
    if (g_signalled) {
      if (signalled_at == steady_clock::time_point{}) signalled_at = steady_clock::now();
      if (steady_clock::now() - signalled_at > milliseconds(300)) std::exit(0);
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

void write_lines(int fd, int n) {
  // Each line goes out in three write()s, so a launcher that forwarded raw
  // chunks would interleave pieces of lines from different ranks.
  for (int i = 0; i < n; ++i) {
    std::string head = "line " + std::to_string(g_rank) + " ";
    std::string middle = std::to_string(i) + " ";
    std::string tail = std::string(static_cast<size_t>(1 + (i * 7 + g_rank) % 97), 'x') + "\n";
    write_fd(fd, head);
    if (i % 3 == 0) sched_yield();
    write_fd(fd, middle);
    write_fd(fd, tail);
  }
}

// Binds MASTER_ADDR:MASTER_PORT and listens, printing "<what> ok" or
// "<what> failed: <reason>". `reuse`: with SO_REUSEADDR, as a rendezvous
// store server does (c10d, libuv); without it, as any other program would.
void bind_master(bool reuse, const char* what) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (addr == nullptr || port == nullptr) {
    std::printf("%s failed: MASTER_ADDR/MASTER_PORT unset\n", what);
    return;
  }
  addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(addr, port, &hints, &res) != 0 || res == nullptr) {
    std::printf("%s failed: cannot resolve %s\n", what, addr);
    return;
  }
  int s = ::socket(res->ai_family, SOCK_STREAM, 0);
  const int on = 1;
  if (s >= 0 && (!reuse || ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0) &&
      ::bind(s, res->ai_addr, res->ai_addrlen) == 0 && ::listen(s, 1) == 0) {
    std::printf("%s ok\n", what);
  } else {
    std::printf("%s failed: %s\n", what, std::strerror(errno));
  }
  if (s >= 0) ::close(s);
  ::freeaddrinfo(res);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (const char* r = std::getenv("RANK")) g_rank = std::atoi(r);
  const std::string rank = std::to_string(g_rank);

  for (int i = 1; i < argc; ++i) {
    std::string cmd = argv[i];
    bool here = true;
    if (cmd.size() > 1 && cmd[0] == '@') {
      here = std::atoi(cmd.c_str() + 1) == g_rank;
      if (++i >= argc) break;
      cmd = argv[i];
    }
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launcher_probe: '%s' needs an argument\n", cmd.c_str());
        std::exit(100);
      }
      return argv[++i];
    };

    if (cmd == "env") {
      if (!here) continue;
      static const char* const kNames[] = {
          "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
          "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
          "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "ZERO_TEST_INHERITED",
          "LD_PRELOAD", "TCMALLOC_RELEASE_RATE", "MALLOC_CONF", "OPENBLAS_CORETYPE", "ZERO_LAUNCHER"};
      for (const char* name : kNames) {
        const char* v = std::getenv(name);
        if (v) std::printf("env %s=%s\n", name, v);
        else std::printf("env %s unset\n", name);
      }
    } else if (cmd == "blas") {
      if (!here) continue;
      const std::string core = zero::blas::probe_openblas_core();
      std::printf("blas %s\n", core.empty() ? "none" : core.c_str());
    } else if (cmd == "heap") {
      if (here) std::printf("heap %s\n", zero::heap::allocator_name().c_str());
    } else if (cmd == "args") {
      if (!here) break;
      for (++i; i < argc; ++i) std::printf("arg %s\n", argv[i]);
    } else if (cmd == "print" || cmd == "eprint" || cmd == "partial" || cmd == "epartial") {
      std::string text = arg();
      if (!here) continue;
      std::fflush(stdout);
      if (cmd == "print" || cmd == "eprint") text += "\n";
      write_fd(cmd[0] == 'e' ? STDERR_FILENO : STDOUT_FILENO, text);
    } else if (cmd == "lines" || cmd == "elines") {
      int n = std::atoi(arg().c_str());
      if (here) write_lines(cmd[0] == 'e' ? STDERR_FILENO : STDOUT_FILENO, n);
    } else if (cmd == "exit") {
      int code = std::atoi(arg().c_str());
      if (here) {
        std::fflush(stdout);
        ::_exit(code);
      }
    } else if (cmd == "kill") {
      int sig = std::atoi(arg().c_str());
      if (here) {
        std::fflush(stdout);
        ::signal(sig, SIG_DFL);
        ::raise(sig);
        ::_exit(99);
      }
    } else if (cmd == "sleep") {
      double s = std::atof(arg().c_str());
      if (here) sleep_for(s);
    } else if (cmd == "on-signal") {
      std::string dir = arg();
      if (!here) continue;
      std::snprintf(g_signal_file, sizeof g_signal_file, "%s/signal.%s", dir.c_str(), rank.c_str());
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_handler = record_signal;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGTERM, &sa, nullptr);
      ::sigaction(SIGINT, &sa, nullptr);
    } else if (cmd == "ignore-term") {
      if (!here) continue;
      ::signal(SIGTERM, SIG_IGN);
      ::signal(SIGINT, SIG_IGN);
    } else if (cmd == "ready") {
      std::string dir = arg();
      if (here) touch(dir + "/ready." + rank);
    } else if (cmd == "wait-file") {
      std::string path = arg();
      if (!here) continue;
      for (int k = 0; k < 1000 && ::access(path.c_str(), F_OK) != 0; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } else if (cmd == "grandchild") {
      std::string dir = arg();
      if (!here) continue;
      std::snprintf(g_grandchild_file, sizeof g_grandchild_file, "%s/grandchild.%s", dir.c_str(), rank.c_str());
      std::fflush(stdout);
      if (::fork() == 0) {
        ::signal(SIGTERM, grandchild_term);
        touch(dir + "/gcready." + rank);
        for (int k = 0; k < 3000; ++k) ::usleep(10000);  // 30 s at most
        ::_exit(0);
      }
    } else if (cmd == "daemon") {
      double s = std::atof(arg().c_str());
      if (!here) continue;
      std::fflush(stdout);
      if (::fork() == 0) {
        ::usleep(static_cast<useconds_t>(s * 1e6));
        ::_exit(0);
      }
    } else if (cmd == "fds") {
      if (!here) continue;
      std::string list;
      for (int fd = 3; fd < 1024; ++fd) {
        if (::fcntl(fd, F_GETFD) != -1) list += " " + std::to_string(fd);
      }
      std::printf("fds%s\n", list.empty() ? " none" : list.c_str());
    } else if (cmd == "bind-master") {
      if (here) bind_master(true, "bind");
    } else if (cmd == "take-master") {
      if (here) bind_master(false, "take");
    } else {
      std::fprintf(stderr, "launcher_probe: unknown command '%s'\n", cmd.c_str());
      return 100;
    }
  }
  return 0;
}
