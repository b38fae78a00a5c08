// One training program written the Accelerate way, run unchanged under
// several launch configs (zero-run --config-file, see CMakeLists.txt).
//
//   accelerate_train parity
//     Two epochs; rank 0 checks every micro-step's loss against a plain
//     LibTorch run with torch::optim::AdamW on the same global batches in
//     this process (relative error below 1e-5), with clip_grad_norm(0.5)
//     against torch::nn::utils::clip_grad_norm_, and that every sample was
//     seen once per epoch (counted over the ranks with gather_for_metrics,
//     which drops the last batch's padding).
//   accelerate_train curve OUT STEPS [--dropout P] [--save-at K DIR] [--resume DIR]
//     Trains until micro-step STEPS, writing one line per micro-step it runs
//     to OUT (rank 0): the global batch's sample ids and the loss as a hex
//     float; at the end a checksum of the parameters. --save-at stops after
//     micro-step K with save_state(DIR); --resume starts with load_state(DIR).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "ckpt/checkpoint.h"
#include "zero/accelerate.h"
#include "zero/error.h"

namespace {

constexpr int64_t kSamples = 100;  // the last global batch of an epoch is half padding
constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kIn = 16, kHidden = 32, kClasses = 4;

struct NetImpl : torch::nn::Module {
  explicit NetImpl(double dropout)
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(torch::tanh(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

// Inputs, labels and each sample's index (to count what was seen).
std::shared_ptr<zero::TensorDataset> make_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor x = torch::randn({kSamples, kIn}, gen);
  at::Tensor w = torch::randn({kIn, kClasses}, gen);
  at::Tensor y = x.matmul(w).argmax(1);
  return std::make_shared<zero::TensorDataset>(std::vector<at::Tensor>{x, y, torch::arange(kSamples)});
}

zero::AcceleratorOptions options(uint64_t seed) {
  zero::AcceleratorOptions o;
  o.split_batches = true;  // the same global batches whatever the launch config's num_processes
  o.seed = seed;
  return o;
}

zero::DataLoaderOptions global_batch() {
  zero::DataLoaderOptions o;
  o.batch_size = kGlobalBatch;
  return o;
}

zero::OptimizerConfig adamw() {
  zero::OptimizerConfig o;
  o.type = "AdamW";
  o.params.lr = 1e-2;
  o.params.weight_decay = 0.01;
  return o;
}

int parity() {
  zero::Accelerator acc(options(3));
  auto data = make_data();
  auto loader = acc.prepare(data, global_batch());
  torch::manual_seed(0);
  Net model(0.0);
  Net reference(0.0);
  {
    torch::NoGradGuard no_grad;
    auto src = model->parameters();
    auto dst = reference->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  acc.prepare(model, adamw());
  const int64_t gas = acc.gradient_accumulation_steps();
  torch::optim::AdamW optimizer(reference->parameters(),
                                torch::optim::AdamWOptions(1e-2).weight_decay(0.01).betas({0.9, 0.999}).eps(1e-8));

  double worst = 0;
  int64_t micro = 0;
  int failures = 0;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    std::map<int64_t, int> seen;
    int64_t first_sample = 0;
    for (const auto& batch : loader) {
      double loss_value = 0;
      acc.accumulate([&] {
        at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
        acc.backward(loss);
        if (acc.sync_gradients()) acc.clip_grad_norm(0.5);
        loss_value = acc.gather(loss.detach().reshape({1})).mean().item<double>();
      });
      const at::Tensor ids_seen = acc.gather_for_metrics(batch[2]);
      for (int64_t i = 0; i < ids_seen.numel(); ++i) ++seen[ids_seen[i].item<int64_t>()];
      // The same global batch through the plain LibTorch model.
      const auto ids = loader.global_batch_indices(epoch, first_sample);
      first_sample += loader.global_batch_size();
      const auto global = data->get_batch(ids);
      at::Tensor ref_loss = torch::nn::functional::cross_entropy(reference->forward(global[0]), global[1]);
      (ref_loss / static_cast<double>(gas)).backward();
      if (++micro % gas == 0) {
        torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.5);
        optimizer.step();
        optimizer.zero_grad();
      }
      const double rel = std::abs(loss_value - ref_loss.item<double>()) / std::abs(ref_loss.item<double>());
      worst = std::max(worst, rel);
      if (rel >= 1e-5 && acc.is_main_process()) {
        std::printf("FAIL: micro-step %lld: loss %.9g, plain LibTorch %.9g (relative error %.2e)\n", (long long)micro,
                    loss_value, ref_loss.item<double>(), rel);
        ++failures;
      }
    }
    if (static_cast<int64_t>(seen.size()) != kSamples) ++failures;
    for (const auto& [id, count] : seen) failures += count != 1;
    acc.print("epoch " + std::to_string(epoch) + ": " + std::to_string(seen.size()) + " distinct samples of " +
              std::to_string(kSamples) + " seen once each");
  }
  char line[200];
  std::snprintf(line, sizeof line,
                "parity: %d rank(s), stage %lld, accumulation %lld, %lld micro-steps, worst relative loss error %.2e",
                acc.num_processes(), (long long)acc.ds_config().zero_optimization.stage, (long long)gas,
                (long long)micro, worst);
  acc.print(line);
  return failures == 0 ? 0 : 1;
}

int curve(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string out_path = argv[2];
  const int64_t steps = std::stoll(argv[3]);
  double dropout = 0;
  int64_t save_at = -1;
  std::string save_dir, resume_dir;
  for (int i = 4; i + 1 < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--dropout") dropout = std::stod(argv[++i]);
    else if (key == "--save-at") save_at = std::stoll(argv[++i]), save_dir = argv[++i];
    else if (key == "--resume") resume_dir = argv[++i];
  }
  zero::Accelerator acc(options(5));
  auto data = make_data();
  auto loader = acc.prepare(data, global_batch());
  torch::manual_seed(0);
  Net model(dropout);
  acc.prepare(model, adamw());
  torch::manual_seed(100 + acc.process_index());  // each rank its own dropout masks
  if (!resume_dir.empty()) acc.load_state(resume_dir);

  std::ofstream out;
  if (acc.is_main_process()) out.open(out_path, std::ios::app);
  const int64_t per_epoch = loader.batches_per_epoch();
  int64_t micro = loader.epoch() * per_epoch + loader.position().samples / loader.global_batch_size();
  while (micro < steps) {
    loader.set_epoch(loader.epoch());
    for (const auto& batch : loader) {
      double loss_value = 0;
      acc.accumulate([&] {
        at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
        acc.backward(loss);
        loss_value = acc.gather(loss.detach().reshape({1})).mean().item<double>();
      });
      at::Tensor ids = acc.gather_for_metrics(batch[2]);
      ++micro;
      if (acc.is_main_process()) {
        char loss_text[64];
        std::snprintf(loss_text, sizeof loss_text, "%a", loss_value);
        out << "step " << micro << " ids";
        for (int64_t i = 0; i < ids.numel(); ++i) out << (i ? "," : " ") << ids[i].item<int64_t>();
        out << " loss " << loss_text << "\n";
      }
      if (micro == save_at) {
        acc.save_state(save_dir);
        return 0;
      }
      if (micro == steps) break;
    }
  }
  double checksum = 0;
  const auto state = acc.get_state_dict();
  for (const auto& [name, tensor] : state) checksum += tensor.to(torch::kDouble).abs().sum().item<double>();
  // save_model's file holds the same tensors, bytes read back.
  const std::string model_dir = out_path + ".model";
  acc.save_model(model_dir);
  if (acc.is_main_process()) {
    zero::ckpt::SafetensorsFile file(model_dir + "/model.safetensors");
    if (file.entries().size() != state.size()) throw zero::EngineError("save_model wrote a different number of tensors");
    for (const auto& [name, tensor] : state) {
      const auto& entry = file.entries().at(name);
      at::Tensor back = torch::empty(tensor.sizes(), tensor.options());
      file.read(name, 0, entry.end - entry.begin, back.data_ptr());
      if (!torch::equal(back, tensor)) throw zero::EngineError("save_model: " + name + " differs from get_state_dict's");
    }
  }
  if (acc.is_main_process()) {
    char text[64];
    std::snprintf(text, sizeof text, "%a", checksum);
    out << "final checksum " << text << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "parity") return parity();
    if (mode == "curve") return curve(argc, argv);
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "accelerate_train: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: accelerate_train parity | curve OUT STEPS [--dropout P] [--save-at K DIR] [--resume DIR]\n");
  return 2;
}
