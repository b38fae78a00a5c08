// Turns bench_memory_peaks' JSON lines into a markdown table and an SVG
// grouped bar chart (hand-written SVG, no plotting library).
//
//   bench_memory_report --in peaks.jsonl --md memory_peaks.md --svg memory_peaks.svg
//
// Prints the markdown table on stdout too. When a (stage, dtype, reuse
// distance) appears on several lines, the last one counts: stage 3 may show
// twice, at DeepSpeed's default stage3_max_reuse_distance and at another.
// Every figure is the maximum over the ranks (the rank that needs the most
// memory sizes the job).
//
// Columns: held params / grads / fp32 master / optimizer (engine.memory_report
// after the last step), held model states (their sum), the formula's total
// (zero::estimate_memory, device), held/formula, peak RSS, the RSS increase
// over the process's own baseline before the model was built (what model,
// engine, activations and temporaries added), the part of it already reached
// when zero::initialize returned, and the peak RSS minus stage
// 0's peak RSS of the same dtype (the saving, negative when the stage uses
// less than stage 0). On CUDA the allocator's peak is shown too and the
// chart's third bar is that peak instead of the RSS increase.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

using nlohmann::json;

constexpr int64_t kDefaultReuse = 1000000000;  // DeepSpeed's stage3_max_reuse_distance

struct Row {
  int stage = 0;
  std::string dtype;
  int world = 0;
  int64_t psi = 0;
  std::string device;
  int64_t params = 0, grads = 0, master = 0, optim = 0, states = 0;  // held, max over ranks
  int64_t formula = 0;
  int64_t peak_rss = 0, rss_increase = 0, init_increase = -1;
  int64_t cuda_peak = -1;
  int64_t gathered_peak = -1, gathered_estimate = -1;  // stage 3's units gathered at once, measured and bound
  int64_t reuse = -1;  // stage3_max_reuse_distance (-1: a line from before it was recorded)
  json line;
  // "3" or "3, reuse 0": the stage, and for stage 3 the reuse distance
  // when it is not DeepSpeed's default.
  std::string label() const {
    std::string text = std::to_string(stage);
    if (stage == 3 && reuse >= 0 && reuse != kDefaultReuse) text += ", reuse " + std::to_string(reuse);
    return text;
  }
};

const double kMiB = 1024.0 * 1024.0;

std::string mib(int64_t bytes, int precision = 1) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", precision, bytes / kMiB);
  return text;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string signed_mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%+.1f", bytes / kMiB);
  return text;
}

Row parse(const json& j) {
  Row r;
  r.line = j;
  r.stage = j.at("stage").get<int>();
  r.dtype = j.at("dtype").get<std::string>();
  r.world = j.at("world").get<int>();
  r.psi = j.at("params").get<int64_t>();
  r.device = j.value("device", "cpu");
  r.formula = j.at("estimate").at("model_states").get<int64_t>();
  r.gathered_estimate = j.value("estimate_gathered_params_max", int64_t(-1));
  r.reuse = j.value("stage3_max_reuse_distance", int64_t(-1));
  for (const auto& rank : j.at("ranks")) {
    const json& h = rank.at("held");
    r.params = std::max(r.params, h.at("params").get<int64_t>());
    r.grads = std::max(r.grads, h.at("gradients").get<int64_t>());
    r.master = std::max(r.master, h.at("fp32_master").get<int64_t>());
    r.optim = std::max(r.optim, h.at("optimizer_states").get<int64_t>());
    r.states = std::max(r.states, h.at("model_states").get<int64_t>());
    const int64_t peak = rank.at("peak_rss").get<int64_t>();
    r.peak_rss = std::max(r.peak_rss, peak);
    const int64_t baseline = rank.at("rss_baseline").get<int64_t>();
    r.rss_increase = std::max(r.rss_increase, peak - baseline);
    if (rank.contains("rss_after_init")) {
      r.init_increase = std::max(r.init_increase, rank.at("rss_after_init").get<int64_t>() - baseline);
    }
    if (rank.contains("gathered_peak")) r.gathered_peak = std::max(r.gathered_peak, rank.at("gathered_peak").get<int64_t>());
    if (!rank.at("cuda_peak").is_null()) r.cuda_peak = std::max(r.cuda_peak, rank.at("cuda_peak").get<int64_t>());
  }
  return r;
}

std::string markdown(const std::vector<Row>& rows) {
  std::map<std::string, int64_t> stage0_rss;
  for (const auto& r : rows) {
    if (r.stage == 0) stage0_rss[r.dtype] = r.peak_rss;
  }
  const bool cuda = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.cuda_peak >= 0; });
  std::ostringstream md;
  const Row& first = rows.front();
  const json& l = first.line;
  md << "Model-state memory per rank (MiB; max over ranks): GPT depth " << l.value("depth", 0) << ", width "
     << l.value("width", 0) << " (" << with_commas(first.psi) << " parameters), " << first.world << " ranks on "
     << first.device << ", AdamW, micro batch " << l.value("micro", 0) << " x context " << l.value("context", 0)
     << ", " << l.value("steps", 0) << " steps, reduce_bucket_size " << l.value("reduce_bucket_size", 0)
     << ".\n\n";
  md << "| stage | dtype | params | grads | fp32 master | optimizer | held total | formula total | held/formula "
        "| peak RSS | RSS increase | of which init | RSS vs stage 0 | gathered peak | gathered bound |"
     << (cuda ? " CUDA peak |" : "") << "\n";
  md << "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" << (cuda ? "---:|" : "") << "\n";
  for (const auto& r : rows) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%.3f", r.formula > 0 ? double(r.states) / r.formula : 0.0);
    auto base = stage0_rss.find(r.dtype);
    md << "| " << r.label() << " | " << r.dtype << " | " << mib(r.params) << " | " << mib(r.grads) << " | "
       << mib(r.master) << " | " << mib(r.optim) << " | " << mib(r.states) << " | " << mib(r.formula) << " | "
       << ratio << " | " << mib(r.peak_rss) << " | " << mib(r.rss_increase) << " | "
       << (r.init_increase >= 0 ? mib(r.init_increase) : std::string("n/a")) << " | "
       << (base == stage0_rss.end() ? std::string("n/a") : signed_mib(r.peak_rss - base->second)) << " | "
       << (r.stage == 3 && r.gathered_peak >= 0 ? mib(r.gathered_peak) : std::string("-")) << " | "
       << (r.stage == 3 && r.gathered_estimate >= 0 ? mib(r.gathered_estimate) : std::string("-")) << " |";
    if (cuda) md << " " << (r.cuda_peak >= 0 ? mib(r.cuda_peak) : std::string("n/a")) << " |";
    md << "\n";
  }
  md << "\nheld total = params + grads + fp32 master + optimizer as engine.memory_report() gives them after the "
        "last step (module buffers left out); formula total = zero::estimate_memory(...).device.total() for the "
        "same parameters, ranks, stage and dtype; RSS increase = peak RSS minus the process's peak RSS before "
        "the model was built (model, engine, activations, temporaries); of which init = the part already reached "
        "when zero::initialize returned (the model built in fp32, its flat copies); RSS vs stage 0 = peak RSS minus stage "
        "0's peak RSS in the same dtype; gathered peak = the most bytes of stage 3's units gathered at once "
        "(memory_report().gathered_params_peak), gathered bound = the estimate's gathered_params_max "
        "(the unit running and the one prefetched, plus what stage3_max_reuse_distance keeps gathered from "
        "forward for backward; reuse 0 releases each unit after use)."
     << (cuda ? "" : " CUDA peak: n/a (run on CPU).") << "\n";
  return md.str();
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

// A "nice" axis step: 1, 2 or 5 times a power of ten, about `target` ticks.
double nice_step(double max_value, int target) {
  const double raw = max_value / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

std::string svg(const std::vector<Row>& rows) {
  const bool cuda = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.cuda_peak >= 0; });
  struct Series {
    const char* name;
    const char* color;
  };
  const Series series[3] = {{"held model states (engine.memory_report)", "#4C72B0"},
                            {"formula (zero::estimate_memory)", "#DD8452"},
                            {cuda ? "CUDA allocator peak" : "peak RSS increase over the pre-model baseline",
                             "#55A868"}};
  auto value = [&](const Row& r, int s) -> double {
    if (s == 0) return r.states / kMiB;
    if (s == 1) return r.formula / kMiB;
    return (cuda ? std::max<int64_t>(r.cuda_peak, 0) : r.rss_increase) / kMiB;
  };
  double vmax = 1.0;
  for (const auto& r : rows) {
    for (int s = 0; s < 3; ++s) vmax = std::max(vmax, value(r, s));
  }
  const double step = nice_step(vmax, 6);
  const double top = std::ceil(vmax / step) * step;

  const int left = 80, right = 30, plot_top = 70, plot_h = 330, bottom = 120;
  const int group_w = 110, bar_w = 26;
  const int plot_w = static_cast<int>(rows.size()) * group_w;
  const int width = left + plot_w + right, height = plot_top + plot_h + bottom;
  auto y_of = [&](double v) { return plot_top + plot_h - v / top * plot_h; };

  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const Row& first = rows.front();
  std::ostringstream title;
  title << "Memory per rank by ZeRO stage: GPT " << with_commas(first.psi) << " parameters, " << first.world << " ranks, "
        << first.device;
  o << "<text x=\"" << width / 2 << "\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
    << escape(title.str()) << "</text>\n";
  // Legend.
  int lx = left;
  for (int s = 0; s < 3; ++s) {
    o << "<rect x=\"" << lx << "\" y=\"40\" width=\"12\" height=\"12\" fill=\"" << series[s].color << "\"/>\n";
    o << "<text x=\"" << lx + 16 << "\" y=\"50\" font-size=\"12\">" << escape(series[s].name) << "</text>\n";
    lx += 16 + static_cast<int>(std::string(series[s].name).size() * 6.6) + 18;
  }
  // Grid and y axis.
  for (double v = 0; v <= top + 1e-9; v += step) {
    const double y = y_of(v);
    o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_w << "\" y2=\"" << y
      << "\" stroke=\"#dddddd\"/>\n";
    o << "<text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" font-size=\"11\">"
      << (step < 1 ? std::to_string(v).substr(0, 4) : std::to_string(std::llround(v))) << "</text>\n";
  }
  o << "<line x1=\"" << left << "\" y1=\"" << plot_top << "\" x2=\"" << left << "\" y2=\"" << plot_top + plot_h
    << "\" stroke=\"black\"/>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << plot_top + plot_h << "\" x2=\"" << left + plot_w << "\" y2=\""
    << plot_top + plot_h << "\" stroke=\"black\"/>\n";
  o << "<text transform=\"translate(22," << plot_top + plot_h / 2
    << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">MiB per rank (max over ranks)</text>\n";
  // Bars.
  for (size_t g = 0; g < rows.size(); ++g) {
    const Row& r = rows[g];
    const double gx = left + g * group_w + (group_w - 3 * bar_w) / 2.0;
    for (int s = 0; s < 3; ++s) {
      const double v = value(r, s);
      const double y = y_of(v);
      o << "<rect x=\"" << gx + s * bar_w << "\" y=\"" << y << "\" width=\"" << bar_w - 2 << "\" height=\""
        << plot_top + plot_h - y << "\" fill=\"" << series[s].color << "\"><title>" << escape(series[s].name)
        << ": " << v << " MiB</title></rect>\n";
      o << "<text x=\"" << gx + s * bar_w + (bar_w - 2) / 2.0 << "\" y=\"" << y - 3
        << "\" text-anchor=\"middle\" font-size=\"9\">" << std::lround(v) << "</text>\n";
    }
    if (g > 0 && rows[g - 1].dtype != r.dtype) {  // a dashed line between dtypes
      const double sx = left + g * group_w;
      o << "<line x1=\"" << sx << "\" y1=\"" << plot_top << "\" x2=\"" << sx << "\" y2=\"" << plot_top + plot_h + 36
        << "\" stroke=\"#999999\" stroke-dasharray=\"4,3\"/>\n";
    }
    const double cx = left + g * group_w + group_w / 2.0;
    o << "<text x=\"" << cx << "\" y=\"" << plot_top + plot_h + 18 << "\" text-anchor=\"middle\" font-size=\"12\">"
      << "stage " << r.label() << "</text>\n";
    o << "<text x=\"" << cx << "\" y=\"" << plot_top + plot_h + 33 << "\" text-anchor=\"middle\" font-size=\"12\">"
      << escape(r.dtype) << "</text>\n";
  }
  o << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << plot_top + plot_h + 58
    << "\" text-anchor=\"middle\" font-size=\"13\">ZeRO stage and training dtype</text>\n";
  std::ostringstream note;
  note << "held/formula: model states only (params, grads, fp32 master, optimizer); RSS increase also holds "
          "activations, temporaries, allocator slack";
  o << "<text x=\"" << left << "\" y=\"" << plot_top + plot_h + 85 << "\" font-size=\"10\" fill=\"#555555\">"
    << escape(note.str()) << "</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string in = "memory_peaks.jsonl", md_path, svg_path;
  const char* usage = "usage: bench_memory_report --in FILE.jsonl [--md FILE.md] [--svg FILE.svg]\n";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::printf("%s", usage);
      return 0;
    }
  }
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_memory_report: %s needs a value\n%s", key.c_str(), usage);
      return 2;
    }
    if (key == "--in") in = argv[i + 1];
    else if (key == "--md") md_path = argv[i + 1];
    else if (key == "--svg") svg_path = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_memory_report: unknown option %s (--in FILE --md FILE --svg FILE)\n", key.c_str());
      return 2;
    }
  }
  try {
    std::ifstream file(in);
    if (!file) throw std::runtime_error("cannot read " + in);
    std::map<std::tuple<std::string, int, int64_t>, Row> latest;  // (dtype, stage, reuse), default reuse first
    std::vector<std::string> dtype_order;
    std::string text;
    while (std::getline(file, text)) {
      if (text.empty()) continue;
      Row r = parse(json::parse(text));
      if (std::find(dtype_order.begin(), dtype_order.end(), r.dtype) == dtype_order.end()) dtype_order.push_back(r.dtype);
      const int64_t order = r.reuse == kDefaultReuse ? -2 : r.reuse;  // the default row before the others
      latest[{r.dtype, r.stage, order}] = std::move(r);
    }
    if (latest.empty()) throw std::runtime_error(in + " holds no results");
    std::vector<Row> rows;
    for (const auto& d : dtype_order) {
      for (const auto& kv : latest) {
        if (std::get<0>(kv.first) == d) rows.push_back(kv.second);
      }
    }
    const std::string md = markdown(rows);
    std::cout << md;
    if (!md_path.empty()) std::ofstream(md_path) << md;
    if (!svg_path.empty()) std::ofstream(svg_path) << svg(rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_report: %s\n", e.what());
    return 1;
  }
}
