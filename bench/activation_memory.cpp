// Activation memory and step time with and without activation checkpointing
// on the example GPT, across context lengths, through the engine on CPU
// ranks; the same shape's estimate beside each measured figure.
//
//   zero-run --nproc N bench_activation_memory --context S --checkpoint K --out am.jsonl   (one run)
//   bench_activation_memory --mode report --in am.jsonl --budget-mb 256 --svg chart.svg      (table, chart)
//   common: [--depth 8] [--width 256] [--heads 4] [--micro 2] [--stage 2] [--warmup 1] [--steps 3]
//
// --checkpoint K: K of the depth blocks recompute (number_checkpoints, evenly
// spaced; 0: none). bench/run_activation_memory.sh runs the grid, ROUNDS
// times; the report pools the rounds. Measured per rank, the largest over
// the ranks: engine.memory_report().activations_peak (the bytes a forward
// left allocated for its backward, read from the heap allocator), peak RSS,
// and the median step time and forward time (the slowest rank's). The
// floor beside the step ratio is what one more forward of the K blocks
// costs at most: 1 + (K / depth) x forward / step of the run without
// checkpointing (its forward includes the embedding and head, so the floor
// is a little high).
// The estimate beside it is activations/estimate.h's kept_activation_bytes,
// what forward leaves for backward; the recompute's one block comes on top
// during backward (in peak RSS, not in activations_peak).
// Goals (information only): with checkpointing, at least 3x the longest
// context that fits the activation budget without it, at depth 8; step
// time at most 1.4x (the price of one more forward).
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "activations/estimate.h"
#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"
#include "median.h"

namespace {

using json = nlohmann::json;
using zero_examples::Batcher;
using zero_examples::Corpus;
using zero_examples::GPT;
using zero_examples::GPTOptions;
using Clock = std::chrono::steady_clock;

int run_one(const zero_bench::Flags& flags) {
  auto world = zero::comm::init_process_group();
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world->size()));
  Corpus corpus;
  Batcher train(corpus.train_tokens(), zero_examples::BatcherOptions{0, 1});
  GPTOptions o;
  o.vocab_size = corpus.vocab_size();
  o.context = flags.num("context");
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  o.dropout = 0.1;
  torch::manual_seed(0);
  GPT model(o);
  zero_bench::TrainSetup setup;
  setup.stage = static_cast<int>(flags.num("stage"));
  setup.micro_batch = flags.num("micro");
  std::string config = zero_bench::ds_config(setup);
  const int64_t checkpointed = flags.num("checkpoint");
  const bool checkpoint = checkpointed > 0;
  if (checkpoint) {
    config = config.substr(0, config.rfind('}')) + ", \"activation_checkpointing\": {\"number_checkpoints\": " +
             std::to_string(checkpointed) + "}}";
  }
  zero::InitOptions init;
  init.group = world;
  zero::Engine engine = zero::initialize(zero::Config::from_json(config), model, init);
  const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");
  std::vector<double> times, forward_times;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    auto batch = train.next_batch(setup.micro_batch, o.context, world->rank(), world->size(), step, 0);
    world->barrier();
    const auto start = Clock::now();
    at::Tensor loss = model->loss(batch.inputs, batch.targets);
    const auto forward_done = Clock::now();
    engine.backward(loss);
    engine.step();
    at::Tensor t = torch::tensor({std::chrono::duration<double>(Clock::now() - start).count(),
                                  std::chrono::duration<double>(forward_done - start).count()},
                                 torch::kDouble);
    world->all_reduce(t, zero::comm::ReduceOp::Max);
    if (step >= warmup) {
      times.push_back(t[0].item<double>());
      forward_times.push_back(t[1].item<double>());
    }
  }
  at::Tensor figures = torch::tensor({static_cast<double>(engine.memory_report().activations_peak),
                                      static_cast<double>(zero_bench::peak_rss_bytes())},
                                     torch::kDouble);
  world->all_reduce(figures, zero::comm::ReduceOp::Max);
  if (world->rank() == 0) {
    zero::ActivationShape shape;
    shape.micro_batch = setup.micro_batch, shape.context = o.context, shape.width = o.width, shape.depth = o.depth;
    shape.heads = o.heads, shape.vocab = o.vocab_size, shape.bytes_per_element = 4;
    json j = {{"bench", "activation_memory"}, {"context", o.context}, {"depth", o.depth}, {"width", o.width},
              {"heads", o.heads}, {"micro", setup.micro_batch}, {"stage", setup.stage}, {"world", world->size()},
              {"checkpoint", checkpoint}, {"checkpointed", checkpointed}, {"params", model->num_parameters()},
              {"activations_peak", figures[0].item<double>()}, {"peak_rss", figures[1].item<double>()},
              {"estimate", zero::kept_activation_bytes(shape, checkpointed)},
              {"estimate_backward_peak", zero::activation_bytes(shape, checkpointed)},
              {"step_s", zero_bench::median(times)}, {"step_times", times}, {"forward_times", forward_times}};
    std::ofstream(flags.str("out"), std::ios::app) << j.dump() << "\n";
    std::printf("context %lld, checkpointing %lld blocks: activations %.1f MB (estimate %.1f MB), peak RSS %.1f MB, step %.1f ms\n",
                (long long)o.context, (long long)checkpointed, figures[0].item<double>() / 1e6,
                j["estimate"].get<double>() / 1e6, figures[1].item<double>() / 1e6, zero_bench::median(times) * 1e3);
  }
  return 0;
}

// A line chart of activation MB against context, both ways, measured and
// estimated, with the budget as a horizontal line (plain SVG).
void write_svg(const std::string& path, const std::map<int64_t, json>& off, const std::map<int64_t, json>& on,
               double budget_mb) {
  const double W = 640, H = 400, left = 70, right = 20, top = 30, bottom = 50;
  double ymax = budget_mb;
  int64_t xmin = INT64_MAX, xmax = 0;
  for (const auto* side : {&off, &on}) {
    for (const auto& [context, j] : *side) {
      ymax = std::max({ymax, j["activations_peak"].get<double>() / 1e6, j["estimate"].get<double>() / 1e6});
      xmin = std::min(xmin, context);
      xmax = std::max(xmax, context);
    }
  }
  auto x = [&](double c) { return left + (std::log2(c) - std::log2(double(xmin))) / std::max(1e-9, std::log2(double(xmax)) - std::log2(double(xmin))) * (W - left - right); };
  auto y = [&](double mb) { return H - bottom - mb / (ymax * 1.05) * (H - top - bottom); };
  std::ofstream svg(path);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"18\">Activation memory per rank (MB) against context, GPT depth "
      << off.begin()->second["depth"] << ", width " << off.begin()->second["width"] << "</text>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << H - bottom << "\" x2=\"" << W - right << "\" y2=\"" << H - bottom
      << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
      << H - bottom << "\" stroke=\"black\"/>\n";
  for (int64_t c = xmin; c <= xmax; c *= 2) {
    svg << "<text x=\"" << x(c) << "\" y=\"" << H - bottom + 18 << "\" text-anchor=\"middle\">" << c << "</text>\n";
  }
  svg << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">context (tokens)</text>\n";
  for (int i = 0; i <= 4; ++i) {
    const double mb = ymax * 1.05 * i / 4;
    svg << "<text x=\"" << left - 6 << "\" y=\"" << y(mb) + 4 << "\" text-anchor=\"end\">" << std::lround(mb) << "</text>\n";
  }
  svg << "<line x1=\"" << left << "\" y1=\"" << y(budget_mb) << "\" x2=\"" << W - right << "\" y2=\"" << y(budget_mb)
      << "\" stroke=\"gray\" stroke-dasharray=\"6,4\"/>\n<text x=\"" << W - right - 4 << "\" y=\"" << y(budget_mb) - 5
      << "\" text-anchor=\"end\" fill=\"gray\">budget " << budget_mb << " MB</text>\n";
  auto line = [&](const std::map<int64_t, json>& side, const char* key, const char* color, const char* dash, const char* label, int row) {
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\"" << dash << " points=\"";
    for (const auto& [context, j] : side) svg << x(context) << "," << y(j[key].get<double>() / 1e6) << " ";
    svg << "\"/>\n<text x=\"" << left + 10 << "\" y=\"" << top + 14 * row << "\" fill=\"" << color << "\">" << label << "</text>\n";
  };
  line(off, "activations_peak", "#c0392b", "", "without checkpointing, measured", 1);
  line(off, "estimate", "#c0392b", " stroke-dasharray=\"3,3\"", "without checkpointing, estimate", 2);
  line(on, "activations_peak", "#2471a3", "", "checkpointing every block, measured", 3);
  line(on, "estimate", "#2471a3", " stroke-dasharray=\"3,3\"", "checkpointing every block, estimate", 4);
  svg << "</svg>\n";
}

// The runs of one (blocks recomputed, context), pooled over the rounds:
// the largest memory figures, every step and forward time.
json pool(const json& a, const json& b) {
  json p = a;
  p["activations_peak"] = std::max(a["activations_peak"].get<double>(), b["activations_peak"].get<double>());
  p["peak_rss"] = std::max(a["peak_rss"].get<double>(), b["peak_rss"].get<double>());
  for (const char* key : {"step_times", "forward_times"}) {
    for (const auto& t : b.value(key, json::array())) p[key].push_back(t);
  }
  return p;
}

double median_of(const json& j, const char* key) { return zero_bench::median(j.value(key, std::vector<double>{})); }

int run_report(const zero_bench::Flags& flags) {
  std::ifstream file(flags.str("in"));
  if (!file) throw std::runtime_error("cannot read " + flags.str("in"));
  std::map<int64_t, std::map<int64_t, json>> runs;  // blocks recomputed -> context -> pooled runs
  std::string text;
  int64_t depth = 0;
  while (std::getline(file, text)) {
    if (text.empty()) continue;
    json j = json::parse(text);
    if (j.value("bench", "") != "activation_memory") continue;
    depth = j["depth"].get<int64_t>();
    const int64_t k = j.value("checkpointed", j["checkpoint"].get<bool>() ? depth : int64_t{0});
    auto& slot = runs[k][j["context"].get<int64_t>()];
    slot = slot.is_null() ? j : pool(slot, j);
  }
  if (!runs.count(0) || !runs.count(depth)) throw std::runtime_error("need runs with no block and every block checkpointed");
  const std::map<int64_t, json>& off = runs[0];
  const std::map<int64_t, json>& on = runs[depth];
  const json& any = off.begin()->second;
  const double budget = static_cast<double>(flags.num("budget-mb"));
  std::printf("\n## activation memory, GPT depth %lld, width %lld, %lld heads, micro batch %lld, fp32, stage %lld, "
              "%lld ranks x 1 thread; per rank, the largest over the ranks; step times: medians of all measured steps\n\n",
              (long long)depth, (long long)any["width"].get<int64_t>(), (long long)any["heads"].get<int64_t>(),
              (long long)any["micro"].get<int64_t>(), (long long)any["stage"].get<int64_t>(),
              (long long)any["world"].get<int64_t>());
  // floor: one more forward of k of the depth blocks, from the run without checkpointing.
  auto floor_of = [&](const json& plain, int64_t k) {
    return 1.0 + static_cast<double>(k) / static_cast<double>(depth) * median_of(plain, "forward_times") /
                     median_of(plain, "step_times");
  };
  std::printf("| context | activations MB off / on | estimate MB off / on | on / off | peak RSS MB off / on | step ms off / on | step on / off | floor |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::map<int64_t, std::vector<double>> slowdowns, floors;  // by blocks recomputed
  std::map<int64_t, int64_t> longest;                        // by blocks recomputed
  for (const auto& [k, side] : runs) {
    for (const auto& [context, j] : side) {
      if (j["activations_peak"].get<double>() / 1e6 <= budget) longest[k] = std::max(longest[k], context);
      auto plain = off.find(context);
      if (k == 0 || plain == off.end()) continue;
      slowdowns[k].push_back(median_of(j, "step_times") / median_of(plain->second, "step_times"));
      floors[k].push_back(floor_of(plain->second, k));
    }
  }
  for (const auto& [context, a] : off) {
    auto it = on.find(context);
    if (it == on.end()) continue;
    const json& b = it->second;
    const double a_step = median_of(a, "step_times"), b_step = median_of(b, "step_times");
    std::printf("| %lld | %.1f / %.1f | %.1f / %.1f | %.3f | %.1f / %.1f | %.1f / %.1f | %.3f | %.3f |\n", (long long)context,
                a["activations_peak"].get<double>() / 1e6, b["activations_peak"].get<double>() / 1e6,
                a["estimate"].get<double>() / 1e6, b["estimate"].get<double>() / 1e6,
                b["activations_peak"].get<double>() / a["activations_peak"].get<double>(), a["peak_rss"].get<double>() / 1e6,
                b["peak_rss"].get<double>() / 1e6, a_step * 1e3, b_step * 1e3, b_step / a_step, floor_of(a, depth));
  }
  if (runs.size() > 2) {
    std::printf("\nFewer blocks recomputed (number_checkpoints):\n\n| context | blocks recomputed | activations MB | estimate MB | peak RSS MB | step ms | step / off | floor |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& [k, side] : runs) {
      if (k == 0 || k == depth) continue;
      for (const auto& [context, j] : side) {
        auto plain = off.find(context);
        if (plain == off.end()) continue;
        const double step = median_of(j, "step_times");
        std::printf("| %lld | %lld of %lld | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f |\n", (long long)context, (long long)k,
                    (long long)depth, j["activations_peak"].get<double>() / 1e6, j["estimate"].get<double>() / 1e6,
                    j["peak_rss"].get<double>() / 1e6, step * 1e3, step / median_of(plain->second, "step_times"),
                    floor_of(plain->second, k));
      }
    }
  }
  std::printf("\n");
  for (const auto& [k, side] : runs) {
    if (k == 0) continue;
    const double ratio = longest[0] > 0 ? double(longest[k]) / double(longest[0]) : NAN;
    const double slow = zero_bench::median(slowdowns[k]);
    std::printf("%lld of %lld blocks recomputed: longest context whose activations fit %.0f MB per rank %lld, without "
                "checkpointing %lld (%.1fx; goal >= 3x: %s, within the contexts run); step time with / without, median "
                "over contexts %.3f, floor %.3f (goal <= 1.4: %s)\n",
                (long long)k, (long long)depth, budget, (long long)longest[k], (long long)longest[0], ratio,
                ratio >= 3 ? "pass" : "miss", slow, zero_bench::median(floors[k]), slow <= 1.4 ? "pass" : "miss");
  }
  if (!flags.str("svg").empty()) write_svg(flags.str("svg"), off, on, budget);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"mode", "run"}, {"context", "256"}, {"checkpoint", "0"}, {"depth", "8"}, {"width", "256"},
                             {"heads", "4"}, {"micro", "2"}, {"stage", "2"}, {"warmup", "1"}, {"steps", "3"},
                             {"out", "activation_memory.jsonl"}, {"in", "activation_memory.jsonl"},
                             {"budget-mb", "256"}, {"svg", ""}});
    const std::string mode = flags.str("mode");
    if (mode == "run") return run_one(flags);
    if (mode == "report") return run_report(flags);
    throw std::invalid_argument("--mode must be run or report; got '" + mode + "'");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_activation_memory: %s\n", e.what());
    return 1;
  }
}
