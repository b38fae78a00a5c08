#pragma once
// A process group carried through autograd (tensor_parallel.cpp,
// sequence_parallel.cpp): the group travels as a capsule, a non-tensor
// argument of Function::apply, and is kept in the context for backward.
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <utility>

#include "zero/comm.h"

namespace zero::parallel_detail {

using Group = std::shared_ptr<comm::ProcessGroup>;

struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(Group g) : group(std::move(g)) {}
  Group group;
};

inline c10::intrusive_ptr<GroupRef> ref(const Group& g) { return c10::make_intrusive<GroupRef>(g); }

inline void keep(torch::autograd::AutogradContext* ctx, const c10::intrusive_ptr<GroupRef>& g) {
  ctx->saved_data["zero.group"] = c10::IValue::make_capsule(g);
}

inline const Group& group_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupRef>(ctx->saved_data.at("zero.group").toCapsule())->group;
}

// A mapping over a group whose backward is another mapping over the same
// group (Ulysses' two all-to-alls, a sum and its sum):
//   GroupMapping<to_heads, to_seq>::apply(x, ref(group)).
using Mapping = at::Tensor (*)(const at::Tensor&, const Group&);
template <Mapping Forward, Mapping Backward>
class GroupMapping : public torch::autograd::Function<GroupMapping<Forward, Backward>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupRef> g) {
    keep(ctx, g);
    return Forward(x, g->group);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {Backward(grads[0], group_of(ctx)), at::Tensor()};
  }
};

}  // namespace zero::parallel_detail
