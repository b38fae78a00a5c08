#pragma once
// The point-to-point links of one rank's pipeline stage to its neighbours.
//
// Note [Pipeline links]: each edge between stages s and s + 1 of a pipeline
// group is two groups of those two ranks, one carrying activations forward,
// the other gradients backward. A send is a broadcast rooted at the sender,
// issued asynchronously on the group's communication thread; a receive is
// the same broadcast on the receiver. One direction per group keeps each
// group's calls in micro-batch order on both of its ranks, and the async
// sends keep 1F1B's steady state (stage s sends activation i + 1 while
// stage s + 1 sends gradient i) from deadlocking. Broadcast brings gloo,
// NCCL, CUDA tensors staged through host memory and the missing-rank
// timeouts of comm/ with it. Each message is a header (dtype, rank, sizes)
// then the data, so micro-batches may change shape.
#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "zero/comm.h"

namespace zero::pipe {

class PipeLinks {
 public:
  // A collective over `pp_group` (its ranks are the stages in order).
  explicit PipeLinks(const std::shared_ptr<comm::ProcessGroup>& pp_group);

  void send_activation(const at::Tensor& t) { send(act_next_, 0, t); }      // to stage + 1
  at::Tensor recv_activation(at::Device device) { return recv(act_prev_, 0, device); }
  void send_gradient(const at::Tensor& t) { send(grad_prev_, 1, t); }       // to stage - 1
  at::Tensor recv_gradient(at::Device device) { return recv(grad_next_, 1, device); }
  // Waits until every send so far has left (their tensors are then free).
  void finish_sends();
  // Bytes of activations and gradients this rank has sent.
  int64_t bytes_sent() const;

 private:
  void send(const std::shared_ptr<comm::ProcessGroup>& group, int root, const at::Tensor& t);
  at::Tensor recv(const std::shared_ptr<comm::ProcessGroup>& group, int root, at::Device device);

  std::shared_ptr<comm::ProcessGroup> act_prev_, act_next_, grad_prev_, grad_next_;
  std::vector<std::pair<comm::WorkHandle, at::Tensor>> pending_;
};

}  // namespace zero::pipe
