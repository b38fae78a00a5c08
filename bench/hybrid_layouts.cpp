// Rank layouts compared on one GPT and one global batch, in one run on the
// same ranks: data parallelism alone (ZeRO stage 1 and 3) against tensor
// parallelism by AutoTP (tp x dp at stage 1). Per layout: tokens/s and its
// ratio to DP-only stage 1 (measured in this run), this rank's model states
// and measured activation peak, and the bytes each rank sent per step on
// its tensor- and data-parallel groups by collective kind, beside the
// theory: tp all-reduces 4 per block per micro-step (attention and MLP,
// forward and backward) of micro x context x width fp32 elements, each a
// ring's 2(tp-1)/tp of it; ZeRO's reduce-scatter and all-gather of the
// rank's (tp-split) parameters, (dp-1)/dp each, a third more gathers at
// stage 3 (forward and backward).
// Pipeline layouts (pp2 x dp2, tp2 x pp2) join when pipeline parallelism
// lands. Usage (every rank, through zero-run):
//   zero-run --nproc 4 bench_hybrid_layouts [--depth 4 --width 256 --heads 8 --context 128 --global 16 --steps 6]
// Rank 0 prints a markdown table.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Layout {
  int tp, stage;
};

struct Bytes {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
};

Bytes per_step(const zero::comm::CommStats& before, const zero::comm::CommStats& after, int64_t steps) {
  const double n = static_cast<double>(steps);
  return {(after.all_reduce_bytes - before.all_reduce_bytes) / n,
          (after.reduce_scatter_bytes - before.reduce_scatter_bytes) / n,
          (after.all_gather_bytes - before.all_gather_bytes) / n};
}

std::string mb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes / 1e6);
  return text;
}

std::string config_for(const Layout& l, int64_t micro) {
  zero_bench::TrainSetup s;
  s.stage = l.stage;
  s.micro_batch = micro;
  std::string json = zero_bench::ds_config(s);
  return json.substr(0, json.size() - 1) + ", \"tensor_parallel\": {\"autotp_size\": " + std::to_string(l.tp) + "}}";
}

}  // namespace

int main(int argc, char** argv) {
  zero_bench::Flags flags(argc, argv,
                          {{"depth", "4"}, {"width", "256"}, {"heads", "8"}, {"context", "128"}, {"global", "16"},
                           {"steps", "6"}, {"warmup", "2"}});
  auto world = zero::comm::init_process_group();
  const int ranks = world->size();
  zero_examples::GPTOptions o;
  o.vocab_size = 256;
  o.context = flags.num("context");
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  const int64_t global = flags.num("global"), steps = flags.num("steps"), warmup = flags.num("warmup");

  std::vector<Layout> layouts = {{1, 1}, {1, 3}};
  for (int tp = 2; tp <= ranks; tp *= 2) {
    if (ranks % tp == 0 && o.heads % tp == 0) layouts.push_back({tp, 1});
  }
  if (world->rank() == 0) {
    std::printf("GPT depth %lld, width %lld, heads %lld, context %lld; global batch %lld sequences; %d ranks x %d "
                "thread(s); fp32 AdamW; %lld measured steps after %lld warm-up\n\n",
                (long long)o.depth, (long long)o.width, (long long)o.heads, (long long)o.context, (long long)global,
                ranks, at::get_num_threads(), (long long)steps, (long long)warmup);
    std::printf("| layout | stage | tokens/s | vs DP stage 1 | model states MB/rank | activations MB/rank | tp all-reduce "
                "MB/step (theory) | dp reduce-scatter + all-gather MB/step (theory) |\n|---|---|---|---|---|---|---|---|\n");
  }
  double reference = 0;
  for (const Layout& l : layouts) {
    const int dp = ranks / l.tp;
    const int64_t micro = global / dp;
    torch::manual_seed(0);
    zero_examples::GPT model(o);
    zero::InitOptions init;
    init.group = world;
    auto engine = zero::initialize(zero::Config::from_json(config_for(l, micro)), model, init);
    const auto& mesh = engine.mesh();
    const int d = mesh.coordinates().dp;
    auto run = [&](int64_t n, int64_t first) {
      for (int64_t step = first; step < first + n; ++step) {
        torch::manual_seed(1000 + step);
        const at::Tensor all = torch::randint(o.vocab_size, {global, o.context + 1}, torch::kLong);
        const at::Tensor mine = all.slice(0, d * micro, (d + 1) * micro);
        engine.backward(model->loss(mine.slice(1, 0, o.context), mine.slice(1, 1, o.context + 1)));
        engine.step();
      }
    };
    run(warmup, 0);
    world->barrier();
    const auto tp_before = mesh.tp_group()->stats(), dp_before = mesh.dp_group()->stats();
    const auto start = Clock::now();
    run(steps, warmup);
    world->barrier();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const Bytes tp_bytes = l.tp > 1 ? per_step(tp_before, mesh.tp_group()->stats(), steps) : Bytes{};
    const Bytes dp_bytes = dp > 1 ? per_step(dp_before, mesh.dp_group()->stats(), steps) : Bytes{};

    int64_t local = 0;
    for (const auto& p : model->parameters()) local += p.numel();
    const double tp_theory = l.tp > 1 ? 4.0 * o.depth * micro * o.context * o.width * 4 * 2.0 * (l.tp - 1) / l.tp : 0;
    const double dp_theory = dp > 1 ? (l.stage == 3 ? 3.0 : 2.0) * local * 4 * (dp - 1) / dp : 0;
    const double tokens = static_cast<double>(global * o.context * steps) / seconds;
    if (reference == 0) reference = tokens;
    const zero::MemoryReport m = engine.memory_report();
    if (world->rank() == 0) {
      const std::string name = l.tp > 1 ? "tp" + std::to_string(l.tp) + " x dp" + std::to_string(dp)
                                         : "dp" + std::to_string(dp);
      std::printf("| %s | %d | %.0f | %.2fx | %s | %s | %s (%s) | %s (%s) |\n", name.c_str(), l.stage, tokens,
                  tokens / reference, mb(m.total()).c_str(), mb(m.activations_peak).c_str(),
                  mb(tp_bytes.all_reduce).c_str(), mb(tp_theory).c_str(),
                  mb(dp_bytes.reduce_scatter + dp_bytes.all_gather + dp_bytes.all_reduce).c_str(),
                  mb(dp_theory).c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
