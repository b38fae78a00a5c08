#pragma once
// Plain pickled data (None, bools, numbers, strings, lists, tuples, dicts
// with string or int keys) as JSON: a ds_config, a client_state.
#include <string>

#include <nlohmann/json.hpp>

#include "torchsave/pickle.h"

namespace zero::interop {

// Throws CheckpointError naming `what` and the first value that is not plain data.
nlohmann::json to_json(const torchsave::Value& v, const std::string& what);
// The same, returning false instead of throwing.
bool try_to_json(const torchsave::Value& v, nlohmann::json& out);

}  // namespace zero::interop
