// The tensorboard monitor (monitor/monitor.h): TensorBoard's event files.
//
// A file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// (little-endian), whose data is one serialized Event: first the file version
// "brain.Event:2", then one Event per step holding that step's scalars as
// Summary values. The file is named as TensorBoard's writers name theirs,
// events.out.tfevents.<seconds>.<host>.<pid>.<n>, so TensorBoard finds it.
#include "monitor/monitor.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/write_failure.h"
#include "zero/error.h"

#ifdef ZERO_HAVE_TENSORBOARD
#include "monitor/tensorboard_event.pb.h"
#endif

namespace zero::monitor {

bool tensorboard_available() {
#ifdef ZERO_HAVE_TENSORBOARD
  return true;
#else
  return false;
#endif
}

#ifdef ZERO_HAVE_TENSORBOARD
namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses it.
uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// TFRecord's masking, so that a CRC stored inside the data is not read as one.
uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class TensorBoardSink : public Sink {
 public:
  explicit TensorBoardSink(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw EngineError("tensorboard: cannot create " + dir + " (" + ec.message() + "); set tensorboard.output_path to a writable folder");
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    static int files_made = 0;
    path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_s())) + "." + host + "." +
            std::to_string(::getpid()) + "." + std::to_string(files_made++);
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) throw EngineError("tensorboard: cannot create " + path_ + ": " + std::strerror(errno));
    tensorboard::Event version;
    version.set_wall_time(now_s());
    version.set_file_version("brain.Event:2");
    record(version);
    // A full disk is found here, at initialize, where every rank agrees on it.
    if (std::fflush(file_) != 0) {
      const int e = errno;
      std::fclose(file_);
      throw EngineError("tensorboard: writing " + path_ + " failed: " + std::strerror(e) +
                        "; set tensorboard.output_path to a folder on a disk with space");
    }
  }
  ~TensorBoardSink() override { std::fclose(file_); }

  // One Event per step: the events of one write share their step.
  void write(const std::vector<Event>& events) override {
    std::map<int64_t, tensorboard::Event> by_step;
    const double wall = now_s();
    for (const Event& e : events) {
      tensorboard::Event& out = by_step[e.step];
      out.set_wall_time(wall);
      out.set_step(e.step);
      tensorboard::SummaryValue* v = out.mutable_summary()->add_value();
      v->set_tag(e.tag);
      v->set_simple_value(static_cast<float>(e.value));
    }
    for (const auto& [step, event] : by_step) record(event);
  }
  void flush() override {
    if (std::fflush(file_) != 0) fail();
  }

 private:
  void record(const tensorboard::Event& event) {
    errno = 0;
    const std::string data = event.SerializeAsString();
    const uint64_t length = data.size();  // little-endian on every machine zero runs on
    const uint32_t length_crc = masked_crc(&length, sizeof(length)), data_crc = masked_crc(data.data(), data.size());
    if (std::fwrite(&length, sizeof(length), 1, file_) != 1 || std::fwrite(&length_crc, sizeof(length_crc), 1, file_) != 1 ||
        std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
        std::fwrite(&data_crc, sizeof(data_crc), 1, file_) != 1) {
      fail();
    }
  }
  [[noreturn]] void fail() {
    throw EngineError(write_failure::report("tensorboard", path_, errno != 0 ? errno : EIO));
  }
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace

std::unique_ptr<Sink> tensorboard_sink(const std::string& dir) { return std::make_unique<TensorBoardSink>(dir); }

#else

std::unique_ptr<Sink> tensorboard_sink(const std::string&) {
  throw EngineError(
      "tensorboard: this build of zero has no TensorBoard writer (protobuf was not found when it was built); "
      "install libprotobuf-dev and protobuf-compiler and rebuild, or use \"csv_monitor\" instead");
}

#endif

}  // namespace zero::monitor
