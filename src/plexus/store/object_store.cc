#include "plexus/store/object_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace plexus {

std::string KeyString(const BufferKey& key) {
  return absl::StrCat("buffer ", key.buffer_id, " shard ", key.shard);
}

ObjectStore::ObjectStore(Options options)
    : options_(std::move(options)),
      capacity_(options_.device_memory),
      used_(capacity_.size(), 0),
      peak_(capacity_.size(), 0) {}

ObjectStore::~ObjectStore() { Shutdown(); }

ObjectStore::Entry& ObjectStore::GetOrCreateLocked(const BufferKey& key) {
  auto [it, inserted] = entries_.try_emplace(key);
  if (inserted) {
    auto& shards = shards_[key.buffer_id];
    shards.push_back(key.shard);
    if (unknown_waiters_ > 0) created_.SignalAll();
  }
  return it->second;
}

void ObjectStore::MaybeRemoveLocked(const BufferKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (!e.declared || !e.held || e.owned || e.readers > 0 ||
      e.state == Entry::State::kPending) {
    return;
  }
  if (e.charged > 0 && e.device >= 0) {
    used_[e.device] -= e.charged;
    memory_freed_.SignalAll();
  }
  entries_.erase(it);
  auto sit = shards_.find(key.buffer_id);
  if (sit != shards_.end()) {
    auto& v = sit->second;
    v.erase(std::remove(v.begin(), v.end(), key.shard), v.end());
    if (v.empty()) shards_.erase(sit);
  }
}

void ObjectStore::Declare(const BufferKey& key, int device,
                          const TensorSpec& spec, bool owned,
                          int64_t source_worker) {
  absl::MutexLock lock(&mu_);
  Entry& e = GetOrCreateLocked(key);
  e.declared = true;
  e.owned = e.owned || owned;
  e.held = e.held || owned;
  if (e.device < 0) e.device = device;
  e.spec = spec;
  if (source_worker >= 0) e.source_worker = source_worker;
  // Data that arrived before its declaration had no device to be charged
  // to; it is charged now.
  if (e.state == Entry::State::kReady && e.charged == 0 && e.data &&
      e.device >= 0 && e.data->size() > 0) {
    e.charged = static_cast<int64_t>(e.data->size());
    ChargeLocked(e.device, e.charged);
  }
  MaybeRemoveLocked(key);
}

void ObjectStore::AddReader(const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  Entry& e = GetOrCreateLocked(key);
  e.readers++;
  e.held = true;
}

void ObjectStore::RemoveReader(const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.readers > 0) it->second.readers--;
  MaybeRemoveLocked(key);
}

void ObjectStore::FailBuffer(uint64_t buffer_id, const absl::Status& status) {
  std::vector<int32_t> shards;
  {
    absl::MutexLock lock(&mu_);
    rejected_[buffer_id] = status;
    created_.SignalAll();
    auto it = shards_.find(buffer_id);
    if (it != shards_.end()) shards = it->second;
  }
  for (int32_t s : shards) Fail({buffer_id, s}, status);
}

void ObjectStore::Release(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  rejected_.erase(buffer_id);
  auto sit = shards_.find(buffer_id);
  if (sit == shards_.end()) return;
  std::vector<int32_t> shards = sit->second;
  for (int32_t s : shards) {
    BufferKey key{buffer_id, s};
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    it->second.owned = false;
    MaybeRemoveLocked(key);
  }
}

void ObjectStore::ReleaseClient(uint64_t client_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = rejected_.begin(); it != rejected_.end();) {
    auto cur = it++;
    if (ClientOfBuffer(cur->first) == client_id) rejected_.erase(cur);
  }
  std::vector<BufferKey> keys;
  for (auto& [key, e] : entries_) {
    if (ClientOfBuffer(key.buffer_id) == client_id) keys.push_back(key);
  }
  for (const BufferKey& key : keys) {
    Entry& e = entries_[key];
    e.owned = false;
    e.declared = true;
    e.held = true;
    MaybeRemoveLocked(key);
  }
}

absl::Status ObjectStore::Reserve(int device, int64_t bytes) {
  if (device < 0 || device >= num_devices()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no device ", device, " on this worker"));
  }
  if (bytes > capacity_[device]) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a shard of ", bytes, " bytes can never fit device ",
                     device, " (memory budget ", capacity_[device], " bytes)"));
  }
  absl::MutexLock lock(&mu_);
  absl::Time deadline = absl::Now() + options_.reserve_timeout;
  while (!shutdown_ && used_[device] + bytes > capacity_[device]) {
    if (memory_freed_.WaitWithDeadline(&mu_, deadline)) {
      if (used_[device] + bytes > capacity_[device]) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "waited ", absl::FormatDuration(options_.reserve_timeout), " for ",
            bytes, " bytes on device ", device, " (budget ", capacity_[device],
            ", in use ", used_[device],
            "): release futures you no longer need"));
      }
    }
  }
  if (shutdown_) return absl::CancelledError("object store shut down");
  ChargeLocked(device, bytes);
  return absl::OkStatus();
}

void ObjectStore::Unreserve(int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_[device] -= bytes;
  memory_freed_.SignalAll();
}

absl::StatusOr<std::shared_ptr<Storage>> ObjectStore::Allocate(int device,
                                                               int64_t bytes) {
  absl::Status s = Reserve(device, bytes);
  if (!s.ok()) return s;
  auto storage = Storage::AllocateForWrite(bytes);
  if (!storage.ok()) Unreserve(device, bytes);
  return storage;
}

std::vector<ObjectStore::ReadyCallback> ObjectStore::CompleteLocked(
    const BufferKey& key, Entry& e) {
  if (e.ready) e.ready->SignalAll();
  std::vector<ReadyCallback> callbacks;
  callbacks.swap(e.callbacks);
  return callbacks;
}

void ObjectStore::RunCallbacks(
    std::vector<ReadyCallback> callbacks,
    const absl::StatusOr<std::shared_ptr<const Storage>>& result) {
  for (auto& cb : callbacks) cb(result);
}

void ObjectStore::Fulfil(const BufferKey& key, std::shared_ptr<Storage> data,
                         int device, bool reserved) {
  std::vector<ReadyCallback> callbacks;
  std::shared_ptr<const Storage> ready = data;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = GetOrCreateLocked(key);
    if (e.device < 0) e.device = device;
    int64_t bytes = static_cast<int64_t>(data->size());
    if (e.state != Entry::State::kPending) {
      // Late duplicate (e.g. the data raced a failure): drop it.
      if (reserved && device >= 0) {
        used_[device] -= bytes;
        memory_freed_.SignalAll();
      }
      return;
    }
    int charge_device = e.device >= 0 ? e.device : device;
    if (!reserved && charge_device >= 0) ChargeLocked(charge_device, bytes);
    if (charge_device >= 0) e.charged = bytes;
    e.state = Entry::State::kReady;
    e.data = std::move(data);
    callbacks = CompleteLocked(key, e);
    MaybeRemoveLocked(key);
  }
  RunCallbacks(std::move(callbacks), ready);
}

void ObjectStore::Fail(const BufferKey& key, const absl::Status& status) {
  std::vector<ReadyCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = GetOrCreateLocked(key);
    if (e.state != Entry::State::kPending) return;
    e.state = Entry::State::kFailed;
    e.status = status;
    callbacks = CompleteLocked(key, e);
    MaybeRemoveLocked(key);
  }
  RunCallbacks(std::move(callbacks), status);
}

void ObjectStore::FailFromSource(int64_t worker_id,
                                 const absl::Status& status) {
  std::vector<BufferKey> keys;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, e] : entries_) {
      if (e.state == Entry::State::kPending && e.source_worker == worker_id) {
        keys.push_back(key);
      }
    }
  }
  for (const BufferKey& key : keys) Fail(key, status);
}

absl::StatusOr<std::shared_ptr<const Storage>> ObjectStore::AwaitReady(
    const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  absl::Time unknown_deadline = absl::Now() + options_.unknown_key_timeout;
  while (true) {
    if (shutdown_) return absl::CancelledError("worker shutting down");
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      Entry& e = it->second;
      if (e.state == Entry::State::kReady) return e.data;
      if (e.state == Entry::State::kFailed) return e.status;
      if (!e.ready) e.ready = std::make_shared<absl::CondVar>();
      std::shared_ptr<absl::CondVar> ready = e.ready;
      ready->Wait(&mu_);
      continue;
    }
    auto rejected = rejected_.find(key.buffer_id);
    if (rejected != rejected_.end()) return rejected->second;
    unknown_waiters_++;
    bool timed_out = created_.WaitWithDeadline(&mu_, unknown_deadline);
    unknown_waiters_--;
    if (timed_out && entries_.find(key) == entries_.end() &&
        rejected_.find(key.buffer_id) == rejected_.end()) {
      return absl::NotFoundError(
          absl::StrCat(KeyString(key), " is not on this worker"));
    }
  }
}

void ObjectStore::OnReady(const BufferKey& key, ReadyCallback callback) {
  absl::StatusOr<std::shared_ptr<const Storage>> result;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = GetOrCreateLocked(key);
    if (e.state == Entry::State::kPending) {
      e.callbacks.push_back(std::move(callback));
      return;
    }
    if (e.state == Entry::State::kReady) {
      result = std::shared_ptr<const Storage>(e.data);
    } else {
      result = e.status;
    }
  }
  callback(result);
}

absl::StatusOr<std::pair<TensorSpec, int>> ObjectStore::Describe(
    const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.declared) {
    return absl::NotFoundError(absl::StrCat(KeyString(key), " is unknown"));
  }
  return std::make_pair(it->second.spec, it->second.device);
}

ObjectStoreStats ObjectStore::Stats() const {
  absl::MutexLock lock(&mu_);
  ObjectStoreStats stats;
  stats.live_shards = static_cast<int64_t>(entries_.size());
  stats.device_bytes = used_;
  stats.device_peak_bytes = peak_;
  for (int64_t b : used_) stats.live_bytes += b;
  return stats;
}

void ObjectStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  memory_freed_.SignalAll();
  created_.SignalAll();
  for (auto& [key, e] : entries_) {
    if (e.ready) e.ready->SignalAll();
  }
}

}  // namespace plexus
