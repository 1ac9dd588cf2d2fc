// ObjectStore: the shards a worker holds for its devices, keyed by
// (buffer id, shard), with per-device memory budgets.
//
// Entry states:
//
//   (created by Declare/Expect/Deliver) --> pending --Fulfil--> ready
//                                              \------Fail----> failed
//
// An entry is removed once (a) it was declared (by a call output, a put, an
// Expect), (b) it was held at least once (owned by a client, or read by a
// queued consumer), (c) its owner released it and no queued reader holds it
// any more, and (d) it is no longer pending. Entries may be touched in any
// order: data can arrive before its declaration, and a temporary declared
// before its reader is queued is not dropped in between.
//
// Thread-safe. Waits (AwaitReady, Reserve) block on condition variables and
// never spin.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/types.h"
#include "plexus/store/storage.h"

namespace plexus {

struct BufferKey {
  uint64_t buffer_id = 0;
  int32_t shard = 0;
  bool operator==(const BufferKey& o) const {
    return buffer_id == o.buffer_id && shard == o.shard;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BufferKey& k) {
    return H::combine(std::move(h), k.buffer_id, k.shard);
  }
};
std::string KeyString(const BufferKey& key);  // "buffer 12 shard 0"

// The bits of a buffer id that name the client owning it; the rest count.
inline constexpr int kBufferIdClientShift = 40;
inline uint64_t ClientOfBuffer(uint64_t buffer_id) {
  return buffer_id >> kBufferIdClientShift;
}

struct ObjectStoreStats {
  int64_t live_shards = 0;
  int64_t live_bytes = 0;
  std::vector<int64_t> device_bytes;
  std::vector<int64_t> device_peak_bytes;  // high-water mark since start
};

class ObjectStore {
 public:
  struct Options {
    std::vector<int64_t> device_memory;  // budget in bytes, per device
    absl::Duration reserve_timeout = absl::Seconds(30);
    absl::Duration unknown_key_timeout = absl::Seconds(30);
  };
  using ReadyCallback =
      std::function<void(absl::StatusOr<std::shared_ptr<const Storage>>)>;

  explicit ObjectStore(Options options);
  ~ObjectStore();

  int num_devices() const { return static_cast<int>(capacity_.size()); }
  int64_t capacity(int device) const { return capacity_[device]; }

  // A shard this worker will hold. `owned`: the client holds a reference
  // until Release. `source_worker` >= 0: the data will come from that peer
  // (so PeerDown can fail it).
  void Declare(const BufferKey& key, int device, const TensorSpec& spec,
               bool owned, int64_t source_worker = -1);
  // Queued consumers keep an entry alive until they are done.
  void AddReader(const BufferKey& key);
  void RemoveReader(const BufferKey& key);
  // The client dropped its reference: every shard of the buffer.
  void Release(uint64_t buffer_id);
  // Everything `client_id` owned (it disconnected).
  void ReleaseClient(uint64_t client_id);

  // Charges `bytes` to `device`, waiting while the budget is exhausted
  // (back-pressure). Fails at once if it can never fit, and after
  // reserve_timeout otherwise.
  absl::Status Reserve(int device, int64_t bytes);
  void Unreserve(int device, int64_t bytes);
  // Reserve + Storage::Allocate.
  absl::StatusOr<std::shared_ptr<Storage>> Allocate(int device, int64_t bytes);

  // Attaches data; the reservation for data->size() on the entry's device
  // moves to the entry (`reserved`), or is taken now without waiting.
  void Fulfil(const BufferKey& key, std::shared_ptr<Storage> data,
              int device = -1, bool reserved = true);
  void Fail(const BufferKey& key, const absl::Status& status);
  // Every shard of `buffer_id`, present or still to be declared, fails with
  // `status` (its call was rejected before reaching this worker) until the
  // buffer is released.
  void FailBuffer(uint64_t buffer_id, const absl::Status& status);
  // Fails every pending shard expected from `worker_id`.
  void FailFromSource(int64_t worker_id, const absl::Status& status);

  // Blocks until the shard is ready or failed. A key this store has never
  // seen is waited for up to unknown_key_timeout (its declaration may still
  // be in flight), then NotFound.
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const BufferKey& key);
  // Runs `callback` once the shard is ready or failed: at once (on this
  // thread) if it already is, else on the thread that fulfils or fails it.
  void OnReady(const BufferKey& key, ReadyCallback callback);
  // The entry's spec and device, if declared.
  absl::StatusOr<std::pair<TensorSpec, int>> Describe(const BufferKey& key);

  ObjectStoreStats Stats() const;
  // Wakes every waiter with an error; later waits fail at once.
  void Shutdown();

 private:
  struct Entry {
    enum class State { kPending, kReady, kFailed };
    State state = State::kPending;
    bool declared = false;
    bool owned = false;
    int device = -1;
    int64_t source_worker = -1;
    int64_t charged = 0;
    int readers = 0;
    bool held = false;  // owned or read at least once
    TensorSpec spec;
    std::shared_ptr<Storage> data;
    absl::Status status;
    std::vector<ReadyCallback> callbacks;
    // Waiters on this shard only (made by the first one); shared so that a
    // waiter keeps it while the entry may be erased.
    std::shared_ptr<absl::CondVar> ready;
  };

  Entry& GetOrCreateLocked(const BufferKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry if nothing keeps it.
  void MaybeRemoveLocked(const BufferKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the entry to a final state; returns the callbacks to run unlocked.
  std::vector<ReadyCallback> CompleteLocked(const BufferKey& key, Entry& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunCallbacks(
      std::vector<ReadyCallback> callbacks,
      const absl::StatusOr<std::shared_ptr<const Storage>>& result);

  const Options options_;
  const std::vector<int64_t> capacity_;

  mutable absl::Mutex mu_;
  absl::CondVar memory_freed_;  // a device's used bytes went down
  absl::CondVar created_;       // an entry appeared (for unknown-key waits)
  int unknown_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<BufferKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Shards per buffer id, for Release.
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> shards_
      ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> used_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> peak_ ABSL_GUARDED_BY(mu_);
  void ChargeLocked(int device, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    used_[device] += bytes;
    if (used_[device] > peak_[device]) peak_[device] = used_[device];
  }
  // Buffers whose calls were rejected: their shards fail on sight.
  absl::flat_hash_map<uint64_t, absl::Status> rejected_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace plexus
