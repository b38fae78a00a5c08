// Point-to-point links between pipeline stages (Note [Pipeline links]).
#include "parallel/pipe_links.h"

#include <torch/torch.h>

#include "zero/error.h"

namespace zero::pipe {
namespace {

constexpr int64_t kMaxDims = 8;

at::Tensor header_of(const at::Tensor& t) {
  if (t.dim() > kMaxDims) {
    throw EngineError("pipeline: an activation of " + std::to_string(t.dim()) + " dimensions cannot be sent (at most " +
                      std::to_string(kMaxDims) + "); reshape it between stages");
  }
  at::Tensor h = torch::zeros({2 + kMaxDims}, at::kLong);
  auto a = h.accessor<int64_t, 1>();
  a[0] = static_cast<int64_t>(t.scalar_type());
  a[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) a[2 + d] = t.size(d);
  return h;
}

}  // namespace

PipeLinks::PipeLinks(const std::shared_ptr<comm::ProcessGroup>& pp_group) {
  const int stage = pp_group->rank();
  for (int s = 0; s + 1 < pp_group->size(); ++s) {
    auto act = pp_group->new_group({s, s + 1});
    auto grad = pp_group->new_group({s, s + 1});
    if (s == stage) act_next_ = act, grad_next_ = grad;
    if (s + 1 == stage) act_prev_ = act, grad_prev_ = grad;
  }
}

void PipeLinks::send(const std::shared_ptr<comm::ProcessGroup>& group, int root, const at::Tensor& t) {
  if (!group) throw EngineError("pipeline: this stage has no neighbour to send to");
  at::Tensor header = header_of(t);
  at::Tensor data = t.detach().contiguous();
  pending_.emplace_back(group->broadcast_async(header, root), header);
  pending_.emplace_back(group->broadcast_async(data, root), data);
}

at::Tensor PipeLinks::recv(const std::shared_ptr<comm::ProcessGroup>& group, int root, at::Device device) {
  if (!group) throw EngineError("pipeline: this stage has no neighbour to receive from");
  at::Tensor header = torch::zeros({2 + kMaxDims}, at::kLong);
  group->broadcast(header, root);
  auto a = header.accessor<int64_t, 1>();
  std::vector<int64_t> sizes(a[1]);
  for (int64_t d = 0; d < a[1]; ++d) sizes[d] = a[2 + d];
  at::Tensor data = torch::empty(sizes, torch::TensorOptions().dtype(static_cast<at::ScalarType>(a[0])).device(device));
  group->broadcast(data, root);
  return data;
}

void PipeLinks::finish_sends() {
  for (auto& [work, tensor] : pending_) work->wait();
  pending_.clear();
}

int64_t PipeLinks::bytes_sent() const {
  int64_t bytes = 0;
  for (const auto* g : {&act_prev_, &act_next_, &grad_prev_, &grad_next_}) {
    if (*g) bytes += (*g)->stats().broadcast_bytes;
  }
  return bytes;
}

}  // namespace zero::pipe
