// CudaIpc: a worker's half of moving a device value to another worker of
// the same host by CUDA IPC instead of through host memory. The sender
// awaits the value, exports the GPU allocation that holds it and sends the
// handle (PUSH_IPC, transport/data_plane.h); the receiver maps it, copies
// the value into a buffer of its own device and unmaps it; the sender holds
// the value until the receiver has answered.
//
//   sender (PeerSender)                      receiver (WorkerImpl)
//   IpcPossible ─no─▶ host staging
//     │yes
//   Export ─fails─▶ host staging
//     │ PUSH_IPC ─────────────────────────▶  admit, allocate, CopyIn
//     │ ◀──────────── ACK (stored)           (counted: transfers_ipc)
//     │ ◀──────────── ERROR (nothing taken) ─▶ host staging
//
// Wherever a step is not possible the transfer takes the host-staged path,
// which always works: CUDA IPC is never why a transfer fails.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/executors/cuda/cuda_api.h"
#include "plexus/store/device_buffer.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

// The path decision, from what the sender knows: OK where `data` may go by
// CUDA IPC, else FailedPrecondition saying why not. `shares_memory`: the
// connection to the receiver is the unix socket (the same host, sharing
// memory); `peer_opens_cuda_ipc`: the receiver said so in its handshake;
// `here`: whether this worker can make the CUDA calls (CudaIpc::available).
absl::Status IpcPossible(const Storage& data, bool shares_memory,
                         bool peer_opens_cuda_ipc, const absl::Status& here);

class CudaIpc {
 public:
  // The CUDA IPC of a worker whose PJRT plugin is `plugin_path`, on
  // platform `platform` ("cuda"; the plugin is loaded): the CUDA runtime
  // and driver are opened beside it. `wanted` false (--no-cuda-ipc), another
  // platform, no CUDA libraries or no GPU: not available(), saying why.
  static std::unique_ptr<CudaIpc> Create(bool wanted,
                                         const std::string& platform,
                                         const std::string& plugin_path);
  // Not available, for `why` (a worker without a plugin, tests).
  static std::unique_ptr<CudaIpc> Off(absl::Status why);

  // OK where this worker exports and opens CUDA IPC handles; else why not.
  const absl::Status& available() const { return available_; }

  // Sender: awaits `buffer` (its producer's error, if it failed) and
  // exports the allocation that holds it: a legacy IPC handle (cudaMalloc
  // memory) or the allocation's POSIX fd (virtual memory management with fd
  // export: the CUDA PJRT plugin's allocators), which the shard owns. An
  // error where its memory cannot be exported (not GPU memory, a
  // stream-ordered pool, a mapping that allows no fd export).
  absl::StatusOr<transport::IpcShard> Export(const DeviceBuffer& buffer) const;
  // Receiver: maps `shard` (a peer's export), copies its shard.bytes to
  // `dst` (GPU memory of this process, as large) and waits for the copy,
  // then unmaps it (a legacy handle once no other copy of this process uses
  // the mapping; a POSIX fd export is imported and mapped per copy).
  // InvalidArgument where the value would lie outside the mapped region
  // (checked where the driver gives the mapping's size).
  absl::Status CopyIn(const transport::IpcShard& shard,
                      const GpuAddress& dst) const;

 private:
  CudaIpc(const cuda::CudaApi* api, absl::Status available)
      : api_(api), available_(std::move(available)) {}

  // One mapping of a peer's legacy-handle allocation, shared by the copies
  // that use it at once: CUDA maps a handle once per process.
  struct Mapping {
    cuda::CudaApi::Opened opened;
    int users = 0;
  };
  absl::StatusOr<cuda::CudaApi::Opened> Map(const transport::IpcShard& shard,
                                            int ordinal,
                                            std::string* key) const;
  // `key` empty: `opened` is this copy's own (a POSIX fd export).
  void Unmap(const std::string& key, int ordinal,
             const cuda::CudaApi::Opened& opened) const;

  const cuda::CudaApi* const api_;  // null unless available
  const absl::Status available_;
  mutable absl::Mutex mu_;
  // By handle bytes and the ordinal it is mapped on.
  mutable absl::flat_hash_map<std::string, Mapping> mappings_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
