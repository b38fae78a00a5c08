// The monitors' writer thread and the CSV monitor (monitor/monitor.h).
#include "monitor/monitor.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "zero/error.h"

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
      if (std::fprintf(file, "%lld,%.9g\n", static_cast<long long>(e.step), e.value) < 0) fail(e.tag);
    }
  }
  void flush() override {
    for (auto& [name, file] : files_) {
      if (std::fflush(file) != 0) fail(name);
    }
  }

 private:
  // As DeepSpeed names them: the tag with '/' and ' ' as '_'; the header
  // "step,<the tag's last part>" when the file is new.
  std::FILE* open(const std::string& tag) {
    auto it = files_.find(tag);
    if (it != files_.end()) return it->second;
    std::string name = tag;
    for (char& c : name) c = (c == '/' || c == ' ') ? '_' : c;
    const std::string path = dir_ + "/" + name + ".csv";
    std::FILE* file = std::fopen(path.c_str(), "a");
    if (!file) throw EngineError("csv_monitor: cannot open " + path + ": " + std::strerror(errno));
    if (std::ftell(file) == 0) {
      const auto slash = tag.rfind('/');
      std::fprintf(file, "step,%s\n", slash == std::string::npos ? tag.c_str() : tag.c_str() + slash + 1);
    }
    files_[tag] = file;
    return file;
  }
  void fail(const std::string& tag) {
    throw EngineError("csv_monitor: writing " + tag + " under " + dir_ + " failed: " + std::strerror(errno));
  }
  std::string dir_;
  std::map<std::string, std::FILE*> files_;
};

}  // namespace

std::unique_ptr<Sink> csv_sink(const std::string& dir) { return std::make_unique<CsvSink>(dir); }

Monitors::Monitors(std::vector<std::unique_ptr<Sink>> sinks) : sinks_(std::move(sinks)), thread_([this] { run(); }) {}

Monitors::~Monitors() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Monitors::write(std::vector<Event> events) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) throw EngineError(error_);
  queue_.push_back(std::move(events));
  cv_.notify_all();
}

void Monitors::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  flush_wanted_ = true;
  cv_.notify_all();
  done_cv_.wait(lock, [this] { return !flush_wanted_ || !error_.empty(); });
  if (!error_.empty()) throw EngineError(error_);
}

// Writes batches in order; flushes when asked and when stopping.
void Monitors::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || flush_wanted_ || !queue_.empty(); });
    while (!queue_.empty()) {
      std::vector<Event> events = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::string failed;
      try {
        for (auto& sink : sinks_) sink->write(events);
      } catch (const std::exception& e) {
        failed = e.what();
      }
      lock.lock();
      if (!failed.empty() && error_.empty()) error_ = failed;
    }
    if (flush_wanted_ || stop_) {
      lock.unlock();
      std::string failed;
      try {
        for (auto& sink : sinks_) sink->flush();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      lock.lock();
      if (!failed.empty() && error_.empty()) error_ = failed;
      flush_wanted_ = false;
      done_cv_.notify_all();
    }
    if (stop_) return;
  }
}

}  // namespace zero::monitor
