// CudaApi: the few CUDA runtime and driver calls Plexus makes itself, next
// to the PJRT plugin that owns the GPUs: exporting and opening device
// memory across processes (CUDA IPC), device-to-device copies into a
// buffer PJRT allocated, and streams (for NCCL). The libraries are
// dlopen()ed at run time, as the plugin is, so a build links no CUDA and
// runs on machines without it: Load then fails, and callers take the path
// that needs no CUDA (host staging).
//
// The declarations are Plexus's own (the CUDA runtime's C ABI is stable
// within a major version); cuda_api.cc checks them against the toolkit's
// headers where those are installed at build time, so CI compiles the
// check. Every call returns absl::Status naming the CUDA call and the
// runtime's message.
//
// Thread-safe: the loaded table is immutable. The CUDA runtime keeps the
// current device per thread: calls that touch a device take its ordinal
// and set it first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::cuda {

// An exported device allocation (cudaIpcMemHandle_t: 64 opaque bytes) and
// where the value starts inside it: the plugin's allocator sub-allocates
// one region, and a handle always names the region's base.
struct IpcRegion {
  static constexpr size_t kHandleBytes = 64;
  std::array<char, kHandleBytes> handle{};
  uint64_t offset = 0;  // of the value from the region's base
};

// An opaque CUDA stream (cudaStream_t).
using Stream = void*;

class CudaApi {
 public:
  // The CUDA runtime (libcudart.so.13, .12, or unversioned) and driver
  // (libcuda.so.1), opened once per process: by soname first (which finds
  // the copies a loaded PJRT plugin brought in), then in `search_dirs`.
  // Later calls return the first result whatever their dirs. An error
  // names every file tried.
  static absl::StatusOr<const CudaApi*> Load(
      const std::vector<std::string>& search_dirs = {});
  // Where a PJRT plugin installed as a Python wheel keeps the CUDA
  // libraries it was built with: site-packages/nvidia/*/lib (and lib64),
  // the nvidia folder nearest above the plugin; existing ones only.
  static std::vector<std::string> LibraryDirsBeside(
      const std::string& plugin_path);

  // GPUs this process can see (an error where there is no driver or no
  // GPU: the runtime's message).
  absl::StatusOr<int> DeviceCount() const;

  // Exports the allocation that holds `ptr` (device memory of GPU
  // `ordinal`, allocated by cudaMalloc/cuMemAlloc: the plugin's BFC
  // allocator). Fails for memory CUDA IPC cannot export, saying which
  // kind it is (virtual memory management, or a stream-ordered pool) and
  // the shareable handle types the allocation allows.
  absl::StatusOr<IpcRegion> ExportRegion(int ordinal, const void* ptr) const;
  // Maps another process's exported region into this one; returns the
  // value's address (base + offset). Close it with CloseRegion(base).
  // The exporting process must keep the memory alive until then.
  struct Opened {
    void* base = nullptr;   // for CloseRegion
    void* value = nullptr;  // base + offset
    size_t size = 0;        // of the region mapped at base; 0: unknown
  };
  absl::StatusOr<Opened> OpenRegion(int ordinal, const IpcRegion& region) const;
  absl::Status CloseRegion(int ordinal, void* base) const;

  // Copies `bytes` between two device addresses (any GPUs this process
  // can address) on a stream of its own, and waits for the copy.
  absl::Status CopyDeviceToDevice(int ordinal, void* dst, const void* src,
                                  size_t bytes) const;

  // A non-blocking stream on GPU `ordinal`; Synchronize waits for what was
  // queued on it.
  absl::StatusOr<Stream> CreateStream(int ordinal) const;
  absl::Status Synchronize(int ordinal, Stream stream) const;
  absl::Status DestroyStream(int ordinal, Stream stream) const;
  // Whether `stream` has run everything queued on it (cudaStreamQuery),
  // without waiting; an error queued work hit.
  absl::StatusOr<bool> StreamDone(int ordinal, Stream stream) const;

  // Makes GPU `ordinal` the calling thread's current device (for libraries
  // that work on the current device: NCCL).
  absl::Status MakeCurrent(int ordinal) const { return Use(ordinal); }
  // The GPU's UUID (cuDeviceGetUuid), as 32 hex digits: the same GPU seen
  // from two processes, whatever their CUDA_VISIBLE_DEVICES.
  absl::StatusOr<std::string> DeviceUuid(int ordinal) const;

  // The files Load opened.
  const std::string& runtime_path() const { return runtime_path_; }
  const std::string& driver_path() const { return driver_path_; }

  struct Table;  // the function pointers (cuda_api.cc)

 private:
  CudaApi() = default;
  absl::Status Use(int ordinal) const;  // cudaSetDevice(ordinal)
  const Table* table_ = nullptr;
  std::string runtime_path_;
  std::string driver_path_;
};

}  // namespace plexus::cuda
