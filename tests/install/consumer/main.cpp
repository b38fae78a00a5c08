#include <torch/torch.h>
#include <zero/zero.h>

#include <cstdio>

int main() {
  auto world = zero::comm::init_process_group();
  auto input = torch::arange(6).to(torch::kFloat);
  auto output = torch::empty({6 / world->size()});
  world->reduce_scatter(output, input);
  const bool ok = output.equal(input.slice(0, 0, output.numel()) * world->size());
  std::printf("consumer: reduce_scatter on %d rank(s): %s\n", world->size(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
