#pragma once
// Note [Restarts across nodes]
// With --max-restarts and --nnodes > 1 the nodes' zero-runs restart together,
// as torchrun's agents do through their rendezvous. Node 0's zero-run
// listens on MASTER_PORT + 1 (at --master-addr) and every other node's
// connects to it when it starts (retrying for ZERO_COMM_TIMEOUT seconds,
// default 300). Then, for each attempt:
//   * every node starts its ranks;
//   * a node whose rank fails tells node 0 ("failed"); node 0 tells every
//     node to stop ("stop"), and each stops its ranks as it does after a
//     failure of its own, saying which node failed;
//   * each node reports how its ranks ended ("done <code> <failed>");
//   * node 0 decides for all: "start" the next attempt when a rank failed
//     and the budget allows, else "end <code>".
// Every node therefore starts attempt k with TORCHELASTIC_RESTART_COUNT k,
// and the ranks meet again at the same MASTER_PORT. A node whose link closes
// (its zero-run died, with its machine) ends the job on the others, naming
// it, and so does one silent for twice ZERO_COMM_TIMEOUT after a node's
// ranks ended (a link down sends no EOF): going on without it would be
// elastic training (--nnodes MIN:MAX), which zero-run does not do yet.
#include <string>
#include <vector>

#include "launcher.h"

namespace zero_run {

class NodeLink {
 public:
  // Node 0 listens and waits for every other node; the others connect.
  // Throws std::runtime_error saying what is missing.
  NodeLink(const LaunchOptions& options, int master_port);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // During an attempt: the descriptors to poll, and what arrived on one.
  // read_from returns true when this node must stop its ranks (a failure on
  // another node, or a link lost); why() then says what happened.
  std::vector<int> fds() const;
  bool read_from(int fd);
  const std::string& why() const { return why_; }
  // This node's own rank failed first.
  void tell_failed();

  struct Decision {
    bool restart = false;
    int code = 0;  // the job's exit status when it ends
  };
  // After an attempt: this node's status and whether one of its own ranks
  // failed (not stopped for another node); returns node 0's decision.
  // `restart`: the attempt's number, `max_restarts`: the budget.
  Decision finish_attempt(int code, bool own_failure, int restart, int max_restarts);

 private:
  struct Peer {
    int fd = -1;
    int node = -1;
    std::string buffer;  // a partial line
    bool done = false, failed = false, lost = false, silent = false;
    int code = 0;
  };
  void send(int fd, const std::string& line);
  void stop_everyone(const std::string& why);
  // The next whole line from `peer`, or "" with peer.lost set at EOF or
  // (peer.silent too) after timeout_s seconds without one.
  std::string read_line(Peer& peer, int timeout_s);
  static int wait_s(double grace_s);
  // What arrived into peer.buffer; false (and peer.lost) at EOF.
  bool receive(Peer& peer, bool block);
  void record_done(Peer& peer, const std::string& line);

  bool leader_ = false;
  int node_ = 0;
  double grace_s_ = 5;
  std::vector<Peer> peers_;  // node 0: every other node; others: node 0
  bool stop_sent_ = false;
  std::string why_;
};

}  // namespace zero_run
