// Host tensors on NVMe (offload/swapped_tensors.h): a tensor registered by
// its value (an optimizer state as it starts) costs no memory and no write
// and reads back as that value until it is written; a removed tensor gives
// its memory and its file back and cannot be used again; a tensor made by
// add_copy holds its source's values, converted, through a round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdint>
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
  for (int i = 0; i < 1000 && files_bytes(folder.path) != both / 2; ++i) usleep(10000);  // unlinked on a thread of its own
  EXPECT_EQ(files_bytes(folder.path), both / 2);
  EXPECT_EQ(store.nvme_bytes(), 4096 * 4);
  EXPECT_THROW(store.swap_in({ia}), zero::OffloadError);
  store.swap_in_all();  // the others still come back
  EXPECT_TRUE(torch::equal(b, torch::ones({4096})));
}

TEST(SwappedTensors, ACopyHoldsItsSourceConvertedThroughARoundTrip) {
  Folder folder;
  SwappedTensors store(folder.options());
  const at::Tensor source = torch::randn({3, 1000}, torch::kDouble);  // a 2-D source of another dtype
  auto [copy, id] = store.add_copy(source, at::kFloat, "copy");
  EXPECT_EQ(store.find(copy), id);
  EXPECT_EQ(copy.sizes(), at::IntArrayRef({3000}));
  EXPECT_EQ(copy.scalar_type(), at::kFloat);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data_ptr()) % zero::offload::kIoAlignment, 0u) << "aligned for O_DIRECT";
  const at::Tensor expected = source.reshape(-1).to(at::kFloat);
  EXPECT_TRUE(torch::equal(copy, expected));
  EXPECT_EQ(store.resident_bytes(), 3000 * 4);
  store.swap_out({id});
  store.wait_out({id});
  EXPECT_EQ(store.resident_bytes(), 0);
  EXPECT_GE(files_bytes(folder.path), 3000 * 4);
  store.wait_in({id});
  EXPECT_TRUE(torch::equal(copy, expected)) << "read back from its file";
}

TEST(SwappedTensors, AnAddedTensorKeepsItsValuesAndItsTensorImpl) {
  Folder folder;
  SwappedTensors store(folder.options());
  at::Tensor t = torch::arange(10000, torch::kFloat);
  const auto* impl = t.unsafeGetTensorImpl();
  const int id = store.add(t, "t");
  EXPECT_EQ(t.unsafeGetTensorImpl(), impl);
  EXPECT_TRUE(torch::equal(t, torch::arange(10000, torch::kFloat)));
  store.swap_out({id});
  store.wait_out({id});
  store.wait_in({id});
  EXPECT_TRUE(torch::equal(t, torch::arange(10000, torch::kFloat)));
}

}  // namespace
