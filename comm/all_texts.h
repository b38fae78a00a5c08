#pragma once
// Every rank's text, on every rank (comm/agreement.cpp): the lengths are
// all-gathered first, then the texts padded to the longest. A collective.
#include <string>
#include <vector>

#include "zero/comm.h"

namespace zero::comm {

std::vector<std::string> all_texts(ProcessGroup& pg, const std::string& mine);

}  // namespace zero::comm
