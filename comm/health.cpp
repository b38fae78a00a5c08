// Heartbeats and the diagnosis of a missing rank (Note [Missing rank]).
#include <sstream>

#include "comm/internal.h"
#include "zero/log.h"

namespace zero::comm {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(250);
const std::string kExited = "exited";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Heartbeat value: "<beat counter> <collective number> <collective name>
// <bytes>", or "exited <collective number> <collective name> <bytes>" after
// a clean exit (bytes: what this rank contributes to the collective).
// Compared between two reads rather than by clock time, so that
// hosts need not agree on the time.
struct Beat {
  bool present = false;
  bool exited = false;
  long counter = -1;
  long seq = -1;
  std::string op;
  uint64_t bytes = 0;
};

Beat read_beat(c10d::Store& store, const std::string& key) {
  Beat beat;
  if (!store.check({key})) return beat;
  const auto raw = store.get(key);
  std::istringstream in(std::string(raw.begin(), raw.end()));
  beat.present = true;
  if (in.peek() == kExited[0]) {  // "exited <collective number> <name>"
    std::string word;
    in >> word >> beat.seq >> beat.op >> beat.bytes;
    beat.exited = true;
    return beat;
  }
  in >> beat.counter >> beat.seq >> beat.op >> beat.bytes;
  return beat;
}

}  // namespace

HealthMonitor::HealthMonitor(StorePtr store, int global_rank, int world_size)
    : store_(std::move(store)), rank_(global_rank), world_(world_size) {
  thread_ = std::thread([this] { beat(); });
}

HealthMonitor::~HealthMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HealthMonitor::entering(const char* op, uint64_t bytes) {
  op_.store(op);
  bytes_.store(bytes);
  seq_.fetch_add(1);
}

void HealthMonitor::beat() {
  long counter = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      std::ostringstream value;
      value << ++counter << " " << seq_.load() << " " << op_.load() << " " << bytes_.load();
      store_->set(key(rank_), bytes(value.str()));
    } catch (const std::exception&) {
      // The store is gone (rank 0 exited); the next collective reports it.
    }
    lock.lock();
    cv_.wait_for(lock, kPeriod, [this] { return stop_; });
  }
}

std::string HealthMonitor::diagnose(const std::vector<int>& global_ranks) {
  std::vector<Beat> first(global_ranks.size()), second(global_ranks.size());
  try {
    for (size_t i = 0; i < global_ranks.size(); ++i) first[i] = read_beat(*store_, key(global_ranks[i]));
    std::this_thread::sleep_for(kPeriod * 6);
    for (size_t i = 0; i < global_ranks.size(); ++i) second[i] = read_beat(*store_, key(global_ranks[i]));
  } catch (const std::exception&) {
    return "the rendezvous store on rank 0 is unreachable: rank 0 has probably exited or died";
  }
  std::ostringstream out;
  const long my_seq = seq_.load();
  bool found = false;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    const int r = global_ranks[i];
    if (r == rank_) continue;
    const Beat& last = second[i].present ? second[i] : first[i];
    const std::string mine = "#" + std::to_string(my_seq) + " (" + op_.load() + ")";
    const std::string theirs = "#" + std::to_string(last.seq) + " (" + last.op + ")";
    std::string why;
    const bool same_collective = last.present && last.seq == my_seq && last.op == op_.load();
    if (same_collective && last.bytes != bytes_.load()) {
      why = std::string(last.exited ? "exited in" : "is in") + " the same collective " + theirs + " with " +
            std::to_string(last.bytes) + " bytes while rank " + std::to_string(rank_) + " passed " +
            std::to_string(bytes_.load()) + ": the ranks passed tensors of different sizes";
    } else if (!last.present) {
      why = "never started its heartbeat";
    } else if (last.exited) {
      why = "has exited";
      if (last.seq == my_seq && last.op != op_.load()) {
        why += " after entering collective " + theirs + " while rank " + std::to_string(rank_) + " is at " + mine +
               ": the ranks issued different collectives";
      } else if (last.seq < my_seq) {
        why += " (its last collective was " + theirs + "; this rank is at " + mine + ")";
      }
    } else if (first[i].present && !first[i].exited && last.counter == first[i].counter) {
      why = "stopped responding (its process died or is frozen)";
    } else if (last.seq != my_seq || last.op != op_.load()) {
      why = "is alive but at collective " + theirs + " while rank " + std::to_string(rank_) + " is at " + mine +
            ": the ranks issued different collectives";
    }
    if (!why.empty()) {
      out << (found ? "; " : "") << "rank " << r << " " << why;
      found = true;
    }
  }
  if (!found) return "every rank is alive and at the same collective (#" + std::to_string(my_seq) + ")";
  return out.str();
}

void HealthMonitor::shutdown(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    store_->set(key(rank_), bytes(kExited + " " + std::to_string(seq_.load()) + " " + op_.load() + " " +
                                  std::to_string(bytes_.load())));
    if (rank_ != 0) return;
    // Rank 0 hosts the store: keep it up until every other rank has exited
    // or stopped beating, so that no peer loses the store mid-shutdown.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<long> last(world_, -2);
    while (std::chrono::steady_clock::now() < deadline) {
      bool waiting = false;
      for (int r = 1; r < world_; ++r) {
        const Beat b = read_beat(*store_, key(r));
        if (!b.present || b.exited) continue;
        if (b.present && b.counter == last[r]) continue;  // stalled since last look: dead
        last[r] = b.counter;
        waiting = true;
      }
      if (!waiting) return;
      std::this_thread::sleep_for(kPeriod * 3);
    }
  } catch (const std::exception& e) {
    log::debug("comm", std::string("shutdown: ") + e.what());
  }
}

}  // namespace zero::comm
