// What every backend shares: argument checks that name the shapes at fault,
// the local reduction of reduce-scatter chunks, and the one-rank backend.
#include <torch/torch.h>

#include <sstream>

#include "comm/internal.h"
#include "zero/error.h"

namespace zero::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

std::string where(const GroupInfo& g) {
  std::ostringstream out;
  out << "rank " << g.global_ranks[g.rank];
  if (g.name != "world") out << " (" << g.name << " rank " << g.rank << " of " << g.size << ")";
  return out.str();
}

void throw_collective_error(const GroupInfo& g, const std::string& message) {
  std::ostringstream msg;
  msg << message;
  if (g.health) msg << "\n  diagnosis: " << g.health->diagnose(g.global_ranks);
  msg << "\n  (timeout " << g.timeout.count() / 1000.0 << " s; set ZERO_COMM_TIMEOUT to change it)";
  throw CommError(msg.str());
}

void check_tensor(const char* op, const at::Tensor& t) {
  if (!t.defined()) throw CommError(std::string(op) + ": tensor is undefined");
  if (!t.is_contiguous()) {
    throw CommError(std::string(op) + ": tensor of shape " + c10::str(t.sizes()) +
                    " is not contiguous; pass a flat buffer or call .contiguous()");
  }
}

namespace {
void check_pair(const char* op, const at::Tensor& output, const at::Tensor& input) {
  check_tensor(op, output);
  check_tensor(op, input);
  if (output.scalar_type() != input.scalar_type() || output.device() != input.device()) {
    throw CommError(std::string(op) + ": output (" + c10::toString(output.scalar_type()) + ", " +
                    output.device().str() + ") and input (" + c10::toString(input.scalar_type()) + ", " +
                    input.device().str() + ") differ in dtype or device");
  }
}
}  // namespace

void check_reduce_scatter(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input) {
  check_pair("reduce_scatter", output, input);
  if (input.numel() != output.numel() * g.size) {
    std::ostringstream msg;
    msg << where(g) << ": reduce_scatter needs input.numel() == group size x output.numel(), got " << input.numel()
        << " vs " << g.size << " x " << output.numel() << "; pad the flat buffer to a multiple of " << g.size;
    throw CommError(msg.str());
  }
}

void check_all_gather(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input) {
  check_pair("all_gather", output, input);
  if (output.numel() != input.numel() * g.size) {
    std::ostringstream msg;
    msg << where(g) << ": all_gather needs output.numel() == group size x input.numel(), got " << output.numel()
        << " vs " << g.size << " x " << input.numel();
    throw CommError(msg.str());
  }
}

void check_all_to_all(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input) {
  check_pair("all_to_all", output, input);
  if (output.numel() != input.numel() || input.numel() % g.size != 0) {
    std::ostringstream msg;
    msg << where(g) << ": all_to_all needs input and output of one size, a multiple of the group size " << g.size
        << "; got input " << input.numel() << " and output " << output.numel() << " elements";
    throw CommError(msg.str());
  }
}

void reduce_chunks(at::Tensor& output, const at::Tensor& chunks, ReduceOp op) {
  at::Tensor out = output.view({output.numel()});
  switch (op) {
    case ReduceOp::Max:
      out.copy_(std::get<0>(chunks.max(0)));
      return;
    case ReduceOp::Sum:
    case ReduceOp::Avg: {
      // Half types accumulate in float, as NCCL does.
      const bool half = chunks.scalar_type() == at::kHalf || chunks.scalar_type() == at::kBFloat16;
      if (!half && op == ReduceOp::Sum) {
        at::sum_out(out, chunks, {0});
        return;
      }
      at::Tensor sum = half ? chunks.to(at::kFloat).sum(0) : chunks.sum(0, false, chunks.scalar_type());
      if (op == ReduceOp::Avg) {
        if (at::isIntegralType(sum.scalar_type(), false)) {
          sum = sum.div(chunks.size(0), "floor");
        } else {
          sum = sum.div(chunks.size(0));
        }
      }
      out.copy_(sum);
      return;
    }
  }
}

namespace {

// A group of one: every collective is a copy (or nothing).
class LocalBackend : public HostBackend {
 public:
  void all_reduce(at::Tensor&, ReduceOp) override {}
  void reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp) override {
    output.view({output.numel()}).copy_(input.view({input.numel()}));
  }
  void all_gather(at::Tensor& output, const at::Tensor& input) override {
    output.view({output.numel()}).copy_(input.view({input.numel()}));
  }
  void broadcast(at::Tensor&, int) override {}
  void all_to_all(at::Tensor& output, const at::Tensor& input) override {
    output.view({output.numel()}).copy_(input.view({input.numel()}));
  }
  void barrier() override {}
  const char* transport() const override { return "local"; }
};

}  // namespace

std::unique_ptr<HostBackend> make_local_backend() { return std::make_unique<LocalBackend>(); }

}  // namespace zero::comm
