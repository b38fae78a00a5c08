// The pipeline module (include/zero/pipeline.h): the layers of one stage.
#include "zero/pipeline.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <regex>
#include <set>

#include "zero/error.h"

namespace zero::pipe {

Layer Layer::tied(std::string key, Build build, Forward forward) {
  Layer l(std::move(build));
  l.tied_key = std::move(key);
  l.forward = std::move(forward);
  return l;
}

Layer Layer::function(Function f) {
  Layer l(nullptr);
  l.function_only = std::move(f);
  return l;
}

// Minimises the largest part by dynamic programming over prefix sums
// (layers number in the hundreds at most).
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  if (parts < 1 || n < parts) {
    throw ConfigError("pipeline: cannot split " + std::to_string(n) + " layer(s) into " + std::to_string(parts) +
                      " stage(s); every stage needs at least one layer (use fewer pipeline.stages)");
  }
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[k][i]: the smallest largest part splitting the first i layers into k parts.
  std::vector<std::vector<int64_t>> best(parts + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n - (parts - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const int64_t worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (worst < best[k][i]) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> bounds(parts + 1, 0);
  bounds[parts] = n;
  for (int k = parts; k > 0; --k) bounds[k - 1] = cut[k][bounds[k]];
  return bounds;
}

namespace {

int64_t trainable_numel(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.requires_grad() ? p.numel() : 0;
  return n;
}

std::vector<int64_t> partition_weights(const std::string& method, const std::vector<std::shared_ptr<torch::nn::Module>>& built,
                                       const std::vector<bool>& first_use) {
  std::vector<int64_t> w(built.size(), 0);
  if (method == "uniform") return std::vector<int64_t>(built.size(), 1);
  if (method == "parameters") {
    for (size_t i = 0; i < built.size(); ++i) w[i] = built[i] && first_use[i] ? trainable_numel(*built[i]) : 0;
    return w;
  }
  if (method.rfind("type:", 0) == 0) {
    const std::string pattern = method.substr(5);
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::icase);
    } catch (const std::regex_error& e) {
      throw ConfigError("pipeline partition \"" + method + "\": the pattern is not a regular expression (" + e.what() + ")");
    }
    for (size_t i = 0; i < built.size(); ++i) w[i] = built[i] && std::regex_search(built[i]->name(), re) ? 1 : 0;
    return w;
  }
  throw ConfigError("pipeline partition \"" + method + "\" is not known; use \"parameters\", \"uniform\" or \"type:<regex>\"");
}

}  // namespace

PipelineModule::PipelineModule(std::vector<Layer> layers, std::shared_ptr<Mesh> mesh, PipelineOptions options)
    : mesh_(std::move(mesh)), options_(std::move(options)) {
  if (!mesh_) throw EngineError("PipelineModule needs the rank mesh (zero::Mesh) it runs on");
  const int stages = mesh_->shape().pp;
  stage_ = mesh_->coordinates().pp;
  const int n = static_cast<int>(layers.size());

  // Every layer, built in order on every rank (the same random draws on all).
  std::vector<std::shared_ptr<torch::nn::Module>> built(n);
  std::vector<torch::nn::AnyModule> any(n);
  std::vector<bool> first_use(n, true);
  std::map<std::string, int> first_of_key;
  for (int i = 0; i < n; ++i) {
    const Layer& l = layers[i];
    if (l.function_only) continue;
    if (!l.tied_key.empty()) {
      if (l.tied_key.find('.') != std::string::npos) {
        throw EngineError("pipeline layer " + std::to_string(i) + ": tied key \"" + l.tied_key +
                          "\" holds a '.', which parameter names cannot; choose another key");
      }
      auto it = first_of_key.find(l.tied_key);
      if (it != first_of_key.end()) {
        built[i] = built[it->second];
        any[i] = any[it->second];
        first_use[i] = false;
        continue;
      }
      first_of_key[l.tied_key] = i;
    }
    if (!l.build) {
      throw EngineError("pipeline layer " + std::to_string(i) + " has no builder" +
                        (l.tied_key.empty() ? "" : " (the first layer of tied key \"" + l.tied_key + "\" builds its module)"));
    }
    any[i] = l.build();
    built[i] = any[i].ptr();
  }

  const std::vector<int64_t> weights = partition_weights(options_.partition, built, first_use);
  if (options_.partition.rfind("type:", 0) == 0) {
    const int64_t matched = std::count(weights.begin(), weights.end(), 1);
    if (matched < stages) {
      throw ConfigError("pipeline partition \"" + options_.partition + "\" matches " + std::to_string(matched) +
                        " layer(s), fewer than the " + std::to_string(stages) +
                        " stages; name a type every stage can hold one of, or use \"parameters\"");
    }
  }
  bounds_ = partition_balanced(weights, stages);

  // Keep this stage's layers; the tied modules under their keys.
  std::map<std::string, std::set<int>> holders;  // key -> stages using it
  for (int s = 0; s < stages; ++s) {
    for (int i = bounds_[s]; i < bounds_[s + 1]; ++i) {
      if (!layers[i].tied_key.empty()) holders[layers[i].tied_key].insert(s);
    }
  }
  std::set<std::string> registered;
  for (int i = bounds_[stage_]; i < bounds_[stage_ + 1]; ++i) {
    Layer& l = layers[i];
    Local local{i, built[i], any[i], l.forward, l.function_only};
    if (built[i]) {
      if (l.tied_key.empty()) {
        register_module(std::to_string(i), built[i]);
      } else if (registered.insert(l.tied_key).second) {
        register_module("tied_" + l.tied_key, built[i]);
      }
    }
    local_.push_back(std::move(local));
  }

  // Tied modules on more than one stage: a group per key of the stages that
  // hold it (made by every rank of the pipeline group, in key order), and
  // the first stage's weights on all of them.
  for (const auto& [key, stages_of_key] : holders) {
    if (stages_of_key.size() < 2) continue;
    auto group = mesh_->pp_group()->new_group(std::vector<int>(stages_of_key.begin(), stages_of_key.end()));
    if (!group) continue;
    Tie tie{key, {}, {}, group};
    for (const auto& p : built[first_of_key.at(key)]->named_parameters()) {
      tie.names.push_back("tied_" + key + "." + p.key());
      tie.params.push_back(p.value());
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& p : tie.params) group->broadcast(p.data(), 0);
      for (auto& b : built[first_of_key.at(key)]->buffers()) group->broadcast(b, 0);
    }
    ties_.push_back(std::move(tie));
  }
}

at::Tensor PipelineModule::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (auto& l : local_) {
    if (l.function_only) {
      h = l.function_only(h);
    } else if (l.forward) {
      h = l.forward(*l.module, h);
    } else {
      h = l.any.forward(h);
    }
  }
  return h;
}

at::Tensor PipelineModule::loss(const at::Tensor& output, const at::Tensor& labels) const {
  if (!options_.loss) throw EngineError("PipelineModule: the last stage needs PipelineOptions::loss to train");
  return options_.loss(output, labels);
}

}  // namespace zero::pipe
