// Storage: one shard's bytes, in one of two memory kinds.
//  - Host memory: one contiguous block. Large blocks live in a memfd so
//    that a worker or client on the same machine can map them (the
//    shared-memory data plane passes the fd over a unix socket; no byte is
//    copied through a socket). Small blocks live on the heap, where a
//    syscall per allocation would cost more than the copy.
//  - Device memory: a DeviceBuffer (an XLA output), left where it was
//    computed. The next XLA program on that device reads it in place; a
//    reader that needs host bytes (a fetch, a transfer, a built-in kernel)
//    asks InHostMemory, which copies only where it must.
//
// Immutable once its producer has written it; safe to read from any thread.
// Shared (shared_ptr) because a block is read by the object store entry, by
// in-flight transfers and by fetches at once, and freed by the last of them.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "plexus/store/device_buffer.h"
#include "plexus/store/host_views.h"

namespace plexus {

enum class MemoryKind { kHost, kDevice };

class Storage {
 public:
  // Blocks of at least this many bytes are memfd-backed.
  static constexpr size_t kShmThreshold = 256 * 1024;

  // New zero-filled block; memfd-backed when bytes >= kShmThreshold (or
  // `force_shm`).
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(
      size_t bytes, bool force_shm = false);
  // A block whose contents the caller overwrites entirely: a kernel output,
  // an incoming transfer. memfd blocks come from a per-process cache of
  // blocks freed earlier, when one of that size is there (mapping fresh
  // shared memory costs more than copying it on these machines).
  static absl::StatusOr<std::shared_ptr<Storage>> AllocateForWrite(
      size_t bytes);
  // Bytes kept for reuse by AllocateForWrite, and the cap (default 512 MiB,
  // PLEXUS_STORAGE_CACHE_MIB overrides).
  static size_t CachedBytes();
  static void SetCacheLimit(size_t bytes);
  // Maps a memfd received from another process. Takes ownership of `fd`,
  // also on error; it stays open (so the block can be sent on) until the
  // Storage is destroyed. Errors if the file is shorter than `bytes` or is
  // not sealed against shrinking (as Allocate's memfds are).
  static absl::StatusOr<std::shared_ptr<Storage>> FromFd(int fd, size_t bytes);

  // A shard left in a device's memory, which may not be computed yet
  // (DeviceBuffer). data() is its host address where the device's memory
  // is the host's and the value is ready (DeviceBuffer::host_address),
  // else null: a reader on the host goes through InHostMemory.
  static std::shared_ptr<Storage> OnDevice(
      std::shared_ptr<const DeviceBuffer> buffer);
  // The bytes of `storage` in host memory, for a reader on the host: the
  // block itself where it is host memory, or device memory readable in
  // place (unless `shareable`); else a copy (counted in MemoryTraffic).
  // Device memory is awaited first: its producer's error is returned.
  // `shareable`: the block may go to another process, so a large one must
  // be a memfd (device memory never is).
  static absl::StatusOr<std::shared_ptr<const Storage>> InHostMemory(
      std::shared_ptr<const Storage> storage, bool shareable);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() {
    return device_ ? const_cast<void*>(device_->host_address()) : data_;
  }
  const void* data() const { return device_ ? device_->host_address() : data_; }
  size_t size() const { return size_; }
  // A descriptor to hand to another process, or -1 for heap blocks. Asking
  // for it marks the block shared: it is never recycled, since the other
  // process may still read it.
  int fd() const {
    exported_ = true;
    return fd_;
  }
  bool shared() const { return fd_ >= 0; }
  MemoryKind kind() const {
    return device_ ? MemoryKind::kDevice : MemoryKind::kHost;
  }
  // The device buffer of a device-memory block; null for host memory.
  const DeviceBuffer* device_buffer() const { return device_.get(); }
  // Device runtimes' views of this block's bytes (host_views.h), kept while
  // it lives; dropped before its memory is freed or recycled.
  HostViews& views() const { return views_; }
  // Owners of the device buffer (this block among them); 0 for host memory.
  long device_buffer_use_count() const { return device_.use_count(); }

 private:
  Storage(void* data, size_t size, int fd, bool mapped)
      : data_(data), size_(size), fd_(fd), mapped_(mapped) {}
  friend class StorageCache;
  static void Recycle(Storage* storage);  // shared_ptr deleter

  void* data_;
  size_t size_;
  int fd_;       // memfd kept open so it can be sent again; -1 for heap
  bool mapped_;  // munmap vs free
  mutable std::atomic<bool> exported_{false};   // another process has it
  std::shared_ptr<const DeviceBuffer> device_;  // device memory: the owner
  mutable HostViews views_;
};

}  // namespace plexus
