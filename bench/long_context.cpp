// One probe of the long-context benchmark (bench/run_long_context.sh): a
// fixed Llama config trained for one step at one context, sequence-parallel
// over all ranks, plain (transformers' eager attention, whole MLPs, whole
// logits) or long (blockwise attention, MLPs and loss over tiles: ALST);
// what the step held per rank.
//
//   zero-run --nproc P bench_long_context --context T --mode plain|long --out lines.jsonl
//
// Per rank, the largest over the ranks: the step's peak RSS above the RSS it
// started from, less the same for a step at a short context
// ("activation_peak": what grows with the context; the high-water mark is
// reset through /proc/self/clear_refs before each measured step, and a first
// step has made the engine's buffers. What a step holds at any context, such
// as the embedding's and head's dense gradients on their way to the reducer,
// is "step_floor"),
// the engine's activations_peak (what forward left for backward), the
// step's seconds, and the all-to-all bytes this rank sent in the step
// against the formula: forward and backward each move q, k, v (key/value
// heads repeated to P when fewer) and the attention's output, (P-1)/P of
// each, in every layer.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "gpt_bench.h"
#include "zero/llama.h"
#include "zero/zero.h"

namespace {

using json = nlohmann::json;
using zero::llama::LlamaConfig;
using zero::llama::LlamaForCausalLM;

// VmRSS or VmHWM of this process, in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

// Resets VmHWM to the current RSS (Linux's clear_refs value 5).
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

LlamaConfig bench_config(const zero_bench::Flags& flags) {
  LlamaConfig c;
  c.vocab_size = flags.num("vocab");
  c.hidden_size = flags.num("hidden");
  c.intermediate_size = flags.num("intermediate");
  c.num_hidden_layers = flags.num("layers");
  c.num_attention_heads = flags.num("heads");
  c.num_key_value_heads = flags.num("kv-heads");
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = int64_t{1} << 24;
  c.rms_norm_eps = 1e-5;
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  const zero_bench::Flags flags(argc, argv,
                                {{"context", "1024"}, {"mode", "long"}, {"out", ""}, {"vocab", "32000"},
                                 {"hidden", "512"}, {"intermediate", "1536"}, {"layers", "2"}, {"heads", "8"},
                                 {"kv-heads", "4"}, {"tile-tokens", "64"}, {"attention-block", "128"}, {"stage", "2"}});
  auto world = zero::comm::init_process_group();
  const int P = world->size();
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / P));
  const LlamaConfig config = bench_config(flags);
  const int64_t T = flags.num("context");
  const bool long_mode = flags.str("mode") == "long";
  torch::manual_seed(0);
  LlamaForCausalLM model(config);
  // SGD without momentum: no optimizer state, so the measured growth is the step's own.
  const std::string ds = R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": )" + std::to_string(P) +
                         R"(, "steps_per_print": 1000000000, "zero_optimization": {"stage": )" + flags.str("stage") +
                         R"(}, "optimizer": {"type": "SGD", "params": {"lr": 0.001}}})";
  zero::InitOptions init;
  init.group = world;
  zero::Engine engine = zero::initialize(zero::Config::from_json(ds), model, init);
  const auto& sp = engine.mesh().sp_group();
  model->sequence_parallel(sp);
  // ALST's tiles: one per tile-tokens tokens of this rank (DeepSpeed's TiledMLP
  // takes one per hidden_size; the loss's tiles hold tile-tokens x vocab logits).
  const int64_t local = T / P;
  const int64_t tiles = std::max<int64_t>(1, (local + flags.num("tile-tokens") - 1) / flags.num("tile-tokens"));
  if (long_mode) {
    model->tiled(tiles, tiles);
    model->blockwise_attention(flags.num("attention-block"));
  }
  auto step = [&](int64_t context, uint64_t seed) {
    torch::manual_seed(seed);
    at::Tensor rows = torch::randint(config.vocab_size, {1, context + 1}, torch::kLong);
    at::Tensor inputs = rows.narrow(1, 0, context), labels = rows.narrow(1, 1, context);
    at::Tensor loss = model->loss(zero::sp::own_tokens(inputs, sp), zero::sp::own_tokens(labels, sp));
    engine.backward(loss);
    engine.step();
    return loss.item<double>();
  };
  const int64_t short_context = 8 * P;
  step(short_context, 1);  // buffers made
  world->barrier();
  bool reset = reset_peak_rss();
  int64_t rss_before = status_bytes("VmRSS");
  step(short_context, 1);
  const int64_t floor = status_bytes("VmHWM") - rss_before;
  world->barrier();
  reset = reset_peak_rss() && reset;
  rss_before = status_bytes("VmRSS");
  const int64_t sent_before = sp->stats().all_to_all_bytes;
  const auto start = std::chrono::steady_clock::now();
  const double loss = step(T, 2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t sent = sp->stats().all_to_all_bytes - sent_before;
  at::Tensor mine = torch::tensor({static_cast<double>(status_bytes("VmHWM") - rss_before - floor),
                                   static_cast<double>(engine.memory_report().activations_peak),
                                   static_cast<double>(zero_bench::peak_rss_bytes()), seconds, static_cast<double>(floor)},
                                  torch::kDouble);
  world->all_reduce(mine, zero::comm::ReduceOp::Max);
  const int64_t kv = P > 1 ? std::max(config.num_key_value_heads, static_cast<int64_t>(P)) : config.num_key_value_heads;
  const int64_t elements = local * config.head_dim * (2 * config.num_attention_heads + 2 * kv);
  const int64_t formula = P > 1 ? 2 * config.num_hidden_layers * elements * 4 * (P - 1) / P : 0;
  if (world->rank() == 0) {
    const json line = {{"context", T},
                       {"sp", P},
                       {"mode", flags.str("mode")},
                       {"tiles", long_mode ? tiles : 1},
                       {"attention_block", long_mode ? flags.num("attention-block") : 0},
                       {"loss", loss},
                       {"activation_peak", mine[0].item<double>()},
                       {"activations_peak", mine[1].item<double>()},
                       {"peak_rss", mine[2].item<double>()},
                       {"step_s", mine[3].item<double>()},
                       {"step_floor", mine[4].item<double>()},
                       {"all_to_all_bytes", sent},
                       {"all_to_all_formula", formula},
                       {"peak_reset", reset},
                       {"threads", at::get_num_threads()}};
    std::printf("context %lld, sp %d, %s: activation peak %.1f MB, step %.2f s, all-to-all %lld bytes (formula %lld)\n",
                static_cast<long long>(T), P, flags.str("mode").c_str(), mine[0].item<double>() / 1e6,
                mine[3].item<double>(), static_cast<long long>(sent), static_cast<long long>(formula));
    if (!flags.str("out").empty()) std::ofstream(flags.str("out"), std::ios::app) << line.dump() << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_long_context: %s\n", e.what());
  return 1;
}
