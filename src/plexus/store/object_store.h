// ObjectStore: the shards a worker holds for its devices, keyed by
// (buffer id, shard), with per-device memory budgets.
//
// Entry states:
//
//   (Declare / OnReady) --> pending --Fulfil / FulfilIncoming--> ready
//                             |   \--------------Fail-----------> failed
//                             \--AdmitIncoming--> pending, receiving
//                                                 (bytes charged)
//
// An entry is removed once (a) it was declared (by a call output, a put, an
// Expect), (b) it was held at least once (owned by a client, or read by a
// queued consumer), (c) its owner released it and no queued reader holds it
// any more, and (d) it is no longer pending. A temporary declared before
// its reader is queued is not dropped in between; a reader queued for an
// entry that is gone is refused (AddReader), never given a new one.
//
// Data from another process (a client's PUT, a peer's PUSH) is admitted
// only for a key that was declared to take it, and only in the declared
// size (AdmitIncoming); a key not declared yet is waited for, up to
// unknown_key_timeout.
//
// Every wait has a way out and says which: the shard's failure, its
// client's departure (ReleaseClient), the store's shutdown, or, where no
// event can end it (a key nobody declared, memory nobody frees), a deadline
// read from the injected Clock. A shard still being computed is waited for
// without a deadline: its producer fulfils or fails it.
//
// Thread-safe. Waits (AwaitReady, Reserve, AdmitIncoming) block on
// condition variables and never spin. A wait for a key not declared yet is
// woken by that key's declaration (or by an event that may end it), never
// by other keys': a client's fetch of a graph's last output, which arrives
// before the graph's calls do, sleeps through them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "plexus/common/clock.h"
#include "plexus/common/ids.h"
#include "plexus/common/types.h"
#include "plexus/store/remembered_ids.h"
#include "plexus/store/storage.h"

namespace plexus {

// The one shard key, and the id layout (ClientOfBuffer): common/ids.h.
using BufferKey = ShardKey;

struct ObjectStoreStats {
  int64_t live_shards = 0;
  int64_t live_bytes = 0;
  std::vector<int64_t> device_bytes;
  std::vector<int64_t> device_peak_bytes;  // high-water mark since start
  // Bytes of reservations waiting for room (Reserve): non-zero while the
  // device is full and something waits on it.
  std::vector<int64_t> device_waiting_bytes;
  int64_t device_memory_shards = 0;  // held in device memory
};

// A task's wait for one of its inputs (AwaitInput), while it blocks: the
// shard, the peer it comes from (-1: made on this worker, or not declared
// yet), and when the wait began (on the store's clock).
struct AwaitedInput {
  BufferKey key;
  int64_t source_worker = -1;
  absl::Time since;
};

class ObjectStore {
 public:
  struct Options {
    std::vector<int64_t> device_memory;  // budget in bytes, per device
    absl::Duration reserve_timeout = absl::Seconds(30);
    absl::Duration unknown_key_timeout = absl::Seconds(30);
    Clock* clock = Clock::Real();  // deadlines; not owned
  };
  // Where a declared shard's data comes from: computed on this worker, or
  // received over the data plane from a client (put) or a peer (transfer).
  // Only the last two admit incoming bytes, each from its own sender kind.
  enum class Arrival { kComputed, kFromClient, kFromPeer };
  using ReadyCallback =
      std::function<void(absl::StatusOr<std::shared_ptr<const Storage>>)>;

  explicit ObjectStore(Options options);
  ~ObjectStore();

  // For a worker that outlives its server and resumes with the next one
  // (WorkerImpl::Resume). FailPending fails every pending shard with
  // `status`: its waiters, its queued readers and its transfer callbacks
  // hear it at once. Once the devices have drained, KeepReady drops every
  // entry that is not ready (the next server routes again, under the same
  // ids, what it needs), and every transfer temporary (the server's ids:
  // the next server knows none), and returns the ready shards it keeps.
  void FailPending(const absl::Status& status);
  // The server this worker registered with makes its transfer temporaries
  // from count `floor` on (ServerToWorker.temp_floor). A temporary counted
  // before it (IsEarlierTemporary) was an earlier server's: a push or read
  // of one not declared here ends at once (FAILED_PRECONDITION), waits for
  // one included, instead of waiting unknown_key_timeout for a declaration
  // nobody will send (a push so waiting holds its peer's connection, and
  // every push behind it). 0: no floor.
  void SetTemporaryFloor(uint64_t floor);
  struct KeptShard {
    BufferKey key;
    int device = -1;
    int64_t bytes = 0;
  };
  std::vector<KeptShard> KeepReady();
  // The next server did not take the worker back: every entry that is not
  // pending goes (a fresh host; its clients' ids may be given again, so
  // none is marked as left).
  void DropAll();

  int num_devices() const { return static_cast<int>(capacity_.size()); }
  int64_t capacity(int device) const { return capacity_[device]; }

  // A shard this worker will hold. `owned`: the client holds a reference
  // until Release. `source_worker` >= 0: the data will come from that peer
  // (so PeerDown can fail it). Data that reached the entry before its
  // declaration (Fulfil) must have the spec's size, or the shard fails.
  void Declare(const BufferKey& key, int device, const TensorSpec& spec,
               bool owned, Arrival arrival = Arrival::kComputed,
               int64_t source_worker = -1);
  // A task's outputs: Declare(keys[i], device, specs[i], owned=true) for
  // each, under one lock (a call of a 100-leaf pytree declares 100).
  void DeclareOutputs(absl::Span<const BufferKey> keys, int device,
                      absl::Span<const TensorSpec> specs);
  // Queued consumers keep an entry alive until they are done. NotFound (and
  // nothing changes) if the shard is unknown here: released, or never
  // declared. A buffer whose call was rejected (FailBuffer) is known.
  absl::Status AddReader(const BufferKey& key);
  // The same for a task on `device`, which also learns whether the shard
  // may make it wait for another device's work (*awaits_another_device):
  // pending and coming from a peer (a transfer, sent once its producer
  // ran) or computed on another device. A pending put (its client sends
  // it) or a shard computed on `device` (by a task queued ahead) is not.
  absl::Status AddReader(const BufferKey& key, int device,
                         bool* awaits_another_device);
  // AddReader(key, device, ...) of each of `keys` in order, under one lock,
  // until one fails: *pinned says how many were added (the caller removes
  // those on failure), *awaits_another_device whether any may wait for
  // another device's work.
  absl::Status AddReaders(absl::Span<const BufferKey> keys, int device,
                          bool* awaits_another_device, int* pinned);
  void RemoveReader(const BufferKey& key);
  // RemoveReader of each, under one lock; what that frees is freed after.
  void RemoveReaders(absl::Span<const BufferKey> keys);
  // The client dropped its reference: every shard of the buffer. A put
  // whose bytes have not begun to arrive fails (they never will). Once
  // the entries are gone, a read of the buffer that comes later (a reader
  // that did not hear the value moved) fails at once, ABORTED
  // (ReleasedOnWorkerError), rather than waiting for a declaration, until
  // it is declared again or kReleasedRemembered releases later.
  void Release(uint64_t buffer_id);
  // The same for each of `buffer_ids` (a release op's), under one lock.
  void Release(absl::Span<const uint64_t> buffer_ids);
  // Everything `client_id` owned (it disconnected). Later waits for its
  // undeclared keys fail at once, saying the client left.
  void ReleaseClient(uint64_t client_id);
  // Whether ReleaseClient(client_id) was called: the worker then drops the
  // client's calls still queued on its devices instead of running them.
  bool HasLeft(uint64_t client_id) const;

  // Charges `bytes` to `device`, waiting while the budget is exhausted
  // (back-pressure). Fails at once if it can never fit, and after
  // reserve_timeout otherwise.
  absl::Status Reserve(int device, int64_t bytes);
  // Reserve, drawing first on `*ahead` (may be null): bytes the caller
  // reserved before (TryReserve) and has not used yet. Bytes it cannot
  // cover are reserved as Reserve does.
  absl::Status Reserve(int device, int64_t bytes, int64_t* ahead);
  // Charges `bytes` to `device` if they fit now and no Reserve waits for
  // room there (none is passed); false, charging nothing, otherwise.
  bool TryReserve(int device, int64_t bytes);
  void Unreserve(int device, int64_t bytes);
  // Reserve + Storage::Allocate (the reservation drawn on `ahead` first).
  absl::StatusOr<std::shared_ptr<Storage>> Allocate(int device, int64_t bytes,
                                                    int64_t* ahead = nullptr);

  // Admits `bytes` incoming bytes for `key` from a client (PUT) or a peer
  // (PUSH): waits until the key is declared (up to unknown_key_timeout),
  // checks that it takes data from that kind of sender, is still pending,
  // is not being received already, and that `bytes` is its declared size
  // (if not, the shard fails with a message naming both sizes), then charges
  // the bytes to its device: a client's wait for room (back-pressure, up to
  // reserve_timeout); a peer's are charged at once, as the scheduler
  // already placed the transfer. On success the bytes are reserved for
  // FulfilIncoming; a failure of the shard (Fail) returns them.
  absl::Status AdmitIncoming(const BufferKey& key, int64_t bytes,
                             bool from_client);
  // The admitted bytes arrived: the shard is ready.
  void FulfilIncoming(const BufferKey& key, std::shared_ptr<Storage> data);
  // The admitted bytes will come another way (a peer's CUDA IPC copy could
  // not be made here, and the peer sends them as a PUSH instead): the
  // shard is pending and not admitted again, its charge returned. Nothing
  // happens to a shard that is no longer being received.
  void AbandonIncoming(const BufferKey& key);

  // Attaches data; the reservation for data->size() on the entry's device
  // moves to the entry (`reserved`), or is taken now without waiting.
  void Fulfil(const BufferKey& key, std::shared_ptr<Storage> data,
              int device = -1, bool reserved = true);
  // A task's outputs, published together: Fulfil of each under one lock.
  struct Output {
    BufferKey key;
    std::shared_ptr<Storage> data;
    bool reserved = true;
  };
  void Fulfil(absl::Span<Output> outputs, int device);
  void Fail(const BufferKey& key, const absl::Status& status);
  // Every shard of `buffer_id`, present or still to be declared, fails with
  // `status` (its call was rejected before reaching this worker) until the
  // buffer is released.
  void FailBuffer(uint64_t buffer_id, const absl::Status& status);
  // Fails every pending shard expected from `worker_id`, and every one
  // declared later as coming from it (it is down: nothing will come).
  void FailFromSource(int64_t worker_id, const absl::Status& status);

  // Donation: hands a ready device-memory shard's memory to the program
  // that reads it (XLA writes its output there), if nothing else holds it:
  // the caller's pin is its only reader, and `data` (the entry's Storage,
  // held by the caller in `caller_refs` references) and its device buffer
  // are held nowhere else. The entry then holds no data and reads fail
  // with `gone`; its bytes stay charged to its device as a reservation,
  // which the output's Fulfil (reserved) takes over. False, and nothing
  // changes, if any of that does not hold.
  bool TakeForDonation(const BufferKey& key, const Storage* data,
                       long caller_refs, const absl::Status& gone);
  // Blocks until the shard is ready or failed. A key this store has never
  // seen is waited for (its declaration may still be in flight) until it
  // appears, its buffer is rejected, its client leaves, the store shuts
  // down, or unknown_key_timeout passes (NotFound, saying so).
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const BufferKey& key);
  // AwaitReady that, where it blocks, also has `on_ready` run by the thread
  // that readies or fails the shard, as soon as it does (after this
  // store's lock is released; this call may return before or after it),
  // so that a fetch can be answered from there without a thread woken
  // between. It may run more than once, and after this call returned for
  // another reason (the store shutting down, the unknown key's bound):
  // the hook decides for itself whether it is still wanted. An empty hook:
  // AwaitReady(key).
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const BufferKey& key, const ReadyCallback& on_ready);
  // AwaitReady(key, on_ready) without a thread blocked in it (a data-plane
  // connection that parks a FETCH and goes back to reading its socket).
  // Returns the result now where AwaitReady would not block: the shard is
  // ready or failed, or a wait for its unknown key must end at once. Else
  // nullopt, and the watch is kept until EndWatch or AwaitWatched: its
  // `on_ready` runs as AwaitReady's hook does, on the thread that readies
  // or fails the shard; `poke` is called whenever AwaitReady's wait would
  // wake to look again without a result (its buffer rejected, its client
  // gone, the store shutting down). `poke` runs under this store's lock:
  // it may only wake someone (an eventfd's write). `*watch` says which
  // watch this is, and until when an unknown key is waited for.
  struct Watch {
    uint64_t id = 0;
    absl::Time deadline = absl::InfiniteFuture();
  };
  std::optional<absl::StatusOr<std::shared_ptr<const Storage>>> WatchReady(
      const BufferKey& key, const ReadyCallback& on_ready,
      std::function<void()> poke, Watch* watch);
  // Ends a watch WatchReady kept: its `poke` is not called again; its
  // `on_ready`, if already handed out, may still run once (it decides for
  // itself whether it is still wanted).
  void EndWatch(const BufferKey& key, const Watch& watch);
  // EndWatch, then AwaitReady(key), an unknown key waited for only until
  // the watch's deadline.
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitWatched(
      const BufferKey& key, const Watch& watch);
  // AwaitReady for an input of a task: while it blocks, the wait is listed
  // by AwaitedInputs (a wait that does not block is never listed, and
  // costs nothing more than AwaitReady).
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitInput(
      const BufferKey& key);
  // The tasks' input waits under way (AwaitInput), the oldest first, at
  // most `max` of them into `out` (cleared); returns how many there are in
  // all. Takes a lock of its own, never the store's: the heartbeat reads
  // it, and allocates nothing while no task waits.
  int AwaitedInputs(int max, std::vector<AwaitedInput>* out) const;
  // Whether every one of `keys` is ready or failed now: an AwaitReady of
  // each would not wait.
  bool AllReady(absl::Span<const BufferKey> keys) const;
  // Runs `callback` once the shard is ready or failed: at once (on this
  // thread) if it already is, else on the thread that fulfils or fails it.
  void OnReady(const BufferKey& key, ReadyCallback callback);
  // The entry's spec and device, if declared.
  absl::StatusOr<std::pair<TensorSpec, int>> Describe(const BufferKey& key);

  ObjectStoreStats Stats() const;
  // Stats() if the store's lock is free at once, else nothing: for a
  // caller that must never wait on the store (the worker's heartbeat).
  std::optional<ObjectStoreStats> TryStats() const;
  // Wakes every waiter with an error; later waits fail at once.
  void Shutdown();

 private:
  ObjectStoreStats StatsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  struct Entry {
    enum class State { kPending, kReady, kFailed };
    State state = State::kPending;
    bool declared = false;
    bool owned = false;
    int device = -1;
    int64_t source_worker = -1;
    int64_t charged = 0;
    Arrival arrival = Arrival::kComputed;
    int64_t expected_bytes = -1;  // declared size of incoming data
    bool receiving = false;       // admitted (and charged), not arrived
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

  // One AwaitInput's wait, on its caller's stack, linked into the list
  // of waits (awaited_head_) while it blocks.
  struct InputWait {
    AwaitedInput input;
    bool listed = false;
    InputWait* prev = nullptr;
    InputWait* next = nullptr;
  };
  // AwaitReady's wait; lists `wait`, if given, while it blocks.
  // `on_ready`, if set: AwaitReady's hook.
  // An unknown key is waited for until `unknown_deadline` (InfinitePast:
  // unknown_key_timeout from now).
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReadyLocked(
      const BufferKey& key, InputWait* wait,
      const ReadyCallback* on_ready = nullptr,
      absl::Time unknown_deadline = absl::InfinitePast())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The result a read of `key` has now, if it would not block.
  std::optional<absl::StatusOr<std::shared_ptr<const Storage>>> ReadNowLocked(
      const BufferKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndWatchLocked(const BufferKey& key, const Watch& watch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the key's wait slot (made on first use), one waiter more.
  struct KeyWait;
  KeyWait* JoinKeyWaitLocked(const BufferKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One waiter less; the slot goes back to the free list at none.
  void LeaveKeyWaitLocked(const BufferKey& key, KeyWait* wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lists `wait` (at the tail: the newest), or updates its source.
  void ListWaitLocked(InputWait* wait, int64_t source_worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(awaited_mu_);
  void UnlistWait(InputWait* wait) ABSL_LOCKS_EXCLUDED(awaited_mu_);

  Entry& GetOrCreateLocked(const BufferKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `key` is declared; its entry, or why there is none.
  absl::StatusOr<Entry*> AwaitDeclaredLocked(const BufferKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a wait for `key`, which has no entry, must end now; OK to go on.
  // `read`: a read (fetch, wait, a task's input), which also ends for a
  // buffer released here; data on its way in (a put, a push) waits for
  // its declaration instead (a server restart releases a value and
  // declares it again under its id as the client's batch is sent again).
  absl::Status UnknownKeyEndLocked(const BufferKey& key, bool read) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a wait for a key that has no entry waits for: its entry to
  // appear or be declared (kDeclared), or, for a read that has nothing to
  // do with a pending entry, its value to be ready or failed (kComplete:
  // a FETCH that came before the call that makes its value then wakes
  // once, not at the declaration and again at the value).
  enum class KeyEvent { kDeclared, kComplete };
  // Waits for `until` on `key` until `deadline`; true when the deadline
  // passed. Ends early on an event that may end every such wait
  // (SignalKeyWaitsLocked), and a kComplete wait also when its entry
  // appears declared ready or failed; the caller looks again either way.
  // `on_ready`, if set, is kept with the key's wait while this wait
  // sleeps: its entry's completion hands it out (CompleteLocked).
  bool AwaitKeyLocked(const BufferKey& key, KeyEvent until, absl::Time deadline,
                      const ReadyCallback* on_ready = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the waits for `key` that `event` ends (a completion ends both
  // kinds).
  void SignalKeyLocked(const BufferKey& key, KeyEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes every wait for a key (a rejection, a departure, the shutdown).
  void SignalKeyWaitsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges `bytes` to `device`, waiting for room while `wait`.
  absl::Status ReserveLocked(int device, int64_t bytes, bool wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails a put still waiting for its bytes (its owner let go of it).
  std::vector<ReadyCallback> AbandonPutLocked(const BufferKey& key, Entry& e,
                                              const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether AbandonPutLocked would fail `e`: a put whose bytes have not
  // begun to arrive.
  static bool AwaitsPutBytes(const Entry& e);
  // Callbacks to run once mu_ is let go, each group with its result.
  using Completions =
      std::vector<std::pair<std::vector<ReadyCallback>,
                            absl::StatusOr<std::shared_ptr<const Storage>>>>;
  static void RunCompletions(Completions completions);
  // The bodies of Declare, AddReader, Release and Fulfil, under mu_; what
  // they complete goes to `done`, what they free to `freed`.
  void DeclareLocked(const BufferKey& key, int device, const TensorSpec& spec,
                     bool owned, Arrival arrival, int64_t source_worker,
                     Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddReaderLocked(const BufferKey& key, int device,
                               bool* awaits_another_device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(uint64_t buffer_id, Completions& done,
                     std::vector<std::shared_ptr<Storage>>& freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FulfilLocked(const BufferKey& key, std::shared_ptr<Storage> data,
                    int device, bool reserved, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails a pending entry; returns the callbacks to run unlocked.
  std::vector<ReadyCallback> FailLocked(const BufferKey& key, Entry& e,
                                        const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry if nothing keeps it. With `freed`, its storage is
  // moved there (an entry that held memory or bytes adds one, maybe null)
  // for the caller to free once mu_ is let go, and to signal
  // memory_freed_ after: freeing a device buffer calls into its runtime
  // (PJRT_Buffer_Destroy), which the device thread's uses of the store
  // would otherwise wait behind, a value at a time (a release of the last
  // call's 100 outputs held the lock through 100 of them).
  void MaybeRemoveLocked(const BufferKey& key,
                         std::vector<std::shared_ptr<Storage>>* freed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what MaybeRemoveLocked moved to `freed`, then wakes the waits for
  // memory. Called without mu_.
  void FreeRemoved(std::vector<std::shared_ptr<Storage>>& freed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the entry to a final state; returns the callbacks to run unlocked
  // (its own, and the hooks of waits that began before it existed).
  std::vector<ReadyCallback> CompleteLocked(const BufferKey& key, Entry& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunCallbacks(
      std::vector<ReadyCallback> callbacks,
      const absl::StatusOr<std::shared_ptr<const Storage>>& result);

  const Options options_;
  const std::vector<int64_t> capacity_;

  mutable absl::Mutex mu_;
  absl::CondVar memory_freed_;  // a device's used bytes went down
  // The waits for keys not declared yet, one condition variable per key
  // waited on. A KeyWait is never freed, only reused (free_key_waits_): a
  // FakeClock may still signal it after its wait ended.
  struct KeyWait {
    absl::CondVar cv;
    int waiters = 0;
    int for_declaration = 0;  // those of them waiting for kDeclared
    // AwaitReady's hooks of the waits for the value sleeping here, by a
    // number of the wait's: handed out at the key's completion, else taken
    // back by their wait as it wakes.
    std::vector<std::pair<uint64_t, ReadyCallback>> on_ready;
    // WatchReady's pokes, by the watch's number (its waiters are counted
    // in `waiters` too).
    std::vector<std::pair<uint64_t, std::function<void()>>> pokes;
  };
  uint64_t next_hook_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<BufferKey, KeyWait*> key_waits_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<KeyWait>> all_key_waits_ ABSL_GUARDED_BY(mu_);
  std::vector<KeyWait*> free_key_waits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BufferKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Shards per buffer id, for Release.
  // (Inline: a worker holds one or two shards of most buffers, and each
  // call's outputs add a buffer.)
  using ShardList = absl::InlinedVector<int32_t, 2>;
  absl::flat_hash_map<uint64_t, ShardList> shards_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> used_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> peak_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> waiting_ ABSL_GUARDED_BY(mu_);  // Reserve waiting
  void ChargeLocked(int device, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    used_[device] += bytes;
    if (used_[device] > peak_[device]) peak_[device] = used_[device];
  }
  // Buffers whose calls were rejected: their shards fail on sight.
  absl::flat_hash_map<uint64_t, absl::Status> rejected_ ABSL_GUARDED_BY(mu_);
  // Clients that left: nothing of theirs will be declared any more.
  absl::flat_hash_set<uint64_t> departed_ ABSL_GUARDED_BY(mu_);
  uint64_t temporary_floor_ ABSL_GUARDED_BY(mu_) = 0;  // SetTemporaryFloor
  // Buffers released here whose entries are gone, the last
  // kReleasedRemembered of them: a read of one ends at once
  // (ReleasedOnWorkerError) instead of waiting for a declaration. A
  // declaration takes the id back out.
  static constexpr size_t kReleasedRemembered = 65536;
  RememberedIds released_ ABSL_GUARDED_BY(mu_){kReleasedRemembered};
  // Workers declared down (FailFromSource), and why.
  absl::flat_hash_map<int64_t, absl::Status> down_sources_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Entries whose data is in device memory (Stats, read every heartbeat:
  // counted as data comes and goes, not by a walk of every entry).
  static bool OnDevice(const Entry& e) {
    return e.data && e.data->kind() == MemoryKind::kDevice;
  }
  int64_t device_memory_shards_ ABSL_GUARDED_BY(mu_) = 0;

  // The input waits under way, oldest first (a doubly linked list of
  // InputWait on their waiters' stacks). Taken after mu_, or alone.
  mutable absl::Mutex awaited_mu_ ABSL_ACQUIRED_AFTER(mu_);
  InputWait* awaited_head_ ABSL_GUARDED_BY(awaited_mu_) = nullptr;
  InputWait* awaited_tail_ ABSL_GUARDED_BY(awaited_mu_) = nullptr;
  int awaited_count_ ABSL_GUARDED_BY(awaited_mu_) = 0;
};

}  // namespace plexus
