// Heartbeats and the diagnosis of a missing rank (Note [Missing rank]).
#include <future>
#include <sstream>
#include <thread>

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

// The diagnosis from two reads of the heartbeats, kPeriod * 6 apart, by the
// rank `me` now in collective number `my_seq` (`my_op`, `my_bytes`).
std::string explain(int me, long my_seq, const std::string& my_op, uint64_t my_bytes,
                    const std::vector<int>& global_ranks, const std::vector<Beat>& first,
                    const std::vector<Beat>& second) {
  std::ostringstream out;
  bool found = false;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    const int r = global_ranks[i];
    if (r == me) continue;
    const Beat& last = second[i].present ? second[i] : first[i];
    const std::string mine = "#" + std::to_string(my_seq) + " (" + my_op + ")";
    const std::string theirs = "#" + std::to_string(last.seq) + " (" + last.op + ")";
    std::string why;
    const bool same_collective = last.present && last.seq == my_seq && last.op == my_op;
    if (same_collective && last.bytes != my_bytes) {
      why = std::string(last.exited ? "exited in" : "is in") + " the same collective " + theirs + " with " +
            std::to_string(last.bytes) + " bytes while rank " + std::to_string(me) + " passed " +
            std::to_string(my_bytes) + ": the ranks passed tensors of different sizes";
    } else if (!last.present) {
      why = "never started its heartbeat";
    } else if (last.exited) {
      why = "has exited";
      if (last.seq == my_seq && last.op != my_op) {
        why += " after entering collective " + theirs + " while rank " + std::to_string(me) + " is at " + mine +
               ": the ranks issued different collectives";
      } else if (last.seq < my_seq) {
        why += " (its last collective was " + theirs + "; this rank is at " + mine + ")";
      }
    } else if (first[i].present && !first[i].exited && last.counter == first[i].counter) {
      why = "stopped responding (its process died or is frozen, or its node cannot be reached)";
    } else if (last.seq != my_seq || last.op != my_op) {
      why = "is alive but at collective " + theirs + " while rank " + std::to_string(me) + " is at " + mine +
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

}  // namespace

HealthMonitor::HealthMonitor(StorePtr store, int global_rank, int world_size)
    : state_(std::make_shared<State>()), world_(world_size) {
  state_->store = std::move(store);
  state_->rank = global_rank;
  thread_ = std::thread([state = state_] { beat(state); });
}

HealthMonitor::~HealthMonitor() { stop_beating(); }

// A heartbeat thread blocked behind a diagnosis's reader on an unreachable
// store (Note [An unreachable store]) is left to itself: it holds the
// state it uses.
void HealthMonitor::stop_beating() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (!thread_.joinable()) return;
  if (state_->store_stuck.load()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void HealthMonitor::entering(const char* op, uint64_t bytes) {
  state_->op.store(op);
  state_->bytes.store(bytes);
  state_->seq.fetch_add(1);
}

void HealthMonitor::beat(const std::shared_ptr<State>& state) {
  long counter = 0;
  std::unique_lock<std::mutex> lock(state->mu);
  while (!state->stop) {
    lock.unlock();
    try {
      std::ostringstream value;
      value << ++counter << " " << state->seq.load() << " " << state->op.load() << " " << state->bytes.load();
      state->store->set(key(state->rank), bytes(value.str()));
    } catch (const std::exception&) {
      // The store is gone (rank 0 exited); the next collective reports it.
    }
    lock.lock();
    state->cv.wait_for(lock, kPeriod, [&] { return state->stop; });
  }
}

// Note [An unreachable store]: when the link to rank 0's node drops, a
// request to the store (on rank 0) gets no answer, and c10d's TCPStore
// (1.13) waits for one forever, holding its connection's lock. So the
// diagnosis reads the heartbeats on a thread of its own and gives up at a
// deadline, saying the store did not answer. That reader, and the heartbeat
// thread queued behind it on the lock, are left blocked: they share only
// HealthMonitor::State, which they keep alive, and shutdown() detaches the
// heartbeat thread instead of joining it. A store that is gone (rank 0
// exited) still fails the reads at once, as before.
std::string HealthMonitor::diagnose(const std::vector<int>& global_ranks) {
  struct Reads {
    std::vector<Beat> first, second;
  };
  const auto deadline = kPeriod * 6 + std::chrono::seconds(3);
  if (!state_->store_stuck.load()) {
    std::vector<std::string> keys;
    for (int r : global_ranks) keys.push_back(key(r));
    auto promise = std::make_shared<std::promise<Reads>>();
    std::future<Reads> reads = promise->get_future();
    std::thread([state = state_, keys, promise] {
      try {
        Reads got;
        for (const auto& k : keys) got.first.push_back(read_beat(*state->store, k));
        std::this_thread::sleep_for(kPeriod * 6);
        for (const auto& k : keys) got.second.push_back(read_beat(*state->store, k));
        promise->set_value(std::move(got));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    }).detach();
    if (reads.wait_for(deadline) == std::future_status::ready) {
      try {
        Reads got = reads.get();
        return explain(state_->rank, state_->seq.load(), state_->op.load(), state_->bytes.load(), global_ranks, got.first,
                       got.second);
      } catch (const std::exception&) {
        return "the rendezvous store on rank 0 is unreachable: rank 0 has probably exited or died";
      }
    }
    state_->store_stuck.store(true);
  }
  std::ostringstream seconds;
  seconds << std::chrono::duration_cast<std::chrono::milliseconds>(deadline).count() / 1000.0;
  return "the rendezvous store on rank 0 did not answer for " + seconds.str() + " s: rank 0's node cannot be reached (is the network link between the nodes down?) or rank 0 is frozen";
}

void HealthMonitor::shutdown(std::chrono::milliseconds timeout) {
  stop_beating();
  if (state_->store_stuck.load()) return;  // nothing more gets through (Note [An unreachable store])
  const int me = state_->rank;
  c10d::Store& store = *state_->store;
  try {
    store.set(key(me), bytes(kExited + " " + std::to_string(state_->seq.load()) + " " + state_->op.load() + " " +
                                  std::to_string(state_->bytes.load())));
    if (me != 0) return;
    // Rank 0 hosts the store: keep it up until every other rank has exited
    // or stopped beating, so that no peer loses the store mid-shutdown.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<long> last(world_, -2);
    while (std::chrono::steady_clock::now() < deadline) {
      bool waiting = false;
      for (int r = 1; r < world_; ++r) {
        const Beat b = read_beat(store, key(r));
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
