// zero::fp32_state_dict_from_checkpoint: a checkpoint's weights without an
// engine (DeepSpeed's get_fp32_state_dict_from_zero_checkpoint).
#include <torch/torch.h>

#include <cstring>

#include "ckpt/checkpoint.h"
#include "engine/checkpoint_io.h"
#include "zero/engine.h"

namespace zero {

std::vector<std::pair<std::string, at::Tensor>> fp32_state_dict_from_checkpoint(const std::string& dir,
                                                                                const std::string& tag) {
  ckpt::ConsolidatedTensors source(dir, tag.empty() ? ckpt::read_latest(dir) : tag);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < source.tensors().size(); ++i) {
    const ckpt::TensorData& t = source.tensors()[i];
    at::Tensor values = torch::empty(t.shape, torch::TensorOptions().dtype(engine::from_ckpt(t.dtype)));
    std::memcpy(values.data_ptr(), source.read(i), t.bytes);
    out.emplace_back(t.name, std::move(values));
  }
  return out;
}

}  // namespace zero
