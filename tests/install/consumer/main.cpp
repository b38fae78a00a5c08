#include <torch/torch.h>
#include <zero/zero.h>

#include <cstdio>

// Built against an installed zero (find_package(zero)); run alone and under
// the installed zero-run. Each rank gets its own slice of the summed input.
int main() {
  auto world = zero::comm::init_process_group();
  auto input = torch::arange(6).to(torch::kFloat);
  const int64_t n = 6 / world->size();
  auto output = torch::empty({n});
  world->reduce_scatter(output, input);
  const bool ok = output.equal(input.slice(0, world->rank() * n, (world->rank() + 1) * n) * world->size());
  std::printf("consumer: reduce_scatter on %d rank(s): %s\n", world->size(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
