#pragma once
// One rank's file of a checkpoint and every rank's entry for the manifest
// (engine/checkpoint_rank_file.cpp), shared by the saves of
// engine/checkpoint_save.cpp.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "engine/checkpoint_io.h"
#include "engine/training_parts.h"
#include "zero/comm.h"

namespace zero::engine {

// The optimizer states saved: those the optimizer has made (none before its first step).
std::vector<std::string> saved_kinds(TrainingParts& s);

// Writes this rank's file into `staging` (over the file `recycle` names,
// when there is one: ckpt::write_safetensors); returns its size and
// checksum, or the error.
std::pair<ckpt::FileInfo, std::string> write_rank_file(TrainingParts& s, const std::filesystem::path& staging,
                                                       const std::vector<std::string>& kinds, const ModelTensors& model,
                                                       const std::string& params_record, const std::string& save_id,
                                                       bool allow_non_finite, const std::string& recycle = "");

// Every rank's file entry, on every rank; empty when any rank failed. A collective.
std::vector<ckpt::FileInfo> share_file_entries(comm::ProcessGroup& pg, const ckpt::FileInfo& info, const std::string& error);

}  // namespace zero::engine
