#include "comm/internal.h"

#include <memory>

namespace zero::comm {

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

// Note [Captures released before completion]
// A task's captures (the tensors of a collective) die inside the call,
// before its future is ready. Otherwise the comm thread dropped them just
// after the waiting caller woke, and the caller, having dropped its own
// references meanwhile, could leave the last one to this thread. For a
// tensor that Python owns the last release needs the GIL, which a Python
// interpreter that is shutting down never hands out: it ends the asking
// thread, and the process with it (std::terminate). Released inside the
// call, while the caller still waits and holds its references, a capture
// is never the last.
std::future<void> CommThread::submit(std::function<void()> task) {
  auto holder = std::make_shared<std::function<void()>>(std::move(task));
  std::packaged_task<void()> packaged([holder] {
    const std::function<void()> run = std::move(*holder);  // dies at the end of this call
    run();
  });
  auto future = packaged.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(packaged));
  }
  cv_.notify_one();
  return future;
}

void CommThread::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop requested and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // exceptions land in the task's future
  }
}

}  // namespace zero::comm
