// DeviceBuffer: one shard's bytes in a device's own memory (the XLA
// executor's PJRT buffers, executors/xla/pjrt_runtime.h), seen through the
// interface the object store, fetches and transfers use, so that none of
// them needs XLA. A store entry holds host memory (a Storage of its own) or
// a device buffer (Storage::OnDevice); memory kinds are PJRT's: a device
// buffer is in the memory space PJRT put it in.
//
// Immutable once ready (the executor hands it over only then); thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace plexus {

class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // Bytes of the value, dense and row-major (as in host memory).
  virtual size_t size() const = 0;
  // Where the device's memory is the host's (the CPU plugin) and the bytes
  // are laid out densely and row-major: their address, readable in place.
  // Null where host code cannot read them (a GPU).
  virtual const void* host_address() const = 0;
  // Copies the value into `dst` (size() bytes of host memory) and waits
  // for the copy. Counts MemoryTraffic::device_to_host.
  virtual absl::Status CopyToHost(void* dst) const = 0;
};

// Bytes this process copied between host and device memory, each way: the
// figures `WorkerStats` reports (tests assert a chain of device calls
// copies none).
struct MemoryTraffic {
  static std::atomic<int64_t>& host_to_device() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
  static std::atomic<int64_t>& device_to_host() {
    static std::atomic<int64_t> bytes{0};
    return bytes;
  }
};

}  // namespace plexus
