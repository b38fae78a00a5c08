// Host tensors on NVMe (offload/swapped_tensors.h): a tensor registered by
// its value (an optimizer state as it starts) costs no memory and no write
// and reads back as that value until it is written; a removed tensor gives
// its memory and its file back and cannot be used again.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "offload/swapped_tensors.h"
#include "zero/error.h"

namespace fs = std::filesystem;
using zero::offload::SwappedTensors;
using zero::offload::SwapOptions;

namespace {

struct Folder {
  fs::path path = fs::temp_directory_path() / ("zero_swapped_tensors_" + std::to_string(::getpid()));
  Folder() { fs::create_directories(path); }
  ~Folder() { fs::remove_all(path); }
  SwapOptions options() const {
    SwapOptions o;
    o.nvme_path = path.string();
    return o;
  }
};

int64_t files_bytes(const fs::path& root) {
  int64_t bytes = 0;
  for (const auto& f : fs::recursive_directory_iterator(root)) {
    if (f.is_regular_file()) bytes += static_cast<int64_t>(f.file_size());
  }
  return bytes;
}

TEST(SwappedTensors, AFilledTensorReadsAsItsValueUntilWritten) {
  Folder folder;
  SwappedTensors store(folder.options());
  at::Tensor state = torch::full({5000}, 0.25f);
  const int id = store.add_filled(state, "state", 0.25);
  EXPECT_EQ(store.resident_bytes(), 0) << "registered by value: no memory";
  EXPECT_EQ(files_bytes(folder.path), 0) << "registered by value: nothing written";
  EXPECT_EQ(store.nvme_bytes(), 5000 * 4) << "it counts as on NVMe";

  store.wait_in({id});
  EXPECT_TRUE(torch::equal(state, torch::full({5000}, 0.25f)));
  store.drop({id});  // never written, so dropping keeps its value
  EXPECT_EQ(store.resident_bytes(), 0);
  store.wait_in({id});
  EXPECT_TRUE(torch::equal(state, torch::full({5000}, 0.25f)));

  state.add_(torch::arange(5000, torch::kFloat));  // an update, written back
  store.swap_out({id});
  store.wait_out({id});
  EXPECT_GE(files_bytes(folder.path), 5000 * 4);
  store.wait_in({id});
  EXPECT_TRUE(torch::equal(state, torch::arange(5000, torch::kFloat) + 0.25f)) << "read back from its file";
}

TEST(SwappedTensors, ARemovedTensorGivesBackItsMemoryAndFile) {
  Folder folder;
  SwappedTensors store(folder.options());
  at::Tensor a = torch::arange(4096, torch::kFloat), b = torch::ones({4096});
  const int ia = store.add(a, "a"), ib = store.add(b, "b");
  store.swap_out_all();
  const int64_t both = files_bytes(folder.path);
  store.wait_in({ia});
  store.remove({ia});
  EXPECT_EQ(store.resident_bytes(), 0);
  EXPECT_EQ(files_bytes(folder.path), both / 2);
  EXPECT_EQ(store.nvme_bytes(), 4096 * 4);
  EXPECT_THROW(store.swap_in({ia}), zero::OffloadError);
  store.swap_in_all();  // the others still come back
  EXPECT_TRUE(torch::equal(b, torch::ones({4096})));
}

}  // namespace
