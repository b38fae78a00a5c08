#pragma once
// HashPipeline: spans of memory hashed in order on one helper thread, so
// that a load hashes one read while it makes the next (Note [Hashing while
// reading] in fragments.cpp). Internal to ckpt/.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"  // Xxh3

namespace zero::ckpt {

// Started at the first push.
class HashPipeline {
 public:
  ~HashPipeline() {
    drain();  // the spans point into the caller's memory: done before it goes
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Hashes [p, p + n) into `hash`; `owned`, when given, holds the bytes.
  void push(Xxh3* hash, const void* p, size_t n, std::vector<char> owned = {}) {
    if (n == 0) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      spans_.push_back({hash, static_cast<const char*>(p), n, std::move(owned)});
    }
    work_.notify_one();
  }
  // Returns when every span pushed so far is hashed.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return spans_.empty() && !busy_; });
  }

 private:
  struct Span {
    Xxh3* hash;
    const char* p;
    size_t n;
    std::vector<char> owned;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [this] { return stop_ || !spans_.empty(); });
      if (spans_.empty()) return;  // stop_ and nothing left
      Span span = std::move(spans_.front());
      spans_.pop_front();
      busy_ = true;
      lock.unlock();
      span.hash->update(span.owned.empty() ? span.p : span.owned.data(), span.n);
      lock.lock();
      busy_ = false;
      if (spans_.empty()) idle_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable work_, idle_;
  std::deque<Span> spans_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace zero::ckpt
