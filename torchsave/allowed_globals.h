#pragma once
// The globals a checkpoint's pickle may name (Note [Restricted pickle] in
// pickle.h), and what each one becomes instead of being called.
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace zero::torchsave {

// What each allowed global becomes. Storage classes appear only inside a
// persistent id; dtypes (torch.float32, ...) are plain constants.
enum class Role {
  OrderedDict, Set, GetAttr, Encode, Size, Device, RebuildTensor, RebuildTensorV2, RebuildParameter,
  RebuildParameterWithState, RebuildFromType, TensorType, Record, Enum, StorageType, DTypeConstant
};

struct Allowed {
  const char* name;
  Role role;
  ckpt::DType dtype = ckpt::DType::U8;  // StorageType
};

// The entry for "module.name", or nullptr when it is not allowed.
const Allowed* find_allowed(const std::string& name);
// Every allowed name, in the table's order (for the refusal's message).
const std::vector<Allowed>& allowed_table();

}  // namespace zero::torchsave
