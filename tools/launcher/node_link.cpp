// Note [Restarts across nodes] in node_link.h.
#include "node_link.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "relay.h"

namespace zero_run {
namespace {

using Clock = std::chrono::steady_clock;

// ZERO_COMM_TIMEOUT, as the ranks read it (default 300 s).
int timeout_seconds() {
  const char* v = std::getenv("ZERO_COMM_TIMEOUT");
  const long s = v ? std::strtol(v, nullptr, 10) : 0;
  return s > 0 ? static_cast<int>(s) : 300;
}

std::string after(const std::string& line, const std::string& word) {
  return line.size() > word.size() ? line.substr(word.size() + 1) : "";
}

}  // namespace

// How long a node waits for the others once its own ranks ended: their
// ranks end within a collective's timeout of a failure, then the grace
// period, whatever happened; twice that, so a slow save still fits.
int NodeLink::wait_s(double grace_s) { return 2 * timeout_seconds() + static_cast<int>(grace_s) + 10; }

NodeLink::NodeLink(const LaunchOptions& o, int master_port)
    : leader_(o.node_rank == 0), node_(o.node_rank), grace_s_(o.grace_s) {
  if (master_port >= 65535) throw std::runtime_error("--max-restarts across nodes needs --master-port below 65535");
  const int port = master_port + 1;
  const int timeout = timeout_seconds();
  const auto deadline = Clock::now() + std::chrono::seconds(timeout);
  const std::string where = o.master_addr + ":" + std::to_string(port);
  if (leader_) {
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (listener < 0 || ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 64) != 0) {
      const int e = errno;
      if (listener >= 0) ::close(listener);
      throw std::runtime_error("cannot listen on port " + std::to_string(port) + " (MASTER_PORT + 1) for the other " +
                               "nodes' zero-run: " + std::strerror(e));
    }
    while (static_cast<int>(peers_.size()) < o.nnodes - 1) {
      pollfd p{listener, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0) {
        ::close(listener);
        throw std::runtime_error(std::to_string(o.nnodes - 1 - static_cast<int>(peers_.size())) + " of the " +
                                 std::to_string(o.nnodes - 1) + " other nodes' zero-run did not connect to " + where +
                                 " within " + std::to_string(timeout) + " s (ZERO_COMM_TIMEOUT); start them with the "
                                 "same --nnodes, --master-addr, --master-port and --max-restarts");
      }
      Peer peer;
      peer.fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (peer.fd < 0) continue;
      const std::string hello = read_line(peer, timeout);
      if (hello.rfind("hello ", 0) != 0) {
        ::close(peer.fd);
        continue;
      }
      peer.node = std::atoi(after(hello, "hello").c_str());
      peers_.push_back(std::move(peer));
    }
    ::close(listener);
    return;
  }
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(o.master_addr.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    throw std::runtime_error("cannot resolve --master-addr " + o.master_addr);
  }
  Peer peer;
  peer.node = 0;
  for (;;) {
    peer.fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (peer.fd >= 0 && ::connect(peer.fd, found->ai_addr, found->ai_addrlen) == 0) break;
    const int e = errno;
    if (peer.fd >= 0) ::close(peer.fd);
    if (Clock::now() >= deadline) {
      ::freeaddrinfo(found);
      throw std::runtime_error("node 0's zero-run did not answer at " + where + " within " + std::to_string(timeout) +
                               " s (ZERO_COMM_TIMEOUT): " + std::strerror(e) + "; start it with --max-restarts too");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ::freeaddrinfo(found);
  send(peer.fd, "hello " + std::to_string(node_));
  peers_.push_back(std::move(peer));
}

NodeLink::~NodeLink() {
  for (Peer& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

std::vector<int> NodeLink::fds() const {
  std::vector<int> out;
  for (const Peer& p : peers_) {
    if (!p.lost) out.push_back(p.fd);
  }
  return out;
}

void NodeLink::send(int fd, const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the peer is gone: its EOF says so where it matters
    done += static_cast<size_t>(n);
  }
}

std::string NodeLink::read_line(Peer& peer, int timeout_s) {
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    const size_t end = peer.buffer.find('\n');
    if (end != std::string::npos) {
      std::string line = peer.buffer.substr(0, end);
      peer.buffer.erase(0, end + 1);
      return line;
    }
    if (peer.lost) return "";
    pollfd p{peer.fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int ready = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {  // a link that went down says nothing, not even EOF
      peer.lost = peer.silent = true;
      return "";
    }
    if (!receive(peer, true)) return "";
  }
}

bool NodeLink::receive(Peer& peer, bool block) {
  char chunk[512];
  ssize_t n;
  do {
    n = ::recv(peer.fd, chunk, sizeof chunk, block ? 0 : MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    peer.buffer.append(chunk, static_cast<size_t>(n));
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  peer.lost = true;  // EOF or a broken connection
  return false;
}

void NodeLink::stop_everyone(const std::string& why) {
  if (stop_sent_) return;
  stop_sent_ = true;
  for (const Peer& p : peers_) {
    if (!p.lost) send(p.fd, "stop " + why);
  }
}

bool NodeLink::read_from(int fd) {
  bool stop = false;
  for (Peer& peer : peers_) {
    if (peer.fd != fd || peer.lost) continue;
    receive(peer, false);  // poll said it is readable
    for (size_t end; (end = peer.buffer.find('\n')) != std::string::npos;) {
      const std::string line = peer.buffer.substr(0, end);
      peer.buffer.erase(0, end + 1);
      if (leader_ && line == "failed") {
        peer.failed = true;
        why_ = "a rank on node " + std::to_string(peer.node) + " failed";
        stop_everyone(why_);
        stop = true;
      } else if (leader_ && line.rfind("done ", 0) == 0) {
        record_done(peer, line);
      } else if (!leader_ && line.rfind("stop", 0) == 0) {
        why_ = after(line, "stop");
        stop = true;
      }
    }
    if (peer.lost) {
      why_ = leader_ ? "node " + std::to_string(peer.node) + "'s zero-run is gone (its link to node 0 closed)"
                     : "node 0's zero-run is gone (its link closed)";
      if (leader_) stop_everyone(why_);
      stop = true;
    }
  }
  return stop;
}

void NodeLink::record_done(Peer& peer, const std::string& line) {
  peer.done = true;
  const std::string rest = after(line, "done");
  peer.code = std::atoi(rest.c_str());
  peer.failed = peer.failed || rest.find(" 1") != std::string::npos;
}

void NodeLink::tell_failed() {
  if (leader_) {
    stop_everyone("a rank on node 0 failed");
  } else if (!peers_.empty() && !peers_[0].lost) {
    send(peers_[0].fd, "failed");
  }
}

NodeLink::Decision NodeLink::finish_attempt(int code, bool own_failure, int restart, int max_restarts) {
  if (!leader_) {
    Peer& zero = peers_.at(0);
    send(zero.fd, "done " + std::to_string(code) + (own_failure ? " 1" : " 0"));
    for (;;) {
      const std::string line = read_line(zero, wait_s(grace_s_));
      if (zero.lost) {
        say(zero.silent ? "node 0's zero-run said nothing for " + std::to_string(wait_s(grace_s_)) +
                              " s after this node's ranks ended (is its link down?); the job ends"
                        : "node 0's zero-run is gone (its link closed); the job ends");
        return {false, code != 0 ? code : kExitInternal};
      }
      if (line == "start") {
        stop_sent_ = false;
        return {true, 0};
      }
      if (line.rfind("end ", 0) == 0) {
        const std::string rest = after(line, "end");
        const size_t space = rest.find(' ');
        if (space != std::string::npos) say(rest.substr(space + 1));
        return {false, std::atoi(rest.c_str())};
      }
      // "stop" after this node's ranks ended already: nothing to do.
    }
  }
  // Node 0: every node's end of this attempt, then one decision for all.
  int job_code = own_failure ? code : 0;
  std::string lost;
  for (Peer& peer : peers_) {
    while (!peer.done && !peer.lost) {
      const std::string line = read_line(peer, wait_s(grace_s_));
      if (line == "failed") peer.failed = true;
      if (line.rfind("done ", 0) == 0) record_done(peer, line);
    }
    if (peer.lost) lost += (lost.empty() ? "" : ", ") + std::to_string(peer.node);
    if (peer.failed && job_code == 0) job_code = peer.code != 0 ? peer.code : kExitInternal;
  }
  bool failed = own_failure;
  for (const Peer& peer : peers_) failed = failed || peer.failed;
  if (job_code == 0 && code != 0) job_code = code;
  for (const Peer& peer : peers_) {
    if (job_code == 0 && peer.code != 0) job_code = peer.code;
  }
  std::string message;
  if (!lost.empty()) {
    if (job_code == 0) job_code = kExitInternal;
    message = "node(s) " + lost + " left the job (their zero-run is gone, or said nothing for " +
              std::to_string(wait_s(grace_s_)) + " s after node 0's ranks ended); going on without them would be elastic "
              "training (--nnodes MIN:MAX), which zero-run does not do yet; run the job again to resume from its last "
              "checkpoint";
  } else if (failed && restart < max_restarts) {
    for (Peer& peer : peers_) {
      send(peer.fd, "start");
      peer.done = peer.failed = false;
      peer.code = 0;
    }
    stop_sent_ = false;
    return {true, 0};
  } else if (failed) {
    message = "the ranks failed after " + std::to_string(restart) + " restart(s), all that --max-restarts " +
              std::to_string(max_restarts) + " allows; the job ends with the failing rank's status (" +
              std::to_string(job_code) + "); run it again to resume from its last checkpoint";
  }
  for (const Peer& peer : peers_) {
    if (!peer.lost) send(peer.fd, "end " + std::to_string(job_code) + (message.empty() ? "" : " " + message));
  }
  if (!message.empty()) say(message);
  return {false, job_code};
}

}  // namespace zero_run
