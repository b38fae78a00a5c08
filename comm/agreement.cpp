// agreed_error (include/zero/comm.h): one all-gather of fixed-size messages.
#include <torch/torch.h>

#include <cstring>

#include "zero/comm.h"

namespace zero::comm {

std::string agreed_error(ProcessGroup& pg, const std::string& my_error, const std::string& what) {
  constexpr int64_t kMessage = 2048;
  at::Tensor mine = torch::zeros({kMessage}, at::kByte);
  std::memcpy(mine.data_ptr(), my_error.data(), std::min<size_t>(my_error.size(), kMessage - 1));
  at::Tensor all = torch::empty({pg.size() * kMessage}, at::kByte);
  pg.all_gather(all, mine);
  std::string message;
  int failed = 0;
  for (int r = 0; r < pg.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kMessage);
    if (text[0] == 0) continue;
    ++failed;
    message += "\n  rank " + std::to_string(r) + ": " + std::string(text, strnlen(text, kMessage));
  }
  if (failed == 0) return "";
  if (failed == 1 && !my_error.empty()) return my_error;
  return what + ":" + message;
}

}  // namespace zero::comm
