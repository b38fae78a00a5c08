#pragma once
// DeepSpeed's pickled lists, shapes and step counts, read as checked values:
// anything else is a CheckpointError naming `what` (the file and the key).
#include <cstdint>
#include <string>
#include <vector>

#include "torchsave/torch_save.h"

namespace zero::interop {

// The items of a Tuple or List value.
const std::vector<torchsave::Value*>& sequence(const torchsave::Value& v, const std::string& what);
// A list of dimensions, each in [0, 2^50].
std::vector<int64_t> shape_of(const torchsave::Value& v, const std::string& what);
// The elements of `shape`, at most 2^50.
int64_t numel_of(const std::vector<int64_t>& shape, const std::string& what);
// An int, a float holding one, or a one-element tensor's value, as a count
// (torch's optimizers keep "step" as a tensor, DeepSpeed's as an int).
int64_t step_count(const torchsave::TorchSaveFile& file, const torchsave::Value& v, const std::string& what);

}  // namespace zero::interop
