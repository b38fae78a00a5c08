// The allow-list itself: the globals that torch.save (torch/_utils.py,
// torch/serialization.py) and DeepSpeed's checkpoints pickle.
#include "torchsave/allowed_globals.h"

#include <iterator>

#include "torchsave/pickle.h"

namespace zero::torchsave {

namespace {

using ckpt::DType;

const Allowed kAllowed[] = {
    {"collections.OrderedDict", Role::OrderedDict},
    {"builtins.set", Role::Set},
    {"builtins.frozenset", Role::Set},
    {"builtins.getattr", Role::GetAttr},  // only as getattr(<an allowed enum>, "<member>")
    {"_codecs.encode", Role::Encode},     // protocol 2's spelling of bytes
    {"torch.Size", Role::Size},
    {"torch.device", Role::Device},
    {"torch._utils._rebuild_tensor", Role::RebuildTensor},
    {"torch._utils._rebuild_tensor_v2", Role::RebuildTensorV2},
    {"torch._utils._rebuild_parameter", Role::RebuildParameter},
    {"torch._utils._rebuild_parameter_with_state", Role::RebuildParameterWithState},
    // A tensor with Python attributes (DeepSpeed's stage 3 marks its
    // parameters): _rebuild_from_type_v2(<a rebuild above>, torch.Tensor,
    // args, attributes); the attributes are dropped.
    {"torch._tensor._rebuild_from_type_v2", Role::RebuildFromType},
    {"torch.Tensor", Role::TensorType},
    {"torch.nn.parameter.Parameter", Role::TensorType},
    {"torch.FloatStorage", Role::StorageType, DType::F32},
    {"torch.DoubleStorage", Role::StorageType, DType::F64},
    {"torch.HalfStorage", Role::StorageType, DType::F16},
    {"torch.BFloat16Storage", Role::StorageType, DType::BF16},
    {"torch.LongStorage", Role::StorageType, DType::I64},
    {"torch.IntStorage", Role::StorageType, DType::I32},
    {"torch.ByteStorage", Role::StorageType, DType::U8},
    {"torch.BoolStorage", Role::StorageType, DType::BOOL},
    {"torch.UntypedStorage", Role::StorageType, DType::U8},
    {"torch.Float8_e4m3fnStorage", Role::StorageType, DType::F8_E4M3},
    {"torch.Float8_e5m2Storage", Role::StorageType, DType::F8_E5M2},
    {"torch.float32", Role::DTypeConstant},
    {"torch.float16", Role::DTypeConstant},
    {"torch.bfloat16", Role::DTypeConstant},
    {"torch.float64", Role::DTypeConstant},
    {"torch.int64", Role::DTypeConstant},
    {"torch.int32", Role::DTypeConstant},
    {"torch.uint8", Role::DTypeConstant},
    {"torch.bool", Role::DTypeConstant},
    // DeepSpeed's records: class instances kept as their class name, the
    // constructor's arguments and the attributes BUILD sets.
    {"deepspeed.runtime.fp16.loss_scaler.LossScaler", Role::Record},
    {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", Role::Record},
    {"deepspeed.utils.tensor_fragment.fragment_address", Role::Record},
    {"deepspeed.runtime.zero.config.ZeroStageEnum", Role::Enum},
    {"deepspeed.checkpoint.constants.ZeroStageEnum", Role::Enum},
};

}  // namespace

const Allowed* find_allowed(const std::string& name) {
  for (const Allowed& a : kAllowed)
    if (name == a.name) return &a;
  return nullptr;
}

const std::vector<Allowed>& allowed_table() {
  static const std::vector<Allowed> table(std::begin(kAllowed), std::end(kAllowed));
  return table;
}

const std::vector<std::string>& allowed_globals() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Allowed& a : allowed_table()) v.emplace_back(a.name);
    return v;
  }();
  return names;
}

}  // namespace zero::torchsave
