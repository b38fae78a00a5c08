// Py values pickled (protocol 2) and torch.save archives written with
// libzip. See pickle_writer.h.
#include "torchsave/pickle_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <zip.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "zero/error.h"

namespace zero::torchsave {

Py Py::none() { return Py(); }

Py Py::boolean(bool b) {
  Py p;
  p.kind_ = Kind::Bool;
  p.integer_ = b ? 1 : 0;
  return p;
}

Py Py::integer(int64_t i) {
  Py p;
  p.kind_ = Kind::Int;
  p.integer_ = i;
  return p;
}

Py Py::real(double d) {
  Py p;
  p.kind_ = Kind::Float;
  p.real_ = d;
  return p;
}

Py Py::str(std::string s) {
  Py p;
  p.kind_ = Kind::Str;
  p.text_ = std::move(s);
  return p;
}

Py Py::list(std::vector<Py> items) {
  Py p;
  p.kind_ = Kind::List;
  p.items_ = std::move(items);
  return p;
}

Py Py::tuple(std::vector<Py> items) {
  Py p;
  p.kind_ = Kind::Tuple;
  p.items_ = std::move(items);
  return p;
}

Py Py::dict() {
  Py p;
  p.kind_ = Kind::Dict;
  return p;
}

Py Py::ordered_dict() {
  Py p;
  p.kind_ = Kind::OrderedDict;
  return p;
}

Py Py::size(const std::vector<int64_t>& shape) {
  Py p;
  p.kind_ = Kind::Size;
  p.shape_ = shape;
  return p;
}

Py Py::tensor(const std::string& key, ckpt::DType dtype, const std::vector<int64_t>& shape) {
  Py p;
  p.kind_ = Kind::Tensor;
  p.text_ = key;
  p.dtype_ = dtype;
  p.shape_ = shape;
  return p;
}

Py Py::call(const std::string& module, const std::string& name, std::vector<Py> args) {
  Py p;
  p.kind_ = Kind::Call;
  p.module_ = module;
  p.text_ = name;
  p.items_ = std::move(args);
  return p;
}

Py Py::instance(const std::string& module, const std::string& name, Py attributes) {
  Py p;
  p.kind_ = Kind::Instance;
  p.module_ = module;
  p.text_ = name;
  p.items_.push_back(std::move(attributes));
  return p;
}

Py& Py::set(Py key, Py value) {
  entries_.emplace_back(std::move(key), std::move(value));
  return *this;
}

Py& Py::append(Py item) {
  items_.push_back(std::move(item));
  return *this;
}

namespace {

// torch's storage class of each element type (the name torch.save pickles).
const char* storage_class(ckpt::DType d) {
  switch (d) {
    case ckpt::DType::F32: return "FloatStorage";
    case ckpt::DType::F16: return "HalfStorage";
    case ckpt::DType::BF16: return "BFloat16Storage";
    case ckpt::DType::F64: return "DoubleStorage";
    case ckpt::DType::I64: return "LongStorage";
    case ckpt::DType::I32: return "IntStorage";
    case ckpt::DType::U8: return "ByteStorage";
    case ckpt::DType::BOOL: return "BoolStorage";
    case ckpt::DType::F8_E4M3: return "Float8_e4m3fnStorage";
    case ckpt::DType::F8_E5M2: return "Float8_e5m2Storage";
  }
  return "ByteStorage";
}

}  // namespace

// The opcodes of protocol 2 that torch.save's pickles use.
class PickleWriter {
 public:
  std::string out;

  void write(const Py& p) {
    switch (p.kind_) {
      case Py::Kind::None: out += 'N'; break;
      case Py::Kind::Bool: out += p.integer_ ? '\x88' : '\x89'; break;
      case Py::Kind::Int: integer(p.integer_); break;
      case Py::Kind::Float: {
        out += 'G';  // BINFLOAT: big-endian double
        uint64_t bits;
        std::memcpy(&bits, &p.real_, 8);
        for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
        break;
      }
      case Py::Kind::Str: str(p.text_); break;
      case Py::Kind::List:
        out += ']';  // EMPTY_LIST
        if (!p.items_.empty()) {
          out += '(';
          for (const auto& x : p.items_) write(x);
          out += 'e';  // APPENDS
        }
        break;
      case Py::Kind::Tuple: tuple(p.items_); break;
      case Py::Kind::Dict:
        out += '}';  // EMPTY_DICT
        items(p);
        break;
      case Py::Kind::OrderedDict:
        global("collections", "OrderedDict");
        out += ")R";  // EMPTY_TUPLE REDUCE: OrderedDict()
        items(p);
        break;
      case Py::Kind::Size: {
        global("torch", "Size");
        std::vector<Py> dims;
        for (int64_t d : p.shape_) dims.push_back(Py::integer(d));
        out += '(';
        tuple(dims);
        out += "tR";  // TUPLE REDUCE: torch.Size((dims))
        break;
      }
      case Py::Kind::Tensor: tensor(p); break;
      case Py::Kind::Call:
        global(p.module_, p.text_);
        tuple(p.items_);
        out += 'R';
        break;
      case Py::Kind::Instance:
        global(p.module_, p.text_);
        out += ")\x81";  // EMPTY_TUPLE NEWOBJ: cls.__new__(cls)
        write(p.items_[0]);
        out += 'b';  // BUILD: the attributes
        break;
    }
  }

 private:
  void integer(int64_t i) {
    if (i >= 0 && i < 256) {
      out += 'K';
      out += static_cast<char>(i);
    } else if (i >= 0 && i < 65536) {
      out += 'M';
      out += static_cast<char>(i & 0xff);
      out += static_cast<char>(i >> 8);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      out += 'J';
      const uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(i));
      for (int b = 0; b < 4; ++b) out += static_cast<char>((u >> (8 * b)) & 0xff);
    } else {
      out += '\x8a';  // LONG1: 8 bytes, little-endian two's complement
      out += '\x08';
      const uint64_t u = static_cast<uint64_t>(i);
      for (int b = 0; b < 8; ++b) out += static_cast<char>((u >> (8 * b)) & 0xff);
    }
  }
  void str(const std::string& s) {
    out += 'X';  // BINUNICODE
    const uint32_t n = static_cast<uint32_t>(s.size());
    for (int b = 0; b < 4; ++b) out += static_cast<char>((n >> (8 * b)) & 0xff);
    out += s;
  }
  void tuple(const std::vector<Py>& items) {
    if (items.empty()) {
      out += ')';
      return;
    }
    out += '(';
    for (const auto& x : items) write(x);
    out += 't';
  }
  void items(const Py& p) {
    if (p.entries_.empty()) return;
    out += '(';
    for (const auto& [k, v] : p.entries_) {
      write(k);
      write(v);
    }
    out += 'u';  // SETITEMS
  }
  void global(const std::string& module, const std::string& name) { out += 'c' + module + '\n' + name + '\n'; }
  void tensor(const Py& p) {
    // torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())
    global("torch._utils", "_rebuild_tensor_v2");
    out += '(';
    int64_t numel = 1;
    for (int64_t d : p.shape_) numel *= d;
    // The persistent id ('storage', torch.<T>Storage, key, 'cpu', numel).
    out += '(';
    str("storage");
    global("torch", storage_class(p.dtype_));
    str(p.text_);
    str("cpu");
    integer(numel);
    out += "tQ";  // TUPLE BINPERSID
    integer(0);
    std::vector<Py> size, stride(p.shape_.size());
    int64_t step = 1;
    for (size_t d = p.shape_.size(); d-- > 0;) {
      stride[d] = Py::integer(step);
      step *= p.shape_[d];
    }
    for (int64_t d : p.shape_) size.push_back(Py::integer(d));
    tuple(size);
    tuple(stride);
    out += '\x89';  // requires_grad False
    global("collections", "OrderedDict");
    out += ")R";
    out += "tR";
  }
};

std::string pickle(const Py& root) {
  PickleWriter w;
  w.out = "\x80\x02";
  w.write(root);
  w.out += '.';
  return w.out;
}

void write_torch_save(const std::string& path, const Py& root, const std::vector<StorageBytes>& storages) {
  namespace fs = std::filesystem;
  const std::string record = fs::path(path).stem().string();
  const std::string data = pickle(root);
  int error = 0;
  zip_t* zip = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  if (zip == nullptr) {
    zip_error_t e;
    zip_error_init_with_code(&e, error);
    const std::string text = zip_error_strerror(&e);
    zip_error_fini(&e);
    throw CheckpointError("cannot create " + path + ": " + text);
  }
  auto add = [&](const std::string& name, const void* bytes, size_t n) {
    zip_source_t* src = zip_source_buffer(zip, bytes, n, 0);
    const zip_int64_t index = src ? zip_file_add(zip, (record + "/" + name).c_str(), src, ZIP_FL_ENC_UTF_8) : -1;
    if (index < 0) {
      if (src) zip_source_free(src);
      const std::string text = zip_strerror(zip);
      zip_discard(zip);
      throw CheckpointError("cannot write " + name + " into " + path + ": " + text);
    }
    zip_set_file_compression(zip, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
  };
  static const char kByteorder[] = "little", kVersion[] = "3\n";
  add("data.pkl", data.data(), data.size());
  add("byteorder", kByteorder, sizeof kByteorder - 1);
  for (const auto& s : storages) add("data/" + s.key, s.data, s.bytes);
  add("version", kVersion, sizeof kVersion - 1);
  if (zip_close(zip) != 0) {  // writes a temporary beside `path` and renames it
    const std::string text = zip_strerror(zip);
    zip_discard(zip);
    std::error_code ec;
    fs::remove(path, ec);
    throw CheckpointError("cannot write " + path + ": " + text);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    throw CheckpointError("cannot sync " + path + ": " + std::strerror(e));
  }
  ::close(fd);
}

}  // namespace zero::torchsave
