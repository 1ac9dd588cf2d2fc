// DeviceBuffer: one shard's bytes in a device's own memory (the XLA
// executor's PJRT buffers, executors/xla/pjrt_runtime.h), seen through the
// interface the object store, fetches and transfers use, so that none of
// them needs XLA. A store entry holds host memory (a Storage of its own) or
// a device buffer (Storage::OnDevice); memory kinds are PJRT's: a device
// buffer is in the memory space PJRT put it in.
//
// A device buffer enters the store as soon as the program that makes it is
// queued on its device, before it has run:
//
//   queued on the device ──(the program runs)──▶ ready
//                        └─(the run fails)─────▶ failed (its error, kept)
//
// The next program on the device reads it as it is and the plugin orders
// the two (no host thread waits); a reader on the host calls Await first.
// Immutable once ready; thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus {

// Where a value lies in a CUDA GPU's memory: for the CUDA calls Plexus makes
// beside the plugin (CUDA IPC between workers of one host).
struct GpuAddress {
  void* address = nullptr;
  int ordinal = -1;  // the CUDA device, as this process numbers them
};

class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // Bytes of the value, dense and row-major (as in host memory).
  virtual size_t size() const = 0;
  // Blocks until the value has been computed. Its producer's error where
  // that failed: every host reader then fails with it, and every program
  // that reads it on the device fails with it too (the plugin's message,
  // named by the program that made it). Cheap once it has returned.
  virtual absl::Status Await() const = 0;
  // Await's result where the value is computed (or failed) already; none
  // while it is still being computed, or where this buffer cannot tell
  // without waiting. Never blocks: asked by a thread that must not wait
  // (the one that readies a fetched value, to answer the fetch from there).
  virtual std::optional<absl::Status> Computed() const { return std::nullopt; }
  // Where the device's memory is the host's (the CPU plugin) and the bytes
  // are laid out densely and row-major: their address, readable in place
  // once Await returned OK. Null before, and where host code cannot read
  // them (a GPU).
  virtual const void* host_address() const = 0;
  // Awaits the value, copies it into `dst` (size() bytes of host memory)
  // and waits for the copy. Counts MemoryTraffic::device_to_host.
  virtual absl::Status CopyToHost(void* dst) const = 0;
  // Whether a program it was donated to wrote its output over it (XLA's
  // input-output aliasing): it then holds no value.
  virtual bool donated() const { return false; }
  // Whether the value is in a CUDA GPU's memory, so that gpu_address can
  // say where (a PJRT buffer of the CUDA plugin). Cheap; never waits.
  virtual bool in_gpu_memory() const { return false; }
  // Awaits the value, then its address in GPU memory: valid while this
  // buffer lives, dense and row-major, size() bytes. FailedPrecondition
  // where it is not in GPU memory, or laid out otherwise (the plugin's
  // on-device size differs from size()). The bytes of a ready buffer are
  // never written through it, except by whoever made the buffer to fill
  // it (PjrtRuntime::CreateUninitialized).
  virtual absl::StatusOr<GpuAddress> gpu_address() const {
    return absl::FailedPreconditionError("not in GPU memory");
  }
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

// The paths shards took between devices and workers in this process, one
// count per shard moved or read (WorkerStats.transfers_*; tests assert
// which ran): a program reading a device value on its own device as it is
// (alias), the plugin's copy between two devices of this worker
// (device_to_device), a device value sent to another worker through host
// memory (host_staged) or, to a worker of the same host, mapped and copied
// by the receiver from the sender's GPU memory (ipc: counted by the sender
// once the receiver has stored it). All-reduces summed on the GPUs by
// NCCL are counted beside the NCCL path (NcclPaths in
// worker/nccl_collective.h).
struct TransferPaths {
  static std::atomic<int64_t>& alias() {
    static std::atomic<int64_t> n{0};
    return n;
  }
  static std::atomic<int64_t>& device_to_device() {
    static std::atomic<int64_t> n{0};
    return n;
  }
  static std::atomic<int64_t>& host_staged() {
    static std::atomic<int64_t> n{0};
    return n;
  }
  static std::atomic<int64_t>& ipc() {
    static std::atomic<int64_t> n{0};
    return n;
  }
};

// The bytes behind those paths in this process (WorkerStats.transfer_bytes,
// /metrics' plexus_transfer_bytes_total): counted where the path is known,
// one shard's size each time: a value read in place (alias) or copied from
// another device of this worker (device_to_device) by an XLA run; sent to
// another worker by CUDA IPC (counted by the sender once the receiver
// stored it), as a memfd over a unix socket (shared_memory) or as bytes
// over TCP (tcp; counted by the sender once delivered, whether the value
// was in host memory or staged there from a device); an all_reduce shard
// summed on the GPUs by NCCL (nccl). A failed transfer counts nothing.
struct TransferBytes {
  enum Path { kAlias, kDeviceToDevice, kIpc, kSharedMemory, kTcp, kNccl };
  static constexpr int kPaths = kNccl + 1;
  static std::atomic<int64_t>& of(Path path) {
    static std::atomic<int64_t> n[kPaths] = {};
    return n[path];
  }
  static void Add(Path path, int64_t bytes) {
    of(path).fetch_add(bytes, std::memory_order_relaxed);
  }
};

}  // namespace plexus
