#pragma once
// What the Llama tests compare against: the fixtures of tests/fixtures/llama
// (tools/fixtures/make_llama_fixtures.py) and transformers' logits saved there.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace llama_reference {

inline const std::filesystem::path kFixtures = ZERO_FIXTURES "/llama";

// The first `ctx` ids of the fixtures' token file (uint16).
inline std::vector<int64_t> first_sequence(int64_t ctx) {
  std::ifstream in(kFixtures / "tokens.bin", std::ios::binary);
  std::vector<int64_t> tokens;
  for (uint16_t t; static_cast<int64_t>(tokens.size()) < ctx && in.read(reinterpret_cast<char*>(&t), 2);) tokens.push_back(t);
  return tokens;
}

// transformers' float32 logits of fixture `name` on first_sequence().
inline at::Tensor transformers_logits(const std::string& name) {
  zero::ckpt::SafetensorsFile reference(kFixtures / name / "logits.safetensors");
  const auto& entry = reference.entries().at("logits");
  at::Tensor want = torch::empty(entry.shape, torch::kFloat);
  reference.read("logits", 0, entry.end - entry.begin, want.data_ptr());
  return want;
}

// The largest difference, relative to the largest reference value.
inline double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

}  // namespace llama_reference
