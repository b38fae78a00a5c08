#pragma once
// Every error zero raises derives from zero::Error, one subclass per layer.
// A message names the key, file or rank at fault and what would fix it.
#include <stdexcept>
#include <string>

namespace zero {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {      // engine/: ds_config parsing and validation
 public:
  using Error::Error;
};
class CommError : public Error {        // comm/: rendezvous, collectives, timeouts
 public:
  using Error::Error;
};
class PartitionError : public Error {   // zero/: partitioning and units
 public:
  using Error::Error;
};
class OffloadError : public Error {     // offload/: host optimizers, NVMe swapping
 public:
  using Error::Error;
};
class CheckpointError : public Error {  // ckpt/: save, load, reshard
 public:
  using Error::Error;
};
class EngineError : public Error {      // engine/: the training loop
 public:
  using Error::Error;
};

}  // namespace zero
