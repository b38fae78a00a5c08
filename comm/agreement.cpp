// agreed_error (include/zero/comm.h): one all-gather of fixed-size messages.
// disagreement: one all-gather of digests, then, only when they differ, of
// every rank's facts.
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <set>

#include "comm/all_texts.h"
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

namespace {

std::string serialized(const Facts& facts) {
  std::string text;
  for (const auto& [key, value] : facts) text += key + '\t' + value + '\n';
  return text;
}

Facts parsed(const std::string& text) {
  Facts facts;
  size_t start = 0;
  while (start < text.size()) {
    const size_t tab = text.find('\t', start), end = text.find('\n', start);
    if (tab == std::string::npos || end == std::string::npos || tab > end) break;
    facts.emplace_back(text.substr(start, tab - start), text.substr(tab + 1, end - tab - 1));
    start = end + 1;
  }
  return facts;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string disagreement(ProcessGroup& pg, const Facts& facts) {
  const std::string mine = serialized(facts);
  at::Tensor digest = torch::tensor({static_cast<int64_t>(fnv1a(mine))}, at::kLong);
  at::Tensor digests = torch::empty({pg.size()}, at::kLong);
  pg.all_gather(digests, digest);
  if ((digests == digest).all().item<bool>()) return "";

  // Keys in first-seen order over the ranks; per key, each rank's value.
  std::vector<std::string> keys;
  std::map<std::string, std::vector<std::string>> values;
  const std::vector<std::string> texts = all_texts(pg, mine);
  for (int r = 0; r < pg.size(); ++r) {
    for (const auto& [key, value] : parsed(texts[r])) {
      auto [it, fresh] = values.try_emplace(key, std::vector<std::string>(pg.size(), "(absent)"));
      if (fresh) keys.push_back(key);
      it->second[r] = value;
    }
  }
  std::vector<std::string> differing;
  for (const auto& key : keys) {
    const auto& v = values[key];
    if (std::set<std::string>(v.begin(), v.end()).size() > 1) differing.push_back(key);
  }
  if (differing.empty()) return "the ranks' facts differ in their order; every rank must build the same model in the same order";
  const auto& v = values[differing.front()];
  std::map<std::string, std::vector<int>> by_value;
  for (int r = 0; r < pg.size(); ++r) by_value[v[r]].push_back(r);
  std::string message = "the ranks disagree on " + differing.front() + ":";
  for (const auto& [value, ranks] : by_value) message += " " + value + " on " + ranks_text(ranks) + ";";
  message.pop_back();
  if (differing.size() > 1) message += " (and " + std::to_string(differing.size() - 1) + " more key(s) differ)";
  return message;
}

std::vector<std::string> all_texts(ProcessGroup& pg, const std::string& mine) {
  at::Tensor length = torch::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lengths = torch::empty({pg.size()}, at::kLong);
  pg.all_gather(lengths, length);
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  at::Tensor padded = torch::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), mine.data(), mine.size());
  at::Tensor all = torch::empty({pg.size() * longest}, at::kByte);
  pg.all_gather(all, padded);
  std::vector<std::string> texts;
  for (int r = 0; r < pg.size(); ++r) {
    texts.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * longest), lengths[r].item<int64_t>());
  }
  return texts;
}

}  // namespace zero::comm
