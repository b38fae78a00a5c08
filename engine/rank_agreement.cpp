// Joining the ranks and what they agree on (rank_agreement.h).
#include "engine/rank_agreement.h"

#include <mutex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/env.h"

namespace zero::engine {

std::shared_ptr<comm::ProcessGroup> join(const Config& config) {
  // One rendezvous while the ranks are joined: a zero::Init and the
  // initialize after it, or an engine and a zero::Init beside it, share the
  // group joined first for as long as anything holds it.
  static std::mutex mutex;
  static std::weak_ptr<comm::ProcessGroup> joined;
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<comm::ProcessGroup> world = joined.lock()) return world;
  comm::GroupOptions options;
  if (!env::is_set("ZERO_COMM_TIMEOUT")) options.timeout = std::chrono::seconds(config.zero.comm_timeout_s);
  if (!env::is_set("ZERO_CUDA_BACKEND")) options.cuda_backend = config.zero.cuda_comm_backend;
  std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(options);
  joined = world;
  return world;
}

namespace {

// The config's leaves as "config.a.b" = value, in the order to_json writes them.
void flatten(const nlohmann::json& j, const std::string& path, comm::Facts& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), path + "." + it.key(), out);
  } else {
    out.emplace_back(path, j.dump());
  }
}

std::string tensor_fact(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type() << (t.requires_grad() ? " trainable" : " frozen");
  return out.str();
}

}  // namespace

comm::Facts config_facts(const Config& config) {
  comm::Facts facts;
  flatten(nlohmann::json::parse(config.to_json()), "config", facts);  // our own output: shallow
  return facts;
}

comm::Facts model_facts(torch::nn::Module& module, const ModelParams& params) {
  comm::Facts facts;
  for (const auto& p : module.named_parameters()) facts.emplace_back("parameter " + p.key(), tensor_fact(p.value()));
  for (const auto& b : module.named_buffers()) facts.emplace_back("buffer " + b.key(), tensor_fact(b.value()));
  for (size_t g = 0; g < params.groups.size(); ++g) {
    for (const auto& name : params.groups[g].names) facts.emplace_back("group of " + name, std::to_string(g));
  }
  return facts;
}

}  // namespace zero::engine
