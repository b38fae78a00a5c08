#pragma once
// How gradients become this rank's reduced partition: one strategy per
// stage, chosen once at initialize (GradReducer::for_stage).
//
//   stage 0    all-reduce each bucket of a full gradient buffer at the
//              accumulation boundary;
//   stage 1    reduce-scatter each bucket of a full buffer at the boundary,
//              in place, onto this rank's shard;
//   stages 2-3 reduce-scatter each bucket as soon as its gradients are
//              complete, every micro-step, into the partition (or to the
//              host, Note [Offload copies]); no full gradient is kept, only
//              a small pool of bucket buffers.
//
// The base class follows the gradients as they arrive: which buckets are
// complete, and that every rank launches the same collectives in the same
// (bucket) order whatever order its gradients complete in.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "zero/comm.h"
#include "partition/quantized_reduce.h"

namespace zero::partition {

class FlatLayout;
class HostGrads;

struct ReducerOptions {
  int stage = 0;
  bool overlap_comm = false;  // leave reductions in flight while backward goes on
  at::TensorOptions grad_options;  // training dtype, the parameters' device
  // ZeRO++'s qgZ (stages 2-3): reduce-scatters in two levels, int8 across
  // nodes (Note [Quantized gradients]); null: a plain reduce-scatter.
  std::shared_ptr<QuantizedReduceScatter> quantized;
  // The gradient buffers ask for huge pages (offload/huge_pages.h): the
  // host optimizer's kernels stream through them each step. Off where the
  // step waits on the disk instead (offload_optimizer "nvme"): a huge page's
  // first touch may compact memory first, seconds a gigabyte at initialize.
  bool huge_pages = true;
};

class GradReducer {
 public:
  // `host`: the host copies of offloaded buckets (may be null).
  static std::unique_ptr<GradReducer> for_stage(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg,
                                                HostGrads* host, const ReducerOptions& options);
  virtual ~GradReducer() = default;

  // Brackets each micro-step's backward. `boundary`: the last micro-step
  // before an optimizer step.
  void begin_backward(bool boundary);
  // Adds parameter i's gradient (flat layout order); true when that
  // completes its bucket for this backward.
  bool add(int param, const at::Tensor& grad);
  // Launches the complete buckets that are next in bucket order.
  void launch_ready();
  // Reduces every bucket not reduced yet (unused parameters: zeros) and
  // waits for all reductions.
  void end_backward();
  bool reduced(size_t k) const { return launched_[k]; }
  // Called with each bucket's index just after its reduction starts (it
  // has completed too without overlap_comm), in bucket order on every
  // rank, however the gradients arrive (Note [Updates in backward] in
  // partition/step.cpp); empty: none.
  void on_launch(std::function<void(size_t)> callback) { on_launch_ = std::move(callback); }
  // Waits for bucket k's reduction (started) and lands it.
  void wait_reduced(size_t k) { finish(k); }

  // This rank's reduced gradient of bucket k for the step, in the training
  // dtype (the whole bucket at stage 0); undefined when it lives only in
  // the host copy.
  virtual at::Tensor shard_grad(size_t k) = 0;
  // After the step: the next backward starts from zero.
  virtual void zero() = 0;
  // Bytes of gradient buffers on the parameters' device.
  virtual int64_t bytes() const = 0;
  // Mid-accumulation checkpoints: what this rank holds of the gradients
  // summed so far (stages 0-1: the whole unreduced buffer; stages 2-3: every
  // bucket's shard in bucket order, host copies included), and its restoration.
  virtual at::Tensor accumulated() = 0;
  virtual void restore(const at::Tensor& values) = 0;
  // Waits for collectives still in flight, swallowing their errors (an
  // error was raised already): for destructors.
  void settle() noexcept;

 protected:
  GradReducer(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg, const ReducerOptions& options);
  // Where bucket k's elements [start, start + numel) are summed.
  virtual at::Tensor slot(size_t k, int64_t start, int64_t numel) = 0;
  // Starts bucket k's reduction; works_[k] holds it, if any.
  virtual void start(size_t k) = 0;
  // Bucket k's reduction completed: lands its result.
  virtual void land(size_t k) {}
  // Every bucket of this backward is reduced.
  virtual void backward_done() {}
  // Waits for bucket k's reduction and lands it.
  void finish(size_t k);
  // restore(): `values` must have `expected` elements.
  static void check_size(const at::Tensor& values, int64_t expected);

  // Note [First gradient copies]: buffers are not cleared in bulk. A
  // parameter's first gradient since its slot was last valid is copied
  // there (one pass, where clearing and then adding would read and write
  // the buffer twice more), and a bucket is completed just before anyone
  // reads it: fill_unwritten zeroes the slots of parameters no gradient
  // reached, and the padding between and after them.
  void forget_written(size_t k);  // bucket k's slots hold nothing valid now
  void set_all_written(bool written);  // restore(): every slot holds a value
  void fill_unwritten(size_t k);

  const FlatLayout& layout_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  ReducerOptions options_;
  std::vector<comm::WorkHandle> works_;
  bool boundary_ = false;

 private:
  std::vector<int> pending_;    // per bucket: parameters whose gradient has not arrived
  std::vector<bool> launched_;  // per bucket
  std::vector<bool> fired_;     // per parameter
  std::vector<bool> written_;   // per parameter: its slot holds a value (Note [First gradient copies])
  size_t next_launch_ = 0;
  std::function<void(size_t)> on_launch_;
};

}  // namespace zero::partition
