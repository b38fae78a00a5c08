// Rank layouts compared on one GPT and one global batch, in one run on the
// same ranks: data parallelism alone (ZeRO stage 1 and 3) against tensor
// parallelism by AutoTP (tp x dp at stage 1) and pipeline parallelism (the
// same GPT as pipeline layers split by "type:Block", 1F1B over --micro
// micro-batches per step: pp x dp and tp x pp at stage 1). Per layout:
// tokens/s and its ratio to DP-only stage 1 (measured in this run), this
// rank's model states and measured activation peak, and the bytes each rank
// sent per step by kind, beside the theory: tp all-reduces 4 per block per
// micro-batch (attention and MLP, forward and backward) of micro x context
// x width fp32 elements, each a ring's 2(tp-1)/tp of it; ZeRO's
// reduce-scatter and all-gather of the rank's (tp-split) parameters,
// (dp-1)/dp each, a third more gathers at stage 3 (forward and backward);
// a pipeline stage sends one activation (or its gradient) of micro x
// context x width fp32 per micro-batch to each neighbour. The pipeline
// bubble is the share of a step the stages spent waiting for their
// neighbours (mean over ranks), beside 1F1B's (pp-1)/(m+pp-1).
// Usage (every rank, through zero-run):
//   zero-run --nproc 4 bench_hybrid_layouts [--depth 4 --width 256 --heads 8 --context 128 --global 16 --micro 4 --steps 6]
// Rank 0 prints a markdown table.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/pipeline.h"
#include "zero/zero.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Layout {
  int tp, pp, stage;
};

// The GPT as pipeline layers: embeddings (tied with the LM head), blocks
// (zero::tp::Linear inside, for AutoTP), ln_f, the head x @ wte.weight^T.
struct EmbeddingsImpl : torch::nn::Module {
  explicit EmbeddingsImpl(const zero_examples::GPTOptions& o) {
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size, o.width));
    wpe = register_module("wpe", torch::nn::Embedding(o.context, o.width));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(wte->weight, 0.0, 0.02);
    torch::nn::init::normal_(wpe->weight, 0.0, 0.02);
  }
  at::Tensor forward(const at::Tensor& tokens) {
    return wte(tokens) + wpe(torch::arange(tokens.size(1), tokens.options()));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
};
TORCH_MODULE(Embeddings);

std::vector<zero::pipe::Layer> gpt_layers(const zero_examples::GPTOptions& o) {
  std::vector<zero::pipe::Layer> layers;
  layers.push_back(zero::pipe::Layer::tied("embed", [o] { return torch::nn::AnyModule(Embeddings(o)); }));
  for (int64_t i = 0; i < o.depth; ++i) {
    layers.emplace_back([o] {
      return torch::nn::AnyModule(zero_examples::Block(o));  // it sets its own weights
    });
  }
  layers.emplace_back([o] { return torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width}))); });
  layers.push_back(zero::pipe::Layer::tied("embed", nullptr, [](torch::nn::Module& e, const at::Tensor& x) {
    return torch::linear(x, e.named_parameters()["wte.weight"]);
  }));
  return layers;
}

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

std::string config_for(const Layout& l, int64_t micro, int64_t gas) {
  zero_bench::TrainSetup s;
  s.stage = l.stage;
  s.micro_batch = micro;
  std::string json = zero_bench::ds_config(s);
  const std::string one = "\"gradient_accumulation_steps\": 1";
  json.replace(json.find(one), one.size(), "\"gradient_accumulation_steps\": " + std::to_string(gas));
  return json.substr(0, json.size() - 1) + ", \"tensor_parallel\": {\"autotp_size\": " + std::to_string(l.tp) +
         "}, \"pipeline\": {\"stages\": " + std::to_string(l.pp) + "}}";
}

}  // namespace

int main(int argc, char** argv) {
  zero_bench::Flags flags(argc, argv,
                          {{"depth", "4"}, {"width", "256"}, {"heads", "8"}, {"context", "128"}, {"global", "16"},
                           {"micro", "4"}, {"steps", "6"}, {"warmup", "2"}});
  auto world = zero::comm::init_process_group();
  const int ranks = world->size();
  zero_examples::GPTOptions o;
  o.vocab_size = 256;
  o.context = flags.num("context");
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  const int64_t global = flags.num("global"), steps = flags.num("steps"), warmup = flags.num("warmup");
  const int64_t pipe_micro = flags.num("micro");  // micro-batches per step with pipeline stages

  std::vector<Layout> layouts = {{1, 1, 1}, {1, 1, 3}};
  for (int tp = 2; tp <= ranks; tp *= 2) {
    if (ranks % tp == 0 && o.heads % tp == 0) layouts.push_back({tp, 1, 1});
  }
  if (ranks % 2 == 0 && o.depth >= 2) layouts.push_back({1, 2, 1});
  if (ranks % 4 == 0 && o.depth >= 2 && o.heads % 2 == 0) layouts.push_back({2, 2, 1});
  if (world->rank() == 0) {
    std::printf("GPT depth %lld, width %lld, heads %lld, context %lld; global batch %lld sequences (%lld micro-batches "
                "per step with pipeline stages); %d ranks x %d thread(s); fp32 AdamW; %lld measured steps after %lld "
                "warm-up\n\n",
                (long long)o.depth, (long long)o.width, (long long)o.heads, (long long)o.context, (long long)global,
                (long long)pipe_micro, ranks, at::get_num_threads(), (long long)steps, (long long)warmup);
    std::printf("| layout | stage | tokens/s | vs DP stage 1 | model states MB/rank | activations MB/rank | tp all-reduce "
                "MB/step (theory) | dp reduce-scatter + all-gather MB/step (theory) | pp send MB/step (theory) | "
                "bubble (1F1B theory) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  double reference = 0;
  for (const Layout& l : layouts) {
    const int dp = ranks / (l.tp * l.pp);
    const int64_t gas = l.pp > 1 ? pipe_micro : 1;
    const int64_t micro = global / (dp * gas);
    auto mesh = std::make_shared<zero::Mesh>(world, l.tp, l.pp);
    torch::manual_seed(0);
    std::shared_ptr<torch::nn::Module> module;
    zero_examples::GPT gpt{nullptr};
    if (l.pp > 1) {
      zero::pipe::PipelineOptions po;
      po.partition = "type:Block";
      po.loss = [](const at::Tensor& logits, const at::Tensor& targets) {
        return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
      };
      module = std::make_shared<zero::pipe::PipelineModule>(gpt_layers(o), mesh, po);
    } else {
      gpt = zero_examples::GPT(o);
      module = gpt.ptr();
    }
    zero::InitOptions init;
    init.mesh = mesh;
    auto engine = zero::initialize(zero::Config::from_json(config_for(l, micro, gas)), module, init);
    const int d = mesh->coordinates().dp;
    auto run = [&](int64_t n, int64_t first) {
      for (int64_t step = first; step < first + n; ++step) {
        torch::manual_seed(1000 + step);
        const at::Tensor all = torch::randint(o.vocab_size, {global, o.context + 1}, torch::kLong);
        const at::Tensor mine = all.slice(0, d * micro * gas, (d + 1) * micro * gas);
        if (l.pp > 1) {
          int64_t m = 0;
          engine.train_batch([&]() -> zero::Engine::Batch {
            const at::Tensor rows = mine.slice(0, m * micro, (m + 1) * micro);
            ++m;
            return {rows.slice(1, 0, o.context), rows.slice(1, 1, o.context + 1)};
          });
        } else {
          engine.backward(gpt->loss(mine.slice(1, 0, o.context), mine.slice(1, 1, o.context + 1)));
          engine.step();
        }
      }
    };
    run(warmup, 0);
    world->barrier();
    const auto tp_before = mesh->tp_group()->stats(), dp_before = mesh->dp_group()->stats();
    const int64_t pp_before = engine.pipeline_bytes_sent();
    engine.take_step_times();
    const auto start = Clock::now();
    run(steps, warmup);
    const double mine_s = std::chrono::duration<double>(Clock::now() - start).count();
    world->barrier();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const Bytes tp_bytes = l.tp > 1 ? per_step(tp_before, mesh->tp_group()->stats(), steps) : Bytes{};
    const Bytes dp_bytes = dp > 1 ? per_step(dp_before, mesh->dp_group()->stats(), steps) : Bytes{};
    const double pp_bytes = static_cast<double>(engine.pipeline_bytes_sent() - pp_before) / steps;
    at::Tensor wait_share = torch::tensor({engine.take_step_times().pipeline_wait / mine_s}, torch::kDouble);
    world->all_reduce(wait_share, zero::comm::ReduceOp::Avg);

    int64_t local = 0;
    for (const auto& p : module->parameters()) local += zero::gathered_numel(p);  // whole at stage 3 too
    const double act = static_cast<double>(micro) * o.context * o.width * 4;
    // Blocks on this rank's stage: "type:Block" spreads them evenly.
    const double blocks = static_cast<double>(o.depth) / l.pp;
    const double tp_theory = l.tp > 1 ? 4.0 * blocks * gas * act * 2.0 * (l.tp - 1) / l.tp : 0;
    const double dp_theory = dp > 1 ? (l.stage == 3 ? 3.0 : 2.0) * local * 4 * (dp - 1) / dp : 0;
    const double pp_theory = l.pp > 1 ? gas * act : 0;  // rank 0 (the first stage) sends activations only
    const double bubble_theory = l.pp > 1 ? (l.pp - 1.0) / (gas + l.pp - 1.0) : 0;
    const double tokens = static_cast<double>(global * o.context * steps) / seconds;
    if (reference == 0) reference = tokens;
    const zero::MemoryReport m = engine.memory_report();
    if (world->rank() == 0) {
      std::string name;
      if (l.tp > 1) name += "tp" + std::to_string(l.tp) + " x ";
      if (l.pp > 1) name += "pp" + std::to_string(l.pp) + " x ";
      name += "dp" + std::to_string(dp);
      char pp_cell[64] = "-", bubble_cell[64] = "-";
      if (l.pp > 1) {
        std::snprintf(pp_cell, sizeof(pp_cell), "%s (%s)", mb(pp_bytes).c_str(), mb(pp_theory).c_str());
        std::snprintf(bubble_cell, sizeof(bubble_cell), "%.2f (%.2f)", wait_share.item<double>(), bubble_theory);
      }
      std::printf("| %s | %d | %.0f | %.2fx | %s | %s | %s (%s) | %s (%s) | %s | %s |\n", name.c_str(), l.stage, tokens,
                  tokens / reference, mb(m.total()).c_str(), mb(m.activations_peak).c_str(),
                  mb(tp_bytes.all_reduce).c_str(), mb(tp_theory).c_str(),
                  mb(dp_bytes.reduce_scatter + dp_bytes.all_gather + dp_bytes.all_reduce).c_str(),
                  mb(dp_theory).c_str(), pp_cell, bubble_cell);
      std::fflush(stdout);
    }
  }
  return 0;
}
