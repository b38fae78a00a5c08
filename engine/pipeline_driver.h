#pragma once
// The engine with a pipeline module (include/zero/pipeline.h): the 1F1B
// schedule of train_batch and eval_batch over the stages' links, and the
// tied parameters, whose gradients are summed over the stages holding them
// (pipeline_driver.cpp).
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "parallel/pipe_links.h"
#include "zero/engine.h"
#include "partition/partition.h"
#include "telemetry/step_timer.h"
#include "zero/mesh.h"
#include "zero/pipeline.h"

namespace zero::engine {

class PipelineDriver {
 public:
  // The driver of `module` when it is a pipe::PipelineModule, else nullptr
  // (and an error when the mesh asks for pipeline stages). A collective
  // over the pipeline group when there is more than one stage.
  static std::unique_ptr<PipelineDriver> of(torch::nn::Module& module, const Mesh& mesh);

  // Tied parameters, by name, with the number of stages holding each: each
  // gets a gradient bucket of its own (engine::isolate_params).
  std::map<std::string, int> tied_copies() const;
  // Once the partition is built: the buckets of tied parameters, checked
  // to be alike on every stage sharing them. A collective over each tie.
  void find_tied_buckets(const partition::ShardedParams& params);
  // Before the step: each tied bucket's gradient summed over its stages.
  void reduce_tied_grads(partition::ShardedParams& params);
  // The parameters and buffers another stage writes to checkpoints.
  std::set<std::string> written_elsewhere(torch::nn::Module& module) const;

  // One batch of `gas` micro-batches through the stages (Note [1F1B]);
  // returns the loss every rank agrees on. `loss_scale`: fp16's.
  struct Batch {
    double loss = 0;
    telemetry::PipelineTimes times;
  };
  Batch run(const std::function<Engine::Batch()>& next_batch, bool train, int64_t gas, double loss_scale,
            partition::ShardedParams& params, const Mesh& mesh, comm::ProcessGroup& world, at::Device device);

  bool has_links() const { return links_ != nullptr; }  // more than one stage
  int64_t bytes_sent() const { return links_ ? links_->bytes_sent() : 0; }

 private:
  explicit PipelineDriver(pipe::PipelineModule& module) : pipeline_(module) {}
  pipe::PipelineModule& pipeline_;
  std::unique_ptr<pipe::PipeLinks> links_;
  std::vector<std::pair<size_t, std::shared_ptr<comm::ProcessGroup>>> tied_buckets_;
};

}  // namespace zero::engine
