#pragma once
// Partitioned construction (zero::Init, include/zero/init.h): the parts of
// units' parameters that ranks keep from the moment a unit is built until
// zero::initialize lays them out.
//
// Note [Partitioned construction]: while a zero::Init lives on a thread,
// every zero::Unit built on it hands its trainable parameters here as its
// constructor returns (UnitBase::built). Each one is first broadcast from
// rank 0, as initialize would (so the weights are rank 0's, whatever each
// rank's seed), then cut into `world` equal parts of its flattened values
// (the last one padded); rank r keeps part r, in host memory or in a file
// under nvme_path, and the parameter keeps its shape over one element
// (a zero-stride view), so at most one unit is whole at a time. Every rank
// built the whole unit, so each rank's random number generator moved as
// far as in a whole construction: what the program draws afterwards is the
// same. At initialize the partition gathers each parameter back from the
// parts (one all-gather per parameter, in the layout's order, the same on
// every rank) when it fills the parameter's bucket, and lets the parts go:
// no more than one bucket is whole beyond the shards. A parameter written
// after its unit was built (an init function run over the whole model
// later) would be lost; its version counter says so and initialize refuses.
// What is not partitioned here: parameters outside every unit, frozen
// parameters and buffers are built whole and partitioned by initialize as
// before; a parameter shared with a unit built earlier is taken once.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload/swapper.h"
#include "zero/comm.h"

namespace zero {
class UnitBase;
namespace offload {
class SwappedTensors;
}
}  // namespace zero

namespace zero::partition {

class ConstructionParts {
 public:
  // `nvme`: keep the parts in files under its nvme_path (remote_device
  // "nvme"); none: in host memory (remote_device "cpu").
  ConstructionParts(std::shared_ptr<comm::ProcessGroup> group, std::optional<offload::SwapOptions> nvme);
  ~ConstructionParts();
  ConstructionParts(const ConstructionParts&) = delete;
  ConstructionParts& operator=(const ConstructionParts&) = delete;

  // Takes the trainable parameters of a unit just built (a collective).
  void take(UnitBase& unit);

  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }
  bool holds(const at::Tensor& param) const;
  at::Device device_of(const at::Tensor& param) const;  // where it was built
  // The whole flattened values of a held parameter, gathered from every
  // rank's part into `out` (contiguous, of its numel; a collective: every
  // rank asks for the same parameters in the same order); its part is let
  // go. Throws PartitionError when the parameter was written after its unit
  // was built.
  void gather(const at::Tensor& param, const std::string& name, at::Tensor out);
  // remote_device "nvme": starts reading the parts of those of `params`
  // it holds, so that their gather() finds them read (initialize reads the
  // next bucket's parts while it lays out this one). Not a collective.
  void read_ahead(const std::vector<at::Tensor>& params);
  int64_t held() const { return static_cast<int64_t>(parts_.size()); }
  int64_t bytes() const { return bytes_; }  // of the parts this rank keeps

  // The parts of the process: those of every zero::Init whose parameters
  // initialize has not taken yet (entries of parameters that died go).
  static std::vector<std::shared_ptr<ConstructionParts>> live();
  // The parts the current thread's zero::Init collects into (none outside one).
  static ConstructionParts* current();
  static void set_current(ConstructionParts* parts);
  static void keep(std::shared_ptr<ConstructionParts> parts);  // into live()

 private:
  struct Part {
    explicit Part(c10::weak_intrusive_ptr<c10::TensorImpl> param) : param(std::move(param)) {}
    c10::weak_intrusive_ptr<c10::TensorImpl> param;
    at::Tensor values;  // this rank's part, host memory (resident or swapped)
    int swap_id = -1;   // remote_device "nvme": its id in the store
    int64_t numel = 0;  // of the whole parameter
    at::Device device = at::kCPU;
    uint32_t version = 0;  // of the parameter once parked
  };
  std::shared_ptr<comm::ProcessGroup> group_;
  std::optional<offload::SwapOptions> nvme_;
  std::unique_ptr<offload::SwappedTensors> store_;
  std::unordered_map<const c10::TensorImpl*, Part> parts_;
  int64_t bytes_ = 0;
  int64_t next_key_ = 0;  // of the parts' files
};

}  // namespace zero::partition
