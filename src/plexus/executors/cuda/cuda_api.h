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

// An exported device allocation and where the value starts inside it: the
// plugin's allocator sub-allocates one region, and an export always names
// the region's base. Two kinds, as the allocation allows:
//  - kLegacyHandle: memory from cudaMalloc/cuMemAlloc, named by `handle`
//    (cudaIpcMemHandle_t: 64 opaque bytes);
//  - kPosixFd: memory from the virtual memory management API (cuMemCreate
//    + cuMemMap), named by `fd` (cuMemExportToShareableHandle), of which
//    the exporter had `mapping_size` bytes mapped from the base.
struct IpcRegion {
  enum class Kind { kLegacyHandle, kPosixFd };
  static constexpr size_t kHandleBytes = 64;
  Kind kind = Kind::kLegacyHandle;
  std::array<char, kHandleBytes> handle{};
  // kPosixFd: the exported allocation; the holder of the IpcRegion
  // ExportRegion returned owns it (closes it). Else -1.
  int fd = -1;
  uint64_t mapping_size = 0;  // kPosixFd; else 0
  uint64_t offset = 0;        // of the value from the region's base
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
  // `ordinal`): by legacy CUDA IPC where the allocation allows it
  // (cudaMalloc/cuMemAlloc: kLegacyHandle), else as a POSIX file
  // descriptor where it was created to allow one (cuMemCreate with
  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: kPosixFd, the caller owns the
  // fd). Fails (FailedPrecondition) for memory neither can export, saying
  // which kind it is (a stream-ordered pool, or a virtual memory mapping
  // without fd export) and the shareable handle types it allows; other
  // errors name the CUDA call.
  absl::StatusOr<IpcRegion> ExportRegion(int ordinal, const void* ptr) const;
  // Maps another process's exported region into this one, on GPU
  // `ordinal`; returns the value's address (base + offset). Close it with
  // CloseRegion. The exporting process must keep the memory alive until
  // then. A kPosixFd region is imported from its fd (which stays the
  // caller's to close), mapped at a fresh address range for mapping_size
  // bytes and made readable and writable from `ordinal`; on any failure
  // what was taken is released, and the error names the CUDA call.
  struct Opened {
    IpcRegion::Kind kind = IpcRegion::Kind::kLegacyHandle;
    void* base = nullptr;   // for CloseRegion
    void* value = nullptr;  // base + offset
    size_t size = 0;        // of the region mapped at base; 0: unknown
    // kPosixFd: the imported allocation (CUmemGenericAllocationHandle).
    unsigned long long allocation = 0;
  };
  absl::StatusOr<Opened> OpenRegion(int ordinal, const IpcRegion& region) const;
  // Unmaps what OpenRegion mapped (kPosixFd: unmaps, frees the address
  // range and releases the imported allocation, each attempted; the first
  // error is returned).
  absl::Status CloseRegion(int ordinal, const Opened& opened) const;

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
  // ExportRegion's and OpenRegion's kPosixFd halves (the device is current).
  absl::StatusOr<IpcRegion> ExportFd(unsigned long long address) const;
  absl::StatusOr<Opened> OpenFd(int ordinal, const IpcRegion& region) const;
  const Table* table_ = nullptr;
  std::string runtime_path_;
  std::string driver_path_;
};

}  // namespace plexus::cuda
