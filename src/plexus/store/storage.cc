#include "plexus/store/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace plexus {
namespace {

constexpr size_t kHeapAlignment = 64;  // one cache line
// Seals that make a received memfd safe to map: its owner can neither shrink
// it under our mapping (a later access would SIGBUS) nor grow it.
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

absl::Status SyscallError(absl::string_view syscall, size_t bytes, int err) {
  return absl::ErrnoToStatus(
      err, absl::StrCat("shard storage: ", syscall, " (", bytes,
                        " bytes) failed: ", std::strerror(err)));
}

// Maps `bytes` of `fd` read-write and shared. A zero-byte block is not mapped
// (mmap rejects a zero length); its data() is null.
absl::StatusOr<void*> MapShared(int fd, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd, 0);
  if (data == MAP_FAILED) return SyscallError("mmap", bytes, errno);
  return data;
}

}  // namespace

// Freed memfd blocks that never left this process, by size, for reuse.
class StorageCache {
 public:
  static StorageCache& Get() {
    static StorageCache* cache = new StorageCache();
    return *cache;
  }
  Storage* Take(size_t bytes) {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(bytes);
    if (it == blocks_.end()) return nullptr;
    Storage* s = it->second;
    blocks_.erase(it);
    cached_ -= bytes;
    return s;
  }
  // Keeps `s` if it fits under the cap; otherwise the caller frees it.
  bool Put(Storage* s) {
    absl::MutexLock lock(&mu_);
    if (s->size_ > limit_) return false;
    while (cached_ + s->size_ > limit_ && !blocks_.empty()) {
      auto victim = blocks_.begin();  // any block: sizes repeat in practice
      cached_ -= victim->first;
      Storage* v = victim->second;
      blocks_.erase(victim);
      delete v;
    }
    blocks_.emplace(s->size_, s);
    cached_ += s->size_;
    return true;
  }
  size_t cached() {
    absl::MutexLock lock(&mu_);
    return cached_;
  }
  void set_limit(size_t limit) {
    absl::MutexLock lock(&mu_);
    limit_ = limit;
  }

 private:
  StorageCache() {
    const char* env = std::getenv("PLEXUS_STORAGE_CACHE_MIB");
    limit_ = (env ? std::strtoull(env, nullptr, 10) : 512) << 20;
  }
  absl::Mutex mu_;
  std::multimap<size_t, Storage*> blocks_ ABSL_GUARDED_BY(mu_);
  size_t cached_ ABSL_GUARDED_BY(mu_) = 0;
  size_t limit_ ABSL_GUARDED_BY(mu_) = 0;
};

void Storage::Recycle(Storage* storage) {
  storage->views_.Clear();  // its bytes are written again when reused
  if (storage->mapped_ && storage->fd_ >= 0 && !storage->exported_ &&
      StorageCache::Get().Put(storage)) {
    return;
  }
  delete storage;
}

size_t Storage::CachedBytes() { return StorageCache::Get().cached(); }
void Storage::SetCacheLimit(size_t bytes) {
  StorageCache::Get().set_limit(bytes);
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::AllocateForWrite(
    size_t bytes) {
  if (bytes >= kShmThreshold) {
    if (Storage* s = StorageCache::Get().Take(bytes)) {
      return std::shared_ptr<Storage>(s, &Storage::Recycle);
    }
  }
  return Allocate(bytes);
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(size_t bytes,
                                                           bool force_shm) {
  if (bytes < kShmThreshold && !force_shm) {
    // aligned_alloc wants a multiple of the alignment, and a non-zero size so
    // that data() is never null for a heap block.
    size_t rounded =
        (bytes + kHeapAlignment - 1) / kHeapAlignment * kHeapAlignment;
    if (rounded == 0) rounded = kHeapAlignment;
    void* data = std::aligned_alloc(kHeapAlignment, rounded);
    if (data == nullptr) return SyscallError("aligned_alloc", bytes, ENOMEM);
    std::memset(data, 0, rounded);
    return std::shared_ptr<Storage>(
        new Storage(data, bytes, /*fd=*/-1, /*mapped=*/false));
  }
  int fd = memfd_create("plexus-shard", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SyscallError("memfd_create", bytes, errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return SyscallError("ftruncate", bytes, err);
  }
  if (fcntl(fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return SyscallError("fcntl(F_ADD_SEALS)", bytes, err);
  }
  absl::StatusOr<void*> data = MapShared(fd, bytes);
  if (!data.ok()) {
    close(fd);
    return data.status();
  }
  // The kernel hands out zero-filled pages.
  return std::shared_ptr<Storage>(new Storage(*data, bytes, fd, true),
                                  &Storage::Recycle);
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::FromFd(int fd, size_t bytes) {
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard storage: invalid descriptor ", fd));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return SyscallError("fstat", bytes, err);
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shard storage: received file holds ", st.st_size,
                     " bytes, expected at least ", bytes));
  }
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    return absl::InvalidArgumentError(
        "shard storage: received file is not a memfd sealed against "
        "shrinking; mapping it is unsafe");
  }
  absl::StatusOr<void*> data = MapShared(fd, bytes);
  if (!data.ok()) {
    close(fd);
    return data.status();
  }
  auto received = std::shared_ptr<Storage>(new Storage(*data, bytes, fd, true));
  received->exported_ = true;  // the sender still maps it
  return received;
}

std::shared_ptr<Storage> Storage::OnDevice(
    std::shared_ptr<const DeviceBuffer> buffer) {
  auto storage = std::shared_ptr<Storage>(
      new Storage(nullptr, buffer->size(), /*fd=*/-1, /*mapped=*/false));
  storage->device_ = std::move(buffer);
  return storage;
}

absl::StatusOr<std::shared_ptr<const Storage>> Storage::InHostMemory(
    std::shared_ptr<const Storage> storage, bool shareable) {
  const DeviceBuffer* device = storage->device_buffer();
  if (device == nullptr) return storage;
  if (absl::Status s = device->Await(); !s.ok()) return s;
  if (storage->data() != nullptr &&
      !(shareable && storage->size() >= kShmThreshold)) {
    return storage;  // read in place: the device's memory is the host's
  }
  auto copy = AllocateForWrite(storage->size());
  if (!copy.ok()) return copy.status();
  if (absl::Status s = device->CopyToHost((*copy)->data()); !s.ok()) {
    return s;
  }
  return std::shared_ptr<const Storage>(std::move(*copy));
}

Storage::~Storage() {
  views_.Clear();  // each view reads the bytes freed below
  if (device_) {
    // device memory: its buffer frees it
  } else if (mapped_) {
    if (data_ != nullptr) munmap(data_, size_);
  } else {
    std::free(data_);
  }
  if (fd_ >= 0) close(fd_);
}

}  // namespace plexus
