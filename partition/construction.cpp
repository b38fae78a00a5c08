// ConstructionParts: units' parameters kept in parts from the moment they
// are built (Note [Partitioned construction] in construction.h).
#include "partition/construction.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <unordered_set>

#include "core/byte_units.h"
#include "offload/swapped_tensors.h"
#include "zero/error.h"
#include "zero/unit.h"

namespace zero {
namespace partition {
namespace {

thread_local ConstructionParts* g_current = nullptr;

std::mutex g_live_mutex;
std::vector<std::shared_ptr<ConstructionParts>> g_live;

std::string human(int64_t bytes) { return std::to_string(bytes) + " bytes (" + core::human_bytes(static_cast<double>(bytes)) + ")"; }

}  // namespace

ConstructionParts::ConstructionParts(std::shared_ptr<comm::ProcessGroup> group,
                                     std::optional<offload::SwapOptions> nvme)
    : group_(std::move(group)), nvme_(std::move(nvme)) {
  // The folder is checked (exists, is a directory, is writable) before
  // anything is built.
  if (nvme_) store_ = std::make_unique<offload::SwappedTensors>(*nvme_);
}

ConstructionParts::~ConstructionParts() = default;

ConstructionParts* ConstructionParts::current() { return g_current; }
void ConstructionParts::set_current(ConstructionParts* parts) {
  g_current = parts;
  UnitBuiltHook take = [](UnitBase& unit) { g_current->take(unit); };
  unit_built_hook() = parts ? take : nullptr;
}

void ConstructionParts::keep(std::shared_ptr<ConstructionParts> parts) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  if (std::find(g_live.begin(), g_live.end(), parts) == g_live.end()) g_live.push_back(std::move(parts));
}

std::vector<std::shared_ptr<ConstructionParts>> ConstructionParts::live() {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  for (auto& parts : g_live) {
    for (auto it = parts->parts_.begin(); it != parts->parts_.end();) {
      if (it->second.param.expired()) {
        parts->bytes_ -= it->second.values.nbytes();
        it = parts->parts_.erase(it);
      } else {
        ++it;
      }
    }
  }
  g_live.erase(std::remove_if(g_live.begin(), g_live.end(),
                              [](const auto& p) { return p->parts_.empty() && p.get() != g_current; }),
               g_live.end());
  return g_live;
}

bool ConstructionParts::holds(const at::Tensor& param) const {
  return param.defined() && parts_.count(param.unsafeGetTensorImpl()) > 0;
}

at::Device ConstructionParts::device_of(const at::Tensor& param) const {
  auto it = parts_.find(param.unsafeGetTensorImpl());
  return it == parts_.end() ? param.device() : it->second.device;
}

void ConstructionParts::take(UnitBase& unit) {
  std::vector<at::Tensor> params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : unit.parameters()) {
    if (!p.requires_grad() || p.numel() == 0 || !at::isFloatingType(p.scalar_type())) continue;  // frozen: built whole
    if (holds(p) || !seen.insert(p.unsafeGetTensorImpl()).second) continue;  // a nested unit's, or shared
    params.push_back(p);
  }
  if (params.empty()) return;
  const int world = group_->size(), rank = group_->rank();
  int64_t needed = 0;
  for (const auto& p : params) needed += (p.numel() + world - 1) / world * p.element_size();
  if (!store_) {
    // Parts in host memory: a model whose parts outgrow the machine is
    // named here, before they are allocated, instead of by the kernel's
    // out-of-memory killer. The ranks of a node share its memory.
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int64_t local_ranks = std::max<int64_t>(1, local ? std::atoll(local) : 1);
    const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    if (memory > 0 && (bytes_ + needed) * local_ranks > memory) {
      throw OffloadError("zero::Init: remote_device \"cpu\": the parts would hold " + human(bytes_ + needed) +
                         " per rank with this unit, times " + std::to_string(local_ranks) +
                         " rank(s) on this node, above this machine's " + human(memory) +
                         " of memory; check the model's sizes, or keep the parts on NVMe "
                         "(offload_param.device \"nvme\")");
    }
  }
  if (store_) {
    // A full disk is found here, before this unit's parts are written.
    std::error_code error;
    const auto space = std::filesystem::space(nvme_->nvme_path, error);
    if (!error && static_cast<int64_t>(space.available) < needed + (int64_t{64} << 20)) {
      throw OffloadError("zero::Init: remote_device \"nvme\": this unit's parts need " + human(needed) +
                         " in nvme_path " + nvme_->nvme_path + ", which has " +
                         human(static_cast<int64_t>(space.available)) +
                         " free (64 MiB are kept spare); free space there or set offload_param.nvme_path to a "
                         "larger disk");
    }
  }
  torch::NoGradGuard no_grad;
  std::vector<Part> parts;
  std::vector<int> written;
  for (at::Tensor& p : params) {
    // Rank 0's values everywhere, as zero::initialize's broadcast gives.
    if (world > 1) group_->broadcast(p.data(), 0);
    const int64_t n = p.numel(), each = (n + world - 1) / world;
    const int64_t from = std::min(n, rank * each), to = std::min(n, from + each);
    Part part(c10::weak_intrusive_ptr<c10::TensorImpl>(p.getIntrusivePtr()));
    part.numel = n;
    part.device = p.device();
    // Plain pages: a part is written once and read once, and huge pages
    // would round each one up to 2 MiB.
    part.values = torch::zeros({each}, torch::TensorOptions().dtype(p.scalar_type()));
    if (to > from) part.values.narrow(0, 0, to - from).copy_(p.detach().reshape(-1).slice(0, from, to));
    if (store_) {
      part.swap_id = store_->add(part.values, "construction" + std::to_string(next_key_++));
      written.push_back(part.swap_id);
    }
    parts.push_back(std::move(part));
  }
  if (store_) {
    store_->swap_out(written);
    store_->wait_out(written);
  }
  // Only now is the unit let go, whole: the next unit's parameters fit in
  // the memory it leaves, where parts carved from it would leave gaps.
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    // The shape stays, over one element: no memory, and a write into it
    // (an init function run later) fails in LibTorch or shows in the version.
    p.set_data(torch::zeros({1}, p.options()).expand(p.sizes()));
    parts[i].version = static_cast<uint32_t>(p._version());
    bytes_ += parts[i].values.nbytes();
    parts_.emplace(p.unsafeGetTensorImpl(), std::move(parts[i]));
  }
}

void ConstructionParts::read_ahead(const std::vector<at::Tensor>& params) {
  if (!store_) return;
  std::vector<int> ids;
  for (const auto& p : params) {
    auto it = parts_.find(p.unsafeGetTensorImpl());
    if (it != parts_.end() && it->second.swap_id >= 0) ids.push_back(it->second.swap_id);
  }
  store_->swap_in(ids);
}

void ConstructionParts::gather(const at::Tensor& param, const std::string& name, at::Tensor out) {
  auto it = parts_.find(param.unsafeGetTensorImpl());
  if (it == parts_.end()) throw PartitionError("zero::Init: no part of " + name + " was kept");
  Part& part = it->second;
  if (static_cast<uint32_t>(param._version()) != part.version) {
    throw PartitionError("parameter " + name +
                         " was written after its unit was built under zero::Init, so the values written are not in "
                         "its parts (an init function run over the whole model after construction?); set a unit's "
                         "weights in its constructor, or build the model without zero::Init");
  }
  if (part.swap_id >= 0) {
    store_->swap_in({part.swap_id});
    store_->wait_in({part.swap_id});
  }
  if (out.numel() != part.numel || !out.is_contiguous()) {
    throw PartitionError("internal: " + name + " is gathered into a tensor of " + std::to_string(out.numel()) +
                         " elements, not its " + std::to_string(part.numel));
  }
  const int world = group_->size();
  if (world == 1) {
    out.copy_(part.values.narrow(0, 0, part.numel));
  } else if (part.values.numel() * world == part.numel) {
    group_->all_gather(out, part.values);  // straight into place
  } else {  // the last part is padded
    at::Tensor whole = torch::empty({part.values.numel() * world}, part.values.options());
    group_->all_gather(whole, part.values);
    out.copy_(whole.narrow(0, 0, part.numel));
  }
  if (part.swap_id >= 0) store_->remove({part.swap_id});  // its disk space, for the shards being written
  bytes_ -= part.values.nbytes();
  parts_.erase(it);
  if (parts_.empty() && g_current != this) store_.reset();  // every part taken: the folder goes
}

}  // namespace partition
}  // namespace zero
