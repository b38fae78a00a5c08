// One rank's file of a checkpoint (Note [Checkpoint layout] in
// ckpt/checkpoint.h): its fragments fetched bucket by bucket as the writer
// reaches them, checked for NaN and infinities, and every rank's entry for
// the manifest. engine/checkpoint_save.cpp writes them into a save's folder.
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "engine/checkpoint_rank_file.h"
#include "engine/checkpoint_io.h"
#include "zero/error.h"

namespace zero::engine {
namespace {

namespace fs = std::filesystem;
// The first of n floats that is NaN or infinite (all exponent bits set), or
// -1: a pass over bytes about to be written, cheap beside the write.
int64_t first_non_finite(const float* p, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, 4);
      any |= (bits & kExponent) == kExponent;
    }
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(p[i])) return i;
    }
  }
  return -1;
}

// This rank's file: whole tensors are borrowed by the writer (`keep_` holds
// them); the fragments' bytes are fetched as the writer reaches them, one
// bucket at a time for NVMe offload and for device tensors (one host copy
// at a time). Fragments are checked for NaN and infinities as they are
// fetched (unless allowed): a failure removes the file being written, so
// nothing of the new checkpoint replaces the old one.
class RankFile {
 public:
  RankFile(TrainingParts& s, bool allow_non_finite)
      : window_(s.sharded->masters(), /*write_back=*/false),
        allow_non_finite_(allow_non_finite) {}

  void add_whole(const std::string& name, const at::Tensor& t) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    keep_.push_back(cpu);
    tensors_.push_back({name, to_ckpt(cpu.scalar_type()), cpu.sizes().vec(), cpu.data_ptr(), cpu.nbytes()});
    sources_.emplace_back();
  }
  // The master weights ("fp32") and the states `kinds` of every bucket, as
  // fragments. The order, bucket by bucket and within a bucket kind by kind,
  // is the order a load at the same world size reads in (Note [Hashing
  // while reading] in ckpt/fragments.cpp).
  void add_fragments(TrainingParts& s, const std::vector<std::string>& kinds) {
    const auto& masters = s.sharded->masters().tensors();
    const auto fragments = s.sharded->fragments();
    std::vector<std::string> all_kinds{"fp32"};
    all_kinds.insert(all_kinds.end(), kinds.begin(), kinds.end());
    for (size_t k = 0; k < masters.size(); ++k) {
      for (const auto& kind : all_kinds) {
        const at::Tensor source = kind == "fp32" ? masters[k] : s.optimizer->state(masters[k], kind, false);
        if (source.scalar_type() != at::kFloat) throw CheckpointError("internal: fp32 master weights and optimizer states expected");
        for (const auto& f : fragments) {
          if (f.bucket != static_cast<int64_t>(k)) continue;
          const std::string& name = s.sharded->param_name(f.param);
          if (s.written_elsewhere.count(name)) continue;
          // In the full parameter's coordinates (a tensor-parallel slice
          // may be several pieces of it).
          for (const auto& piece : full_pieces(s.splits, name, f.param_offset, f.length)) {
            tensors_.push_back({ckpt::fragment_name(kind, name, piece.full_offset), ckpt::DType::F32, {piece.length},
                                nullptr, static_cast<size_t>(piece.length) * sizeof(float)});
            sources_.push_back({source, f.start + piece.offset - f.param_offset, k, kind, name, piece.full_offset});
          }
        }
      }
    }
  }
  // Rank 0's file records the parameter listing (ckpt::kParamsRecord), which
  // readers check the manifest against.
  ckpt::FileInfo write(const fs::path& path, int rank, const std::string& params_record, const std::string& save_id,
                       const std::string& recycle) {
    std::map<std::string, std::string> metadata{
        {"format", ckpt::kFormatName}, {"rank", std::to_string(rank)}, {ckpt::kSaveId, save_id}};
    if (rank == 0) metadata[ckpt::kParamsRecord] = params_record;
    ckpt::FileInfo info = ckpt::write_safetensors(path.string(), tensors_, metadata, [this](size_t i) { return fetch(i); },
                                                   recycle);
    window_.finish();
    return info;
  }

 private:
  struct Source {
    at::Tensor tensor;  // undefined: tensors_[i].data
    int64_t start = 0;
    size_t bucket = 0;
    std::string kind;     // a fragment's state ("fp32": the master weights)
    std::string param;    // and parameter, for the non-finite check's error
    int64_t full_offset = 0;  // of its first element in the parameter
  };
  const void* fetch(size_t i) {
    const Source& src = sources_[i];
    if (!src.tensor.defined()) return tensors_[i].data;
    window_.enter(src.bucket);
    const float* data = nullptr;
    if (src.tensor.is_cpu()) {
      data = src.tensor.data_ptr<float>() + src.start;
    } else {
      if (staged_from_ != src.tensor.unsafeGetTensorImpl()) {
        staged_ = src.tensor.detach().to(at::kCPU).contiguous();
        staged_from_ = src.tensor.unsafeGetTensorImpl();
      }
      data = staged_.data_ptr<float>() + src.start;
    }
    if (!allow_non_finite_) check_finite(src, data, tensors_[i].shape[0]);
    return data;
  }
  static void check_finite(const Source& src, const float* data, int64_t n) {
    const int64_t bad = first_non_finite(data, n);
    if (bad < 0) return;
    const std::string what = src.kind == "fp32" ? "the master weights of parameter " + src.param + " hold "
                                                : "the optimizer state " + src.kind + " of parameter " + src.param + " holds ";
    throw CheckpointError("save_checkpoint: " + what + std::to_string(data[bad]) + " at element " +
                          std::to_string(src.full_offset + bad) +
                          " (training diverged?); a checkpoint of them would train to NaN, so none was saved. "
                          "Save an earlier state, or pass SaveOptions::allow_non_finite to keep it anyway");
  }
  NvmeWindow window_;
  std::vector<at::Tensor> keep_;
  std::vector<ckpt::TensorData> tensors_;
  std::vector<Source> sources_;
  at::Tensor staged_;  // host copy of the device tensor being written
  const c10::TensorImpl* staged_from_ = nullptr;
  bool allow_non_finite_;
};

}  // namespace

// The states saved: those the optimizer has made (none before its first step).
std::vector<std::string> saved_kinds(TrainingParts& s) {
  std::vector<std::string> kinds;
  const auto& masters = s.sharded->masters().tensors();
  for (const auto& kind : s.optimizer->state_names()) {
    if (!masters.empty() && s.optimizer->state(masters.front(), kind, false).defined()) kinds.push_back(kind);
  }
  return kinds;
}

// Writes this rank's file; returns its size and checksum, or the error.
std::pair<ckpt::FileInfo, std::string> write_rank_file(TrainingParts& s, const fs::path& staging,
                                                       const std::vector<std::string>& kinds, const ModelTensors& model,
                                                       const std::string& params_record, const std::string& save_id,
                                                       bool allow_non_finite, const std::string& recycle) {
  const int rank = s.pg->rank();
  RankFile file(s, allow_non_finite);
  // At stage 0 every rank of ZeRO's group holds everything: the first writes it.
  const bool first_of_zero_group = s.mesh->zero_group()->rank() == 0;
  if (s.sharded->owners() > 1 || first_of_zero_group) file.add_fragments(s, kinds);
  // Frozen parameters and buffers: the first rank of each pipeline stage
  // writes its stage's (rank 0 alone without a pipeline).
  if (s.mesh->coordinates().tp == 0 && first_of_zero_group) {
    for (const auto& [name, t] : model.frozen) {
      if (!s.written_elsewhere.count(name)) file.add_whole("module/" + name, t);
    }
    for (const auto& [name, t] : model.buffers) {
      if (!s.written_elsewhere.count(name)) file.add_whole("module/" + name, t);
    }
  }
  if (s.steps.micro_steps % s.gas != 0) file.add_whole("accum/grads", s.sharded->accumulated_grads());
  for (auto& [name, gen] : generators(*s.module)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    file.add_whole(name, gen.get_state());
  }
  try {
    return {file.write(staging / ckpt::rank_file_name(rank), rank, params_record, save_id, recycle), ""};
  } catch (const std::exception& e) {
    return {ckpt::FileInfo(), e.what()};
  }
}

// Every rank's file entry, on every rank; empty when any rank failed.
std::vector<ckpt::FileInfo> share_file_entries(comm::ProcessGroup& pg, const ckpt::FileInfo& info, const std::string& error) {
  at::Tensor mine = torch::tensor({error.empty() ? 1L : 0L, static_cast<int64_t>(info.bytes),
                                   static_cast<int64_t>(std::stoull(error.empty() ? info.xxh3 : "0", nullptr, 16))},
                                  at::kLong);
  at::Tensor all = torch::empty({pg.size() * 3}, at::kLong);
  pg.all_gather(all, mine);
  std::vector<ckpt::FileInfo> entries;
  for (int r = 0; r < pg.size(); ++r) {
    if (all[3 * r].item<int64_t>() == 0) return {};
    entries.push_back({ckpt::rank_file_name(r), r, static_cast<uint64_t>(all[3 * r + 1].item<int64_t>()),
                       ckpt::xxh3_hex(static_cast<uint64_t>(all[3 * r + 2].item<int64_t>()))});
  }
  return entries;
}

}  // namespace zero::engine
