// The FLOPs profiler (profile/flops_profiler.h).
#include "profile/flops_profiler.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_map>

#include "zero/unit.h"

namespace zero::profile {

using Clock = std::chrono::steady_clock;

struct FlopsProfiler::State {
  std::vector<std::string> names;  // by module index; 0 is the model
  std::vector<int> parent;
  std::vector<int64_t> params;     // with its children's
  std::unordered_map<const c10::TensorImpl*, int> owner;
  std::vector<double> flops, macs, latency_s;  // own operators
  bool started = false, paused = false;
  at::CallbackHandle handle = 0;
  int depth = 0, counted_depth = 0;
  int last_param_module = 0, top_module = 0;
};

namespace {

// The profiler counting on this thread (callbacks are plain functions).
thread_local FlopsProfiler::State* t_counting = nullptr;

struct OpContext : at::ObserverContext {
  Clock::time_point start;
  int module = 0;
  bool counted = false, outermost = false;
};

int64_t numel_of(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined() ? v.toTensor().numel() : 0; }

std::vector<int64_t> sizes_of(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() ? v.toTensor().sizes().vec() : std::vector<int64_t>{};
}

// FLOPs and MACs of one operator from its inputs; {0, 0} when not counted.
std::pair<double, double> cost(const std::string& op, c10::ArrayRef<const c10::IValue> in) {
  auto matmul_macs = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (a.size() < 2 || b.size() < 2) return 0.0;
    double batch = 1;
    for (size_t i = 0; i + 2 < a.size(); ++i) batch *= static_cast<double>(a[i]);
    return batch * static_cast<double>(a[a.size() - 2]) * static_cast<double>(a.back()) * static_cast<double>(b.back());
  };
  if (op == "aten::mm" || op == "aten::bmm") {
    if (in.size() < 2) return {0, 0};
    const double m = matmul_macs(sizes_of(in[0]), sizes_of(in[1]));
    return {2 * m, m};
  }
  if (op == "aten::addmm" || op == "aten::baddbmm" || op == "aten::addbmm") {
    if (in.size() < 3) return {0, 0};
    const std::vector<int64_t> a = sizes_of(in[1]), b = sizes_of(in[2]);
    const double m = matmul_macs(a, b);
    double out = m / std::max<double>(1, a.empty() ? 1 : static_cast<double>(a.back()));  // the bias added per output
    return {2 * m + out, m};
  }
  if (op == "aten::convolution" || op == "aten::_convolution") {
    // input [N, Cin, *spatial], weight [Cout, Cin/groups, *kernel], bias,
    // stride, padding, dilation, transposed, output_padding, groups
    if (in.size() < 9 || !in[6].isBool() || in[6].toBool()) return {0, 0};  // transposed: not counted
    const auto x = sizes_of(in[0]), w = sizes_of(in[1]);
    if (x.size() < 3 || w.size() != x.size()) return {0, 0};
    const auto stride = in[3].toIntVector(), padding = in[4].toIntVector(), dilation = in[5].toIntVector();
    double out_positions = 1;
    for (size_t d = 2; d < x.size(); ++d) {
      const size_t k = d - 2;
      const int64_t s = stride.size() > k ? stride[k] : 1, p = padding.size() > k ? padding[k] : 0;
      const int64_t dl = dilation.size() > k ? dilation[k] : 1;
      out_positions *= static_cast<double>((x[d] + 2 * p - dl * (w[d] - 1) - 1) / s + 1);
    }
    double kernel = 1;
    for (size_t d = 1; d < w.size(); ++d) kernel *= static_cast<double>(w[d]);
    const double m = static_cast<double>(x[0]) * static_cast<double>(w[0]) * out_positions * kernel;
    return {2 * m, m};
  }
  if (op == "aten::native_layer_norm") {
    const bool affine = in.size() > 2 && in[2].isTensor() && in[2].toTensor().defined();
    return {(affine ? 5.0 : 4.0) * static_cast<double>(numel_of(in[0])), 0};
  }
  static const char* const kOnePerElement[] = {"aten::_softmax", "aten::_log_softmax", "aten::gelu", "aten::relu",
                                               "aten::relu_", "aten::tanh", "aten::tanh_", "aten::sigmoid",
                                               "aten::sigmoid_", "aten::silu", "aten::silu_"};
  for (const char* name : kOnePerElement) {
    if (op == name) return {static_cast<double>(in.empty() ? 0 : numel_of(in[0])), 0};
  }
  return {0, 0};
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  FlopsProfiler::State* s = t_counting;
  if (s == nullptr || s->paused) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  ctx->outermost = s->depth++ == 0;
  const auto inputs = fn.inputs();
  if (ctx->outermost) {
    int module = -1;
    for (const c10::IValue& v : inputs) {
      if (!v.isTensor()) continue;
      auto it = s->owner.find(v.toTensor().unsafeGetTensorImpl());
      if (it != s->owner.end()) {
        module = it->second;
        break;
      }
    }
    if (module >= 0) {
      s->last_param_module = module;
    } else {
      module = s->parent[s->last_param_module];
    }
    s->top_module = module;
    ctx->start = Clock::now();
  }
  ctx->module = s->top_module;
  if (s->counted_depth == 0) {
    const auto [flops, macs] = cost(fn.name(), inputs);
    if (flops > 0) {
      ctx->counted = true;
      ++s->counted_depth;
      s->flops[ctx->module] += flops;
      s->macs[ctx->module] += macs;
    }
  }
  return ctx;
}

void on_end(const at::RecordFunction&, at::ObserverContext* base) {
  FlopsProfiler::State* s = t_counting;
  if (s == nullptr || base == nullptr) return;
  auto* ctx = static_cast<OpContext*>(base);
  --s->depth;
  if (ctx->counted) --s->counted_depth;
  if (ctx->outermost) s->latency_s[ctx->module] += std::chrono::duration<double>(Clock::now() - ctx->start).count();
}

}  // namespace

FlopsProfiler::FlopsProfiler(const torch::nn::Module& model) : state_(std::make_unique<State>()) {
  State& s = *state_;
  std::map<std::string, int> index;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const int i = static_cast<int>(s.names.size());
    index[item.key()] = i;
    s.names.push_back(item.key());
    const auto dot = item.key().rfind('.');
    s.parent.push_back(item.key().empty() ? 0 : index.at(dot == std::string::npos ? "" : item.key().substr(0, dot)));
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) s.owner.emplace(p.value().unsafeGetTensorImpl(), i);
  }
  s.params.assign(s.names.size(), 0);
  for (const auto& p : model.named_parameters()) {
    auto it = s.owner.find(p.value().unsafeGetTensorImpl());
    for (int m = it == s.owner.end() ? 0 : it->second;; m = s.parent[m]) {
      s.params[m] += gathered_numel(p.value());  // a released stage-3 parameter counts whole
      if (m == 0) break;
    }
  }
  s.flops.assign(s.names.size(), 0);
  s.macs.assign(s.names.size(), 0);
  s.latency_s.assign(s.names.size(), 0);
}

FlopsProfiler::~FlopsProfiler() { stop(); }

void FlopsProfiler::start() {
  State& s = *state_;
  if (s.started) return;
  std::fill(s.flops.begin(), s.flops.end(), 0.0);
  std::fill(s.macs.begin(), s.macs.end(), 0.0);
  std::fill(s.latency_s.begin(), s.latency_s.end(), 0.0);
  s.depth = s.counted_depth = s.last_param_module = s.top_module = 0;
  s.paused = false;
  t_counting = &s;
  s.handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end).needsInputs(true));
  s.started = true;
}

void FlopsProfiler::pause() { state_->paused = true; }
void FlopsProfiler::resume() { state_->paused = false; }
bool FlopsProfiler::counting() const { return state_->started && !state_->paused; }

void FlopsProfiler::stop() {
  State& s = *state_;
  if (!s.started) return;
  at::removeCallback(s.handle);
  if (t_counting == &s) t_counting = nullptr;
  s.started = false;
}

double FlopsProfiler::flops() const {
  double total = 0;
  for (double f : state_->flops) total += f;
  return total;
}

double FlopsProfiler::macs() const {
  double total = 0;
  for (double m : state_->macs) total += m;
  return total;
}

std::vector<ModuleProfile> FlopsProfiler::modules() const {
  const State& s = *state_;
  std::vector<ModuleProfile> out(s.names.size());
  for (size_t i = 0; i < s.names.size(); ++i) {
    out[i].name = s.names[i];
    out[i].depth = s.names[i].empty() ? 0 : 1 + static_cast<int>(std::count(s.names[i].begin(), s.names[i].end(), '.'));
    out[i].params = s.params[i];
    out[i].own_flops = s.flops[i], out[i].own_macs = s.macs[i], out[i].own_latency_s = s.latency_s[i];
  }
  for (size_t i = 0; i < s.names.size(); ++i) {
    for (int m = static_cast<int>(i);; m = s.parent[m]) {
      out[m].flops += s.flops[i], out[m].macs += s.macs[i], out[m].latency_s += s.latency_s[i];
      if (m == 0) break;
    }
  }
  return out;
}

namespace {

// DeepSpeed's number_to_string: 1.23 G, 4.56 M, ...
std::string si(double v, const std::string& unit = "") {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (std::abs(v) >= 1000 && p < 5) v /= 1000, ++p;
  const std::string suffix = prefixes[p] + unit;
  char text[48];
  std::snprintf(text, sizeof(text), suffix.empty() ? "%.2f" : "%.2f %s", v, suffix.c_str());
  return text;
}

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f ms", seconds * 1e3);
  return text;
}

std::string percent(double part, double whole) {
  char text[16];
  std::snprintf(text, sizeof(text), "%.2f%%", whole > 0 ? 100 * part / whole : 0.0);
  return text;
}

void line(std::ostringstream& out, const std::string& label, const std::string& value) {
  char text[160];
  std::snprintf(text, sizeof(text), "%-62s%s\n", (label + ":").c_str(), value.c_str());
  out << text;
}

}  // namespace

std::string format_report(const FlopsProfiler& profiler, const ProfileReport& r) {
  const std::vector<ModuleProfile> modules = profiler.modules();
  const ModuleProfile& model = modules.at(0);
  const double fwd = profiler.flops();
  const double mp = r.model_parallel_size;
  std::ostringstream out;
  out << "\n-------------------------- Flops Profiler --------------------------\n";
  out << "Profile Summary at step " << r.step << ":\n";
  out << "Notations: data parallel size (dp_size), model parallel size (mp_size), number of parameters (params),\n"
         "number of multiply-accumulate operations (MACs), number of floating-point operations (flops),\n"
         "floating-point operations per second (FLOPS), fwd latency (forward propagation latency),\n"
         "bwd latency (backward propagation latency), step (weights update latency), iter latency (sum of fwd, bwd "
         "and step latency)\n\n";
  line(out, "world size", std::to_string(r.world_size));
  line(out, "data parallel size", std::to_string(r.data_parallel_size));
  line(out, "model parallel size", std::to_string(r.model_parallel_size));
  line(out, "batch size per rank", std::to_string(r.micro_batch) + " (x " + std::to_string(r.micro_batches) + " micro-batches)");
  line(out, "params per rank", si(static_cast<double>(model.params)));
  line(out, "params of model = params per rank * mp_size", si(static_cast<double>(model.params) * mp));
  line(out, "fwd MACs per rank", si(profiler.macs(), "MACs"));
  line(out, "fwd flops per rank", si(fwd));
  line(out, "fwd flops of model = fwd flops per rank * mp_size", si(fwd * mp));
  line(out, "fwd latency", ms(r.forward_s));
  line(out, "fwd FLOPS per rank = fwd flops per rank / fwd latency", si(r.forward_s > 0 ? fwd / r.forward_s : 0, "FLOPS"));
  const double bwd_flops = (2 + r.recompute_fwd_factor) * fwd;
  line(out, "bwd latency", ms(r.backward_s));
  line(out, "bwd FLOPS per rank = 2 * fwd flops per rank / bwd latency", si(r.backward_s > 0 ? bwd_flops / r.backward_s : 0, "FLOPS"));
  line(out, "fwd+bwd FLOPS per rank = 3 * fwd flops per rank / (fwd+bwd latency)",
       si(r.forward_s + r.backward_s > 0 ? (fwd + bwd_flops) / (r.forward_s + r.backward_s) : 0, "FLOPS"));
  line(out, "step latency", ms(r.step_s));
  line(out, "iter latency", ms(r.iteration_s));
  line(out, "FLOPS per rank = 3 * fwd flops per rank / iter latency", si(r.iteration_s > 0 ? (fwd + bwd_flops) / r.iteration_s : 0, "FLOPS"));
  line(out, "samples/second", si(r.iteration_s > 0 ? r.micro_batch * r.micro_batches * r.data_parallel_size / r.iteration_s : 0));

  int deepest = 0;
  for (const auto& m : modules) deepest = std::max(deepest, m.depth);
  const int depth_limit = r.module_depth < 0 ? deepest : std::min(r.module_depth, deepest);
  out << "\n----------------------------- Aggregated Profile per rank -----------------------------\n";
  out << "Top " << r.top_modules << " modules in terms of params, MACs or fwd latency at different model depths:\n";
  for (int d = 0; d <= depth_limit; ++d) {
    std::vector<const ModuleProfile*> at_depth;
    for (const auto& m : modules)
      if (m.depth == d) at_depth.push_back(&m);
    auto top = [&](auto key, auto show) {
      std::vector<const ModuleProfile*> sorted = at_depth;
      std::stable_sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) { return key(*a) > key(*b); });
      std::string text = "{";
      for (int i = 0; i < std::min<int>(r.top_modules, static_cast<int>(sorted.size())); ++i) {
        text += (i ? ", '" : "'") + (sorted[i]->name.empty() ? std::string("model") : sorted[i]->name) + "': '" + show(*sorted[i]) + "'";
      }
      return text + "}";
    };
    out << "depth " << d << ":\n";
    out << "    params      - " << top([](auto& m) { return static_cast<double>(m.params); }, [](auto& m) { return si(static_cast<double>(m.params)); }) << "\n";
    out << "    MACs        - " << top([](auto& m) { return m.macs; }, [](auto& m) { return si(m.macs, "MACs"); }) << "\n";
    out << "    fwd latency - " << top([](auto& m) { return m.latency_s; }, [](auto& m) { return ms(m.latency_s); }) << "\n";
  }
  if (r.detailed) {
    out << "\n------------------------------ Detailed Profile per rank ------------------------------\n";
    out << "Each module profile is listed after its name in the following order:\n"
           "params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd "
           "latency, fwd FLOPS\n"
           "(operators that belong to no child, such as attention's products or a residual add, count in the module "
           "itself)\n\n";
    for (const auto& m : modules) {
      if (m.depth > depth_limit) continue;
      out << std::string(2 * m.depth, ' ') << (m.name.empty() ? "model" : m.name) << ": " << si(static_cast<double>(m.params))
          << ", " << percent(static_cast<double>(m.params), static_cast<double>(model.params)) << " Params, "
          << si(m.macs, "MACs") << ", " << percent(m.macs, model.macs) << " MACs, " << ms(m.latency_s) << ", "
          << percent(m.latency_s, model.latency_s) << " latency, " << si(m.latency_s > 0 ? m.flops / m.latency_s : 0, "FLOPS")
          << "\n";
    }
  }
  out << "------------------------------------------------------------------------------\n";
  return out.str();
}

}  // namespace zero::profile
