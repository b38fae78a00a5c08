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
// loop, which hands each batch to the kernel (fflush) once written: a full
// disk shows at once, and a crash loses at most the batch in hand. flush()
// (the engine calls it at each checkpoint) waits for the queue. A failed
// write is reported as Note [Failed writes] in core/write_failure.h says,
// and the engine stops every rank; a stalled disk never blocks the step
// (Note [A stalled monitor disk]). Torch-free.
//
// Note [A stalled monitor disk]: when the writer falls `max_queued` steps
// behind (its disk hangs: NFS, a dying drive, a FIFO), write() drops the
// step's rows instead of waiting, with one warning; the writer goes on where
// it was when the disk comes back, and the CSV files simply lack those
// steps. Training is never held up by its monitors: a monitor's row is
// worth less than the step. flush() and the destructor wait at most
// `patience` for a stalled writer; after that a checkpoint goes ahead
// without the monitors' files flushed (a warning says so) and the
// destructor leaves the thread behind (it owns its queue and files, and
// ends when its write returns). A write that fails (ENOSPC, EIO, ...) is
// not a stall: it stops training (Note [Failed writes]).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zero::monitor {

struct Event {
  std::string tag;  // "Train/Samples/train_loss"
  double value = 0;
  int64_t step = 0;  // samples so far
};

// Where events go (one per monitor kind). write() and flush() run on the
// writer thread; a failed write is reported (write_failure::report, naming
// the monitor, the file and errno) and thrown as an EngineError.
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
  // `max_queued`: the steps the writer may fall behind before rows are
  // dropped; `patience`: how long flush() and the destructor wait for it.
  explicit Monitors(std::vector<std::unique_ptr<Sink>> sinks, size_t max_queued = 256,
                    std::chrono::milliseconds patience = std::chrono::seconds(10));
  ~Monitors();  // writes what is queued and flushes (waiting at most `patience`)
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  // Queued; returns at once. Dropped, with one warning, while the writer is
  // `max_queued` steps behind, and once a write has failed.
  void write(std::vector<Event> events);
  // Waits until everything queued is written and handed to the kernel;
  // false when the writer did not finish within `patience` (a warning says
  // so). A failed write is not raised here but reported (Note [Failed writes]).
  bool flush();
  int64_t dropped() const;  // steps whose rows were dropped

 private:
  struct Shared;  // what the writer thread owns with this object
  static void run(std::shared_ptr<Shared> s);
  std::shared_ptr<Shared> s_;
};

}  // namespace zero::monitor
