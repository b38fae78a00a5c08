#pragma once
// Monitors: the scalars of each optimizer step, written by rank 0 where
// DeepSpeed's monitors write them, the step being the number of samples
// trained so far: "csv_monitor" (one CSV file per scalar under
// <output_path>/<job_name>/, named after its tag with '/' as '_', rows
// "step,value" under a "step,<last part of the tag>" header) and
// "tensorboard" (an event file under <output_path>/<job_name>/ with one
// Event per step, its scalars as Summary values under the same tags).
//
// Writes are queued and done by a thread of their own, off the training
// loop; files are flushed on flush() (the engine calls it at each
// checkpoint) and when the Monitors go away, so a crash loses at most the
// steps since the last flush. Torch-free.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zero::monitor {

struct Event {
  std::string tag;  // "Train/Samples/train_loss"
  double value = 0;
  int64_t step = 0;  // samples so far
};

// Where events go (one per monitor kind).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(const std::vector<Event>& events) = 0;
  virtual void flush() = 0;
};

// DeepSpeed's csv_monitor into `dir` (created). Throws zero::EngineError
// naming the folder when it cannot be created.
std::unique_ptr<Sink> csv_sink(const std::string& dir);
// TensorBoard's event file in `dir` (created); same errors. In a build
// without protobuf it throws an EngineError saying what to install.
std::unique_ptr<Sink> tensorboard_sink(const std::string& dir);
bool tensorboard_available();

class Monitors {
 public:
  explicit Monitors(std::vector<std::unique_ptr<Sink>> sinks);
  ~Monitors();  // writes what is queued and flushes
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  void write(std::vector<Event> events);  // queued; returns at once
  // Waits until everything queued is written, then flushes the files.
  void flush();

 private:
  void run();
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::vector<Event>> queue_;
  bool busy_ = false, flush_wanted_ = false, stop_ = false;
  std::string error_;  // the first failed write, raised by the next call
  std::thread thread_;
};

}  // namespace zero::monitor
