#pragma once
// Every error zero raises derives from zero::Error; its subclass names what is at fault.
// A message names the key, file or rank at fault and what would fix it.
#include <stdexcept>
#include <string>

namespace zero {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {      // the ds_config, launch config or options
 public:
  using Error::Error;
};
class CommError : public Error {        // another rank, the link, the launch env
 public:
  using Error::Error;
};
class PartitionError : public Error {   // the model: shapes, units, splits
 public:
  using Error::Error;
};
class OffloadError : public Error {     // host memory, CPU optimizer, NVMe folder
 public:
  using Error::Error;
};
class CheckpointError : public Error {  // a checkpoint's files
 public:
  using Error::Error;
};
class EngineError : public Error {      // the program's calls; monitors' files
 public:
  using Error::Error;
};

}  // namespace zero
