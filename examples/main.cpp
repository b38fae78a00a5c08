// The main job, for now: data-parallel training of a small MLP in which
// each rank keeps the optimizer state of only its shard of the flat
// parameters (the ZeRO idea, spelled out with zero's collectives):
//   backward -> reduce-scatter(avg) of the flat gradient -> Adam on the
//   rank's shard -> all-gather of the updated parameters.
// Run: zero-run --nproc 2 zero-main [--steps N]
// (The engine issue replaces this with a GPT trained by zero::initialize.)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "zero/zero.h"

int main(int argc, char** argv) {
  int steps = 600;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--steps") steps = std::stoi(argv[i + 1]);
  }
  auto world = zero::comm::init_process_group();
  const int W = world->size(), R = world->rank();
  torch::manual_seed(0);  // every rank starts from the same weights

  torch::nn::Sequential model(torch::nn::Linear(32, 128), torch::nn::GELU(), torch::nn::Linear(128, 128),
                              torch::nn::GELU(), torch::nn::Linear(128, 1));
  auto target_fn = [](const at::Tensor& x) { return (x.sin() * x.roll(1, 1)).sum(1, true) / 4; };

  // One flat buffer of all parameters, padded to a multiple of the world size.
  std::vector<at::Tensor> params = model->parameters();
  int64_t numel = 0;
  for (auto& p : params) numel += p.numel();
  const int64_t shard = (numel + W - 1) / W;
  at::Tensor flat_params = torch::zeros({shard * W});
  at::Tensor flat_grads = torch::zeros({shard * W});
  int64_t offset = 0;
  for (auto& p : params) {  // parameters become views into the flat buffer
    flat_params.slice(0, offset, offset + p.numel()).copy_(p.detach().view(-1));
    p.set_data(flat_params.slice(0, offset, offset + p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  // This rank's shard: fp32 master copy and Adam state exist only here.
  at::Tensor master = flat_params.slice(0, R * shard, (R + 1) * shard).clone().requires_grad_(true);
  torch::optim::Adam adam({master}, torch::optim::AdamOptions(3e-3));
  at::Tensor grad_shard = torch::zeros({shard});

  if (R == 0) {
    std::printf("zero-main: %d ranks, %lld parameters, each rank holds Adam state for %lld (%.1f%%)\n", W,
                (long long)numel, (long long)shard, 100.0 * shard / numel);
  }
  torch::manual_seed(1000 + R);  // each rank sees its own data
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step) {
    at::Tensor x = torch::randn({64, 32});
    at::Tensor loss = torch::mse_loss(model->forward(x), target_fn(x));
    model->zero_grad();
    loss.backward();
    offset = 0;
    for (auto& p : params) {
      flat_grads.slice(0, offset, offset + p.numel()).copy_(p.grad().view(-1));
      offset += p.numel();
    }
    world->reduce_scatter(grad_shard, flat_grads, zero::comm::ReduceOp::Avg);
    master.mutable_grad() = grad_shard;
    adam.step();
    world->all_gather(flat_params, master.detach());

    at::Tensor mean_loss = loss.detach().clone().view({1});
    world->all_reduce(mean_loss, zero::comm::ReduceOp::Avg);
    if (R == 0 && (step == 1 || step % 50 == 0)) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %4d  loss %.5f  %.1f steps/s\n", step, mean_loss.item<double>(), step / seconds);
    }
  }
  // Every rank must end with the same parameters: compare checksums.
  at::Tensor sums = torch::stack({flat_params.sum(), -flat_params.sum()}).to(torch::kDouble);
  world->all_reduce(sums, zero::comm::ReduceOp::Max);
  const bool agree = sums[0].item<double>() == -sums[1].item<double>();
  if (R == 0) std::printf("ranks hold identical parameters: %s\n", agree ? "yes" : "NO");
  return agree ? 0 : 1;
}
