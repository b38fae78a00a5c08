// The monitors' writer thread and the CSV monitor (monitor/monitor.h).
#include "monitor/monitor.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "core/write_failure.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::monitor {
namespace {

class CsvSink : public Sink {
 public:
  explicit CsvSink(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw EngineError("csv_monitor: cannot create " + dir_ + " (" + ec.message() + "); set csv_monitor.output_path to a writable folder");
  }
  ~CsvSink() override {
    for (auto& [name, file] : files_) std::fclose(file);
  }
  void write(const std::vector<Event>& events) override {
    for (const Event& e : events) {
      std::FILE* file = open(e.tag);
      errno = 0;
      if (std::fprintf(file, "%lld,%.9g\n", static_cast<long long>(e.step), e.value) < 0) fail(path_of(e.tag));
    }
  }
  void flush() override {
    for (auto& [tag, file] : files_) {
      if (std::fflush(file) != 0) fail(path_of(tag));
    }
  }

 private:
  // As DeepSpeed names them: the tag with '/' and ' ' as '_'; the header
  // "step,<the tag's last part>" when the file is new.
  std::FILE* open(const std::string& tag) {
    auto it = files_.find(tag);
    if (it != files_.end()) return it->second;
    const std::string path = path_of(tag);
    std::FILE* file = std::fopen(path.c_str(), "a");
    if (!file) fail(path);
    if (std::ftell(file) == 0) {
      const auto slash = tag.rfind('/');
      std::fprintf(file, "step,%s\n", slash == std::string::npos ? tag.c_str() : tag.c_str() + slash + 1);
    }
    files_[tag] = file;
    return file;
  }
  std::string path_of(const std::string& tag) const {
    std::string name = tag;
    for (char& c : name) c = (c == '/' || c == ' ') ? '_' : c;
    return dir_ + "/" + name + ".csv";
  }
  [[noreturn]] void fail(const std::string& path) {
    const int e = errno != 0 ? errno : EIO;
    throw EngineError(write_failure::report("csv_monitor", path, e));
  }
  std::string dir_;
  std::map<std::string, std::FILE*> files_;
};

}  // namespace

std::unique_ptr<Sink> csv_sink(const std::string& dir) { return std::make_unique<CsvSink>(dir); }

struct Monitors::Shared {
  std::vector<std::unique_ptr<Sink>> sinks;
  size_t max_queued;
  std::chrono::milliseconds patience;
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<std::vector<Event>> queue;
  int64_t queued = 0, written = 0;  // batches queued, and written and flushed, so far
  int64_t dropped = 0;
  bool failed = false, stop = false, exited = false;
};

Monitors::Monitors(std::vector<std::unique_ptr<Sink>> sinks, size_t max_queued, std::chrono::milliseconds patience)
    : s_(std::make_shared<Shared>()) {
  s_->sinks = std::move(sinks);
  s_->max_queued = std::max<size_t>(max_queued, 1);
  s_->patience = patience;
  std::thread(run, s_).detach();  // ends on its own once stopped (Note [A stalled monitor disk])
}

Monitors::~Monitors() {
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->stop = true;
  s_->cv.notify_all();
  if (!s_->done_cv.wait_for(lock, s_->patience, [this] { return s_->exited; })) {
    log::warn("monitor", "the monitors' writer has not finished in " + std::to_string(s_->patience.count() / 1000) +
                             " s (is its disk stalled?); leaving it behind: the last " +
                             std::to_string(s_->queued - s_->written) + " steps' rows may be lost");
  }
}

void Monitors::write(std::vector<Event> events) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->failed) return;  // reported already; the engine stops at its step boundary
  if (s_->queue.size() >= s_->max_queued) {
    if (s_->dropped++ == 0) {
      log::warn("monitor", "the monitors' writer is " + std::to_string(s_->queue.size()) +
                               " steps behind (is its disk stalled?); dropping monitor rows until it catches up "
                               "(this warning is shown once)");
    }
    return;
  }
  s_->queue.push_back(std::move(events));
  ++s_->queued;
  s_->cv.notify_all();
}

bool Monitors::flush() {
  std::unique_lock<std::mutex> lock(s_->mu);
  const int64_t target = s_->queued;
  s_->cv.notify_all();
  if (s_->done_cv.wait_for(lock, s_->patience, [&] { return s_->written >= target || s_->failed; })) return true;
  log::warn("monitor", "the monitors' files were not flushed: their writer has not finished in " +
                           std::to_string(s_->patience.count() / 1000) + " s (is its disk stalled?)");
  return false;
}

int64_t Monitors::dropped() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->dropped;
}

// Writes batches in order, each handed to the kernel once written; after a
// failed write it writes nothing more. Runs until stopped and the queue is empty.
void Monitors::run(std::shared_ptr<Shared> s) {
  std::unique_lock<std::mutex> lock(s->mu);
  while (true) {
    s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
    while (!s->queue.empty()) {
      std::vector<Event> events = std::move(s->queue.front());
      s->queue.pop_front();
      const bool failed = s->failed;
      lock.unlock();
      bool ok = !failed;
      try {
        for (auto& sink : s->sinks) {
          if (ok) sink->write(events);
        }
        for (auto& sink : s->sinks) {
          if (ok) sink->flush();
        }
      } catch (const std::exception&) {
        ok = false;  // reported by the sink (Note [Failed writes])
      }
      lock.lock();
      if (!ok) s->failed = true;
      ++s->written;
      s->done_cv.notify_all();
    }
    if (s->stop) break;
  }
  lock.unlock();
  try {
    s->sinks.clear();  // closes the files before the destructor returns
  } catch (...) {
  }
  lock.lock();
  s->exited = true;
  s->done_cv.notify_all();
}

}  // namespace zero::monitor
