// "optimizer" and "scheduler": a type, then the parameters that type takes,
// with the defaults of the implementation DeepSpeed uses for it.
#include "config/config_detail.h"
#include "zero/error.h"

namespace zero::config_detail {

const std::vector<std::string>& optimizer_types() {
  static const std::vector<std::string> types = {"Adam", "AdamW", "SGD", "Adagrad", "Lamb"};
  return types;
}

const std::vector<std::string>& scheduler_types() {
  static const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                 "LRRangeTest"};
  return types;
}

namespace {

// Optimizers DeepSpeed (or torch.optim, which DeepSpeed falls back to) offers
// and zero does not have yet.
const std::vector<std::string>& unsupported_optimizers() {
  static const std::vector<std::string> types = {
      "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Lion", "MuAdam", "MuAdamW", "MuSGD", "RMSprop",
      "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD", "LBFGS", "Rprop", "SparseAdam"};
  return types;
}

// The canonical spelling of `given` among `types`, or "".
std::string match(const std::string& given, const std::vector<std::string>& types) {
  for (const auto& t : types)
    if (lower(t) == lower(given)) return t;
  return "";
}

// Reads "type"; an unknown one is an error that lists what is supported.
std::string read_type(Fields& f, const std::string& section, const std::vector<std::string>& supported,
                      const std::vector<std::string>& unsupported) {
  std::string given;
  if (f.text("type", given) == Got::Absent) {
    f.forbidden("params", "is given without " + section + ".type");
    return "";
  }
  std::string type = match(given, supported);
  if (!type.empty()) return type;
  const std::string choices = join(supported, ", ");
  const std::string where = f.path("type") + ": ";
  if (!match(given, unsupported).empty())
    throw ConfigError(where + section + " \"" + given + "\" is not supported yet; zero supports " + choices);
  std::vector<std::string> all = supported;
  all.insert(all.end(), unsupported.begin(), unsupported.end());
  std::string message = where + "unknown " + section + " \"" + given + "\"";
  if (auto guess = nearest(given, all)) message += "; did you mean \"" + *guess + "\"?";
  throw ConfigError(message + " (zero supports " + choices + ")");
}

OptimizerParams optimizer_defaults(const std::string& type) {
  OptimizerParams p;   // FusedAdam's and FusedLamb's defaults
  if (type == "Adagrad") {   // torch.optim.Adagrad
    p.lr = 1e-2;
    p.eps = 1e-10;
  }
  return p;
}

void visit_optimizer_params(Fields& f, const std::string& type, OptimizerParams& p) {
  f.owner("optimizer " + type);
  const bool adam = type == "Adam" || type == "AdamW", lamb = type == "Lamb";
  const bool sgd = type == "SGD", adagrad = type == "Adagrad";
  const Opt hf = Opt().min(0).autos(Auto::Default);   // Hugging Face writes "auto" for these
  f.number("lr", p.lr, hf);
  if (adam || lamb) f.pair("betas", p.betas, Opt().min(0).below(1).autos(Auto::Default));
  if (!sgd) f.number("eps", p.eps, hf);
  f.number("weight_decay", p.weight_decay, hf);
  if (adam) {
    f.flag("adam_w_mode", p.adam_w_mode);
    f.flag("torch_adam", p.torch_adam);
    f.flag("amsgrad", p.amsgrad);
  }
  if (adam || lamb) f.flag("bias_correction", p.bias_correction);
  if (lamb) {
    f.number("max_coeff", p.max_coeff, Opt().min(0));
    f.number("min_coeff", p.min_coeff, Opt().min(0));
    f.flag("eps_inside_sqrt", p.eps_inside_sqrt);
    if (f.reading() && p.min_coeff > p.max_coeff)
      f.fail("min_coeff", "is above max_coeff (" + show_number(p.min_coeff) + " > " + show_number(p.max_coeff) + ")");
  }
  if (sgd) {
    f.number("momentum", p.momentum, Opt().min(0));
    f.number("dampening", p.dampening, Opt().min(0));
    f.flag("nesterov", p.nesterov);
    if (f.reading() && p.nesterov && (p.momentum <= 0 || p.dampening != 0))
      f.fail("nesterov", "Nesterov momentum needs momentum > 0 and dampening 0 (as in torch.optim.SGD)");
  }
  if (adagrad) {
    f.number("lr_decay", p.lr_decay, Opt().min(0));
    f.number("initial_accumulator_value", p.initial_accumulator_value, Opt().min(0));
  }
  f.forbidden("max_grad_norm", "DeepSpeed does not take max_grad_norm as an optimizer parameter; "
                               "use the top-level \"gradient_clipping\" instead");
}

// A parameter without a default: absent or "auto" is an error.
void require(Fields& f, Got got, const char* key, const std::string& type, const std::string& why) {
  if (!f.reading() || got == Got::Value) return;
  if (got == Got::Auto) f.fail(key, "\"auto\" cannot be filled in here: " + why + "; give a number");
  f.fail(key, "is required by scheduler " + type + " (" + why + ")");
}

void visit_warmup(Fields& f, SchedulerParams& p, const OptimizerConfig& opt, bool ratios) {
  const Opt hf = Opt().min(0).autos(Auto::Default);
  if (ratios) {   // WarmupCosineLR scales the optimizer's lr
    f.number("warmup_min_ratio", p.warmup_min_ratio, Opt().min(0).max(1).autos(Auto::Default));
  } else {
    f.number("warmup_min_lr", p.warmup_min_lr, hf);
    // Hugging Face sets the peak to the optimizer's lr; so does zero.
    if (f.number("warmup_max_lr", p.warmup_max_lr, Opt().min(0).autos(Auto::Caller)) == Got::Auto) {
      if (!opt.type.empty()) {
        p.warmup_max_lr = opt.params.lr;
      } else {
        f.warn(f.path("warmup_max_lr") + " is \"auto\" and there is no optimizer section to take lr from; "
               "using the default " + show_number(p.warmup_max_lr));
      }
    }
  }
  f.integer("warmup_num_steps", p.warmup_num_steps, hf);
  f.choice("warmup_type", p.warmup_type, {"log", "linear"}, Opt().autos(Auto::Default));
}

// "auto" stays unset here; resolve() insists on a value (check_resolvable).
void visit_total_steps(Fields& f, SchedulerParams& p, const std::string& type) {
  Got got = f.integer("total_num_steps", p.total_num_steps, Opt().min(1).autos(Auto::Caller));
  if (got == Got::Absent) require(f, got, "total_num_steps", type, "the step where the learning rate ends");
  if (f.reading() && p.total_num_steps && *p.total_num_steps < p.warmup_num_steps)
    f.warn(f.path("total_num_steps") + " (" + std::to_string(*p.total_num_steps) +
           ") is below warmup_num_steps (" + std::to_string(p.warmup_num_steps) +
           "): the learning rate decays before warmup ends");
}

void visit_one_cycle(Fields& f, SchedulerParams& p) {
  const Opt rate = Opt().min(0);
  const Opt momentum = Opt().min(0).max(1);
  const char* const bounds = "it bounds the cycle";
  require(f, f.number("cycle_min_lr", p.cycle_min_lr, rate), "cycle_min_lr", "OneCycle", bounds);
  require(f, f.number("cycle_max_lr", p.cycle_max_lr, rate), "cycle_max_lr", "OneCycle", bounds);
  f.number("decay_lr_rate", p.decay_lr_rate, rate);
  f.integer("cycle_first_step_size", p.cycle_first_step_size, Opt().min(1));
  if (f.integer("cycle_second_step_size", p.cycle_second_step_size, Opt().min(1)) == Got::Absent && f.reading())
    p.cycle_second_step_size = p.cycle_first_step_size;   // DeepSpeed: None means the first size
  f.integer("cycle_first_stair_count", p.cycle_first_stair_count, Opt().min(0));
  if (f.integer("cycle_second_stair_count", p.cycle_second_stair_count, Opt().min(0)) == Got::Absent &&
      f.reading())
    p.cycle_second_stair_count = p.cycle_first_stair_count;
  f.integer("decay_step_size", p.decay_step_size, Opt().min(0));
  f.flag("cycle_momentum", p.cycle_momentum);
  f.number("cycle_min_mom", p.cycle_min_mom, momentum);
  f.number("cycle_max_mom", p.cycle_max_mom, momentum);
  f.number("decay_mom_rate", p.decay_mom_rate, rate);
}

void visit_range_test(Fields& f, SchedulerParams& p) {
  f.number("lr_range_test_min_lr", p.lr_range_test_min_lr, Opt().min(0));
  f.integer("lr_range_test_step_size", p.lr_range_test_step_size, Opt().min(1));
  f.number("lr_range_test_step_rate", p.lr_range_test_step_rate, Opt().above(0));
  f.flag("lr_range_test_staircase", p.lr_range_test_staircase);
}

void visit_scheduler_params(Fields& f, const std::string& type, SchedulerParams& p, const OptimizerConfig& opt) {
  f.owner("scheduler " + type);
  if (type == "WarmupLR" || type == "WarmupDecayLR" || type == "WarmupCosineLR")
    visit_warmup(f, p, opt, type == "WarmupCosineLR");
  if (type == "WarmupDecayLR" || type == "WarmupCosineLR") visit_total_steps(f, p, type);
  if (type == "WarmupCosineLR") f.number("cos_min_ratio", p.cos_min_ratio, Opt().min(0).max(1));
  if (type == "OneCycle") visit_one_cycle(f, p);
  if (type == "LRRangeTest") visit_range_test(f, p);
  f.integer("last_batch_iteration", p.last_batch_iteration, Opt().min(-1));
}

}  // namespace

void check_resolvable(const Config& c) {
  const std::string& type = c.scheduler.type;
  if ((type == "WarmupDecayLR" || type == "WarmupCosineLR") && !c.scheduler.params.total_num_steps)
    throw ConfigError("scheduler.params.total_num_steps is \"auto\", and zero cannot know how many steps the "
                      "run takes: give a number in the config, or set Config::scheduler.params.total_num_steps "
                      "before resolve()");
}

void visit_optimizer(Fields& f, OptimizerConfig& o) {
  if (f.reading()) {
    o.type = read_type(f, "optimizer", optimizer_types(), unsupported_optimizers());
    if (o.type.empty()) return;
    o.params = optimizer_defaults(o.type);
  } else {
    f.text("type", o.type);
  }
  f.object("params", [&](Fields& g) { visit_optimizer_params(g, o.type, o.params); });
  f.unimplemented("legacy_fusion");
}

void visit_scheduler(Fields& f, SchedulerConfig& s, const OptimizerConfig& opt) {
  if (f.reading()) {
    s.type = read_type(f, "scheduler", scheduler_types(), {});
    if (s.type.empty()) return;
    s.params = SchedulerParams{};
  } else {
    f.text("type", s.type);
  }
  f.object("params", [&](Fields& g) { visit_scheduler_params(g, s.type, s.params, opt); });
}

}  // namespace zero::config_detail
