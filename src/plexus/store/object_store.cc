#include "plexus/store/object_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/status_proto.h"

namespace plexus {

ObjectStore::ObjectStore(Options options)
    : options_(std::move(options)),
      capacity_(options_.device_memory),
      used_(capacity_.size(), 0),
      peak_(capacity_.size(), 0),
      waiting_(capacity_.size(), 0) {}

ObjectStore::~ObjectStore() { Shutdown(); }

ObjectStore::Entry& ObjectStore::GetOrCreateLocked(const BufferKey& key) {
  auto [it, inserted] = entries_.try_emplace(key);
  if (inserted) {
    auto& shards = shards_[key.buffer_id];
    shards.push_back(key.shard);
    SignalKeyLocked(key, KeyEvent::kDeclared);
    released_.Forget(key.buffer_id);
  }
  return it->second;
}

void ObjectStore::MaybeRemoveLocked(
    const BufferKey& key, std::vector<std::shared_ptr<Storage>>* freed) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (!e.declared || !e.held || e.owned || e.readers > 0 ||
      e.state == Entry::State::kPending) {
    return;
  }
  const bool charged = e.charged > 0 && e.device >= 0;
  if (charged) used_[e.device] -= e.charged;
  if (freed != nullptr && (charged || e.data != nullptr)) {
    freed->push_back(std::move(e.data));  // FreeRemoved signals
  } else if (charged) {
    memory_freed_.SignalAll();
  }
  if (OnDevice(e)) device_memory_shards_--;
  entries_.erase(it);
  auto sit = shards_.find(key.buffer_id);
  if (sit != shards_.end()) {
    auto& v = sit->second;
    v.erase(std::remove(v.begin(), v.end(), key.shard), v.end());
    if (v.empty()) shards_.erase(sit);
  }
}

void ObjectStore::Declare(const BufferKey& key, int device,
                          const TensorSpec& spec, bool owned, Arrival arrival,
                          int64_t source_worker) {
  Completions done;
  {
    absl::MutexLock lock(&mu_);
    DeclareLocked(key, device, spec, owned, arrival, source_worker, done);
  }
  RunCompletions(std::move(done));
}

void ObjectStore::DeclareOutputs(absl::Span<const BufferKey> keys, int device,
                                 absl::Span<const TensorSpec> specs) {
  Completions done;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      DeclareLocked(keys[i], device, specs[i], /*owned=*/true,
                    Arrival::kComputed, /*source_worker=*/-1, done);
    }
  }
  RunCompletions(std::move(done));
}

void ObjectStore::DeclareLocked(const BufferKey& key, int device,
                                const TensorSpec& spec, bool owned,
                                Arrival arrival, int64_t source_worker,
                                Completions& done) {
  absl::Status mismatch;
  std::vector<ReadyCallback> callbacks;
  {
    Entry& e = GetOrCreateLocked(key);
    e.declared = true;
    e.owned = e.owned || owned;
    e.held = e.held || owned;
    if (e.device < 0) e.device = device;
    e.spec = spec;
    e.arrival = arrival;
    e.expected_bytes = spec.byte_size();
    // An entry made before its declaration (OnReady, Fail) was not new to
    // GetOrCreateLocked: its waiters for the declaration learn of it here.
    SignalKeyLocked(key, KeyEvent::kDeclared);
    if (source_worker >= 0) e.source_worker = source_worker;
    if (e.state == Entry::State::kReady && e.data &&
        static_cast<int64_t>(e.data->size()) != e.expected_bytes) {
      // Data that came before its declaration, in another size: nothing
      // may read it as this spec.
      mismatch = absl::InvalidArgumentError(absl::StrCat(
          KeyString(key), " is declared as ", spec.ToString(), " (",
          e.expected_bytes, " bytes) but ", e.data->size(), " bytes arrived"));
      if (e.charged > 0) {
        used_[e.device] -= e.charged;
        e.charged = 0;
        memory_freed_.SignalAll();
      }
      if (OnDevice(e)) device_memory_shards_--;
      e.data.reset();
      e.state = Entry::State::kPending;
      callbacks = FailLocked(key, e, mismatch);
    } else if (auto down = down_sources_.find(e.source_worker);
               arrival == Arrival::kFromPeer &&
               e.state == Entry::State::kPending &&
               down != down_sources_.end()) {
      // Expected from a worker already declared down (a collective's
      // partial declared when its task runs, after the PeerDown): nothing
      // will send it, so it fails now rather than waiting for good.
      mismatch = down->second;
      callbacks = FailLocked(key, e, mismatch);
    } else if (e.state == Entry::State::kReady && e.charged == 0 && e.data &&
               e.device >= 0 && e.data->size() > 0) {
      // Data that arrived before its declaration had no device to be
      // charged to; it is charged now.
      e.charged = static_cast<int64_t>(e.data->size());
      ChargeLocked(e.device, e.charged);
    }
    MaybeRemoveLocked(key);
  }
  if (!mismatch.ok() && !callbacks.empty()) {
    done.emplace_back(std::move(callbacks), mismatch);
  }
}

void ObjectStore::RunCompletions(Completions completions) {
  for (auto& [callbacks, result] : completions) {
    RunCallbacks(std::move(callbacks), result);
  }
}

absl::Status ObjectStore::AddReader(const BufferKey& key) {
  return AddReader(key, -1, nullptr);
}

absl::Status ObjectStore::AddReader(const BufferKey& key, int device,
                                    bool* awaits_another_device) {
  absl::MutexLock lock(&mu_);
  return AddReaderLocked(key, device, awaits_another_device);
}

absl::Status ObjectStore::AddReaders(absl::Span<const BufferKey> keys,
                                     int device, bool* awaits_another_device,
                                     int* pinned) {
  *pinned = 0;
  *awaits_another_device = false;
  absl::MutexLock lock(&mu_);
  for (const BufferKey& key : keys) {
    bool elsewhere = false;
    if (absl::Status s = AddReaderLocked(key, device, &elsewhere); !s.ok()) {
      return s;
    }
    ++*pinned;
    *awaits_another_device |= elsewhere;
  }
  return absl::OkStatus();
}

absl::Status ObjectStore::AddReaderLocked(const BufferKey& key, int device,
                                          bool* awaits_another_device) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (rejected_.contains(key.buffer_id)) {
      // Its readers fail with the rejection; nothing to keep alive.
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(
        KeyString(key),
        " is not on this worker: it was released before this call could "
        "read it, or never existed"));
  }
  Entry& e = it->second;
  e.readers++;
  e.held = true;
  if (awaits_another_device != nullptr) {
    *awaits_another_device =
        e.state == Entry::State::kPending &&
        (e.arrival == Arrival::kFromPeer ||
         (e.arrival == Arrival::kComputed && e.device != device));
  }
  return absl::OkStatus();
}

void ObjectStore::RemoveReader(const BufferKey& key) {
  RemoveReaders(absl::MakeConstSpan(&key, 1));
}

void ObjectStore::RemoveReaders(absl::Span<const BufferKey> keys) {
  std::vector<std::shared_ptr<Storage>> freed;
  {
    absl::MutexLock lock(&mu_);
    for (const BufferKey& key : keys) {
      auto it = entries_.find(key);
      if (it == entries_.end()) continue;
      if (it->second.readers > 0) it->second.readers--;
      MaybeRemoveLocked(key, &freed);
    }
  }
  FreeRemoved(freed);
}

void ObjectStore::FailBuffer(uint64_t buffer_id, const absl::Status& status) {
  ShardList shards;
  {
    absl::MutexLock lock(&mu_);
    rejected_[buffer_id] = status;
    SignalKeyWaitsLocked();
    auto it = shards_.find(buffer_id);
    if (it != shards_.end()) shards = it->second;
  }
  for (int32_t s : shards) Fail({buffer_id, s}, status);
}

std::vector<ObjectStore::ReadyCallback> ObjectStore::AbandonPutLocked(
    const BufferKey& key, Entry& e, const absl::Status& why) {
  // A put whose bytes have not begun to arrive will not arrive once its
  // owner let go: its readers (if any) hear why; bytes already being
  // received complete it as usual.
  if (!AwaitsPutBytes(e)) return {};
  return FailLocked(key, e, why);
}

bool ObjectStore::AwaitsPutBytes(const Entry& e) {
  return e.arrival == Arrival::kFromClient &&
         e.state == Entry::State::kPending && !e.receiving;
}

void ObjectStore::FailPending(const absl::Status& status) {
  std::vector<ReadyCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, e] : entries_) {
      for (auto& cb : FailLocked(key, e, status)) {
        callbacks.push_back(std::move(cb));
      }
    }
    SignalKeyWaitsLocked();
  }
  RunCallbacks(std::move(callbacks), status);
}

std::vector<ObjectStore::KeptShard> ObjectStore::KeepReady() {
  std::vector<KeptShard> kept;
  absl::MutexLock lock(&mu_);
  // The next server routes again, under the same ids, what it needs.
  released_.Clear();
  std::vector<BufferKey> drop;
  for (auto& [key, e] : entries_) {
    if (e.state == Entry::State::kReady &&
        ClientOfBuffer(key.buffer_id) != kServerClientId) {
      kept.push_back({key, e.device, e.charged});
      continue;
    }
    drop.push_back(key);
  }
  for (const BufferKey& key : drop) {
    Entry& e = entries_.at(key);
    if (e.state == Entry::State::kPending) continue;  // still being written
    // Forced out whatever holds it: nothing of the last server's will read
    // it again.
    e.declared = e.held = true;
    e.owned = false;
    e.readers = 0;
    MaybeRemoveLocked(key);
  }
  return kept;
}

void ObjectStore::DropAll() {
  absl::MutexLock lock(&mu_);
  released_.Clear();  // the next server's clients may be given these ids
  std::vector<BufferKey> drop;
  for (const auto& [key, e] : entries_) {
    if (e.state != Entry::State::kPending) drop.push_back(key);
  }
  for (const BufferKey& key : drop) {
    Entry& e = entries_.at(key);
    e.declared = e.held = true;
    e.owned = false;
    e.readers = 0;
    MaybeRemoveLocked(key);
  }
}

void ObjectStore::FreeRemoved(std::vector<std::shared_ptr<Storage>>& freed) {
  if (freed.empty()) return;
  freed.clear();
  absl::MutexLock lock(&mu_);
  memory_freed_.SignalAll();
}

void ObjectStore::Release(uint64_t buffer_id) {
  Release(absl::MakeConstSpan(&buffer_id, 1));
}

void ObjectStore::Release(absl::Span<const uint64_t> buffer_ids) {
  Completions done;
  std::vector<std::shared_ptr<Storage>> freed;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : buffer_ids) ReleaseLocked(id, done, freed);
  }
  FreeRemoved(freed);
  RunCompletions(std::move(done));
}

void ObjectStore::ReleaseLocked(uint64_t buffer_id, Completions& done,
                                std::vector<std::shared_ptr<Storage>>& freed) {
  {
    rejected_.erase(buffer_id);
    auto sit = shards_.find(buffer_id);
    if (sit == shards_.end()) return;
    released_.Add(buffer_id);
    const ShardList shards = sit->second;
    for (int32_t s : shards) {
      BufferKey key{buffer_id, s};
      auto it = entries_.find(key);
      if (it == entries_.end()) continue;
      it->second.owned = false;
      if (AwaitsPutBytes(it->second)) {
        const absl::Status why = absl::CancelledError(absl::StrCat(
            "buffer ", buffer_id, " was released before its put arrived"));
        std::vector<ReadyCallback> callbacks =
            AbandonPutLocked(key, it->second, why);
        if (!callbacks.empty()) done.emplace_back(std::move(callbacks), why);
      }
      MaybeRemoveLocked(key, &freed);
    }
  }
}

void ObjectStore::ReleaseClient(uint64_t client_id) {
  std::vector<ReadyCallback> callbacks;
  std::vector<std::shared_ptr<Storage>> freed;
  const absl::Status why = absl::CancelledError(
      absl::StrCat("client ", client_id, " left before its put arrived"));
  {
    absl::MutexLock lock(&mu_);
    departed_.insert(client_id);
    SignalKeyWaitsLocked();  // waits for its undeclared keys end now
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
      for (auto& cb : AbandonPutLocked(key, e, why)) {
        callbacks.push_back(std::move(cb));
      }
      MaybeRemoveLocked(key, &freed);
    }
  }
  FreeRemoved(freed);
  RunCallbacks(std::move(callbacks), why);
}

bool ObjectStore::HasLeft(uint64_t client_id) const {
  absl::MutexLock lock(&mu_);
  return departed_.contains(client_id);
}

absl::Status ObjectStore::Reserve(int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return ReserveLocked(device, bytes, /*wait=*/true);
}

absl::Status ObjectStore::ReserveLocked(int device, int64_t bytes, bool wait) {
  if (device < 0 || device >= num_devices()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no device ", device, " on this worker"));
  }
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reserve ", bytes, " bytes"));
  }
  if (bytes > capacity_[device]) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a shard of ", bytes, " bytes can never fit device ",
                     device, " (memory budget ", capacity_[device], " bytes)"));
  }
  if (wait && used_[device] + bytes > capacity_[device]) {
    // Counted while it waits: the device is full (Stats, and the server's
    // `plexus why`, say so).
    waiting_[device] += bytes;
    const absl::Time deadline =
        options_.clock->Now() + options_.reserve_timeout;
    bool timed_out = false;
    while (!shutdown_ && used_[device] + bytes > capacity_[device]) {
      if (options_.clock->AwaitWithDeadline(&mu_, &memory_freed_, deadline) &&
          used_[device] + bytes > capacity_[device]) {
        timed_out = true;
        break;
      }
    }
    waiting_[device] -= bytes;
    if (timed_out) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "waited ", absl::FormatDuration(options_.reserve_timeout), " for ",
          bytes, " bytes on device ", device, " (budget ", capacity_[device],
          ", in use ", used_[device], "): release futures you no longer need"));
    }
  }
  if (shutdown_) return absl::CancelledError("object store shut down");
  ChargeLocked(device, bytes);
  return absl::OkStatus();
}

void ObjectStore::SetTemporaryFloor(uint64_t floor) {
  absl::MutexLock lock(&mu_);
  temporary_floor_ = floor;
  // Waits for keys that are now an earlier server's end.
  SignalKeyWaitsLocked();
}

absl::Status ObjectStore::AdmitIncoming(const BufferKey& key, int64_t bytes,
                                        bool from_client) {
  std::vector<ReadyCallback> callbacks;
  absl::Status mismatch;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> found = AwaitDeclaredLocked(key);
    if (!found.ok()) return found.status();
    Entry& e = **found;
    const Arrival want =
        from_client ? Arrival::kFromClient : Arrival::kFromPeer;
    if (e.arrival != want) {
      return absl::PermissionDeniedError(absl::StrCat(
          KeyString(key), " does not take data from a ",
          from_client ? "client" : "peer worker",
          e.arrival == Arrival::kComputed ? " (it is computed on this worker)"
                                          : ""));
    }
    // The size first: a claim that differs from the declaration fails the
    // shard whatever else is under way, and always names both sizes.
    if (bytes != e.expected_bytes) {
      mismatch = absl::InvalidArgumentError(absl::StrCat(
          KeyString(key), " is declared as ", e.spec.ToString(), " (",
          e.expected_bytes, " bytes) but ", bytes, " bytes were sent"));
      callbacks = FailLocked(key, e, mismatch);
      MaybeRemoveLocked(key);
    } else if (e.state == Entry::State::kFailed) {
      return e.status;  // say why, e.g. another sender's size
    } else if (e.state != Entry::State::kPending || e.receiving) {
      return absl::AlreadyExistsError(
          absl::StrCat(KeyString(key), " already has its data"));
    } else {
      // A client waits for room; a peer's transfer is already scheduled.
      const int device = e.device;  // `e` may move while the wait runs
      absl::Status reserved = ReserveLocked(device, bytes, from_client);
      if (!reserved.ok()) return reserved;
      // The entry may have moved while the reservation waited.
      auto it = entries_.find(key);
      if (it == entries_.end() || it->second.state != Entry::State::kPending ||
          it->second.receiving) {
        used_[device] -= bytes;
        memory_freed_.SignalAll();
        return absl::AbortedError(
            absl::StrCat(KeyString(key),
                         " was completed or released while its data "
                         "waited for memory"));
      }
      it->second.receiving = true;
      it->second.charged = bytes;
      return absl::OkStatus();
    }
  }
  RunCallbacks(std::move(callbacks), mismatch);
  return mismatch;
}

void ObjectStore::AbandonIncoming(const BufferKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.receiving ||
      it->second.state != Entry::State::kPending) {
    return;
  }
  Entry& e = it->second;
  used_[e.device] -= e.charged;
  e.charged = 0;
  e.receiving = false;
  memory_freed_.SignalAll();
}

void ObjectStore::FulfilIncoming(const BufferKey& key,
                                 std::shared_ptr<Storage> data) {
  std::vector<ReadyCallback> callbacks;
  std::shared_ptr<const Storage> ready = data;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !it->second.receiving ||
        it->second.state != Entry::State::kPending) {
      return;  // failed meanwhile; Fail returned the reservation
    }
    Entry& e = it->second;
    e.receiving = false;
    e.state = Entry::State::kReady;
    e.data = std::move(data);
    if (OnDevice(e)) device_memory_shards_++;
    callbacks = CompleteLocked(key, e);
    MaybeRemoveLocked(key);
  }
  RunCallbacks(std::move(callbacks), ready);
}

absl::Status ObjectStore::Reserve(int device, int64_t bytes, int64_t* ahead) {
  if (ahead != nullptr && *ahead >= bytes && bytes >= 0) {
    *ahead -= bytes;
    return absl::OkStatus();
  }
  return Reserve(device, bytes);
}

bool ObjectStore::TryReserve(int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (device < 0 || device >= num_devices() || bytes < 0 || shutdown_ ||
      waiting_[device] > 0 || used_[device] + bytes > capacity_[device]) {
    return false;
  }
  ChargeLocked(device, bytes);
  return true;
}

void ObjectStore::Unreserve(int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_[device] -= bytes;
  memory_freed_.SignalAll();
}

absl::StatusOr<std::shared_ptr<Storage>> ObjectStore::Allocate(int device,
                                                               int64_t bytes,
                                                               int64_t* ahead) {
  absl::Status s = Reserve(device, bytes, ahead);
  if (!s.ok()) return s;
  auto storage = Storage::AllocateForWrite(bytes);
  if (!storage.ok()) Unreserve(device, bytes);
  return storage;
}

std::vector<ObjectStore::ReadyCallback> ObjectStore::CompleteLocked(
    const BufferKey& key, Entry& e) {
  if (e.ready) e.ready->SignalAll();
  SignalKeyLocked(key, KeyEvent::kComplete);  // reads that came before it
  std::vector<ReadyCallback> callbacks;
  callbacks.swap(e.callbacks);
  if (!key_waits_.empty()) {
    if (auto it = key_waits_.find(key); it != key_waits_.end()) {
      for (auto& [number, hook] : it->second->on_ready) {
        callbacks.push_back(std::move(hook));
      }
      it->second->on_ready.clear();
    }
  }
  return callbacks;
}

void ObjectStore::RunCallbacks(
    std::vector<ReadyCallback> callbacks,
    const absl::StatusOr<std::shared_ptr<const Storage>>& result) {
  for (auto& cb : callbacks) cb(result);
}

void ObjectStore::Fulfil(const BufferKey& key, std::shared_ptr<Storage> data,
                         int device, bool reserved) {
  Completions done;
  {
    absl::MutexLock lock(&mu_);
    FulfilLocked(key, std::move(data), device, reserved, done);
  }
  RunCompletions(std::move(done));
}

void ObjectStore::Fulfil(absl::Span<Output> outputs, int device) {
  Completions done;
  {
    absl::MutexLock lock(&mu_);
    for (Output& o : outputs) {
      FulfilLocked(o.key, std::move(o.data), device, o.reserved, done);
    }
  }
  RunCompletions(std::move(done));
}

void ObjectStore::FulfilLocked(const BufferKey& key,
                               std::shared_ptr<Storage> data, int device,
                               bool reserved, Completions& done) {
  std::shared_ptr<const Storage> ready = data;
  {
    Entry& e = GetOrCreateLocked(key);
    if (e.device < 0) e.device = device;
    int64_t bytes = static_cast<int64_t>(data->size());
    if (e.state != Entry::State::kPending || e.receiving) {
      // Late duplicate (e.g. the data raced a failure), or bytes already
      // being received for it: drop it.
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
    if (OnDevice(e)) device_memory_shards_++;
    std::vector<ReadyCallback> callbacks = CompleteLocked(key, e);
    if (!callbacks.empty()) done.emplace_back(std::move(callbacks), ready);
    MaybeRemoveLocked(key);
  }
}

bool ObjectStore::TakeForDonation(const BufferKey& key, const Storage* data,
                                  long caller_refs, const absl::Status& gone) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  if (e.state != Entry::State::kReady || e.data.get() != data || !OnDevice(e) ||
      e.readers != 1 || e.device < 0 || e.data.use_count() != 1 + caller_refs ||
      e.data->device_buffer_use_count() != 1) {
    return false;
  }
  device_memory_shards_--;
  e.data.reset();
  e.charged = 0;  // what was charged stays in used_: the reservation
  e.state = Entry::State::kFailed;
  e.status = gone.ok() ? absl::FailedPreconditionError(
                             absl::StrCat(KeyString(key), " was donated"))
                       : gone;
  return true;
}

std::vector<ObjectStore::ReadyCallback> ObjectStore::FailLocked(
    const BufferKey& key, Entry& e, const absl::Status& given) {
  if (e.state != Entry::State::kPending) return {};
  // A failure is never OK (a StatusOr cannot hold one, and readers would
  // take it for data): an OK reason reads as UNKNOWN, naming the shard.
  const absl::Status status =
      given.ok() ? absl::UnknownError(
                       absl::StrCat(KeyString(key), " failed without a reason"))
                 : given;
  if (e.receiving) {
    // Bytes admitted for data that will not arrive.
    used_[e.device] -= e.charged;
    e.charged = 0;
    e.receiving = false;
    memory_freed_.SignalAll();
  }
  e.state = Entry::State::kFailed;
  e.status = status;
  return CompleteLocked(key, e);
}

void ObjectStore::Fail(const BufferKey& key, const absl::Status& status) {
  std::vector<ReadyCallback> callbacks;
  absl::Status reason;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = GetOrCreateLocked(key);
    callbacks = FailLocked(key, e, status);
    reason = e.status;
    MaybeRemoveLocked(key);
  }
  if (!callbacks.empty()) RunCallbacks(std::move(callbacks), reason);
}

void ObjectStore::FailFromSource(int64_t worker_id,
                                 const absl::Status& status) {
  std::vector<BufferKey> keys;
  {
    absl::MutexLock lock(&mu_);
    // Later declarations of data from it fail too (Declare).
    down_sources_[worker_id] = status;
    for (auto& [key, e] : entries_) {
      if (e.state == Entry::State::kPending && e.source_worker == worker_id) {
        keys.push_back(key);
      }
    }
  }
  for (const BufferKey& key : keys) Fail(key, status);
}

bool ObjectStore::AllReady(absl::Span<const BufferKey> keys) const {
  absl::MutexLock lock(&mu_);
  for (const BufferKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.state == Entry::State::kPending) {
      return false;
    }
  }
  return true;
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
  return StatsLocked();
}

std::optional<ObjectStoreStats> ObjectStore::TryStats() const {
  if (!mu_.TryLock()) return std::nullopt;
  ObjectStoreStats stats = StatsLocked();
  mu_.Unlock();
  return stats;
}

ObjectStoreStats ObjectStore::StatsLocked() const {
  ObjectStoreStats stats;
  stats.live_shards = static_cast<int64_t>(entries_.size());
  stats.device_bytes = used_;
  stats.device_peak_bytes = peak_;
  stats.device_waiting_bytes = waiting_;
  for (int64_t b : used_) stats.live_bytes += b;
  stats.device_memory_shards = device_memory_shards_;
  return stats;
}

void ObjectStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  memory_freed_.SignalAll();
  SignalKeyWaitsLocked();
  for (auto& [key, e] : entries_) {
    if (e.ready) e.ready->SignalAll();
  }
}

}  // namespace plexus
