// Internal: a client's data path, the data half of a Client (the control
// half is ClientSession, client_session.h). Bulk bytes go straight to and
// from the workers over the data plane (transport/data_plane.h), never
// through the server. It owns:
//   - the data-plane connections: a pool per worker, and the connections
//     in use, which it wakes (shuts down) when their worker is reported
//     down, the session ends or the client closes, so no request waits on
//     a worker that will not answer;
//   - the shards of puts, kept until the server releases them, to put a
//     shard again when the server asks after a lost host (its own thread);
//   - the byte and round-trip counters.
// It depends on the session explicitly: it hears the session's events as
// its SessionObserver, and asks the session (never holding its own lock)
// for the state of sessions, buffers and losses its errors report.
//
// Thread-safe. Lock order: ClientSession's lock, then mu_ (the session
// calls the observer methods with its lock held); the data path never
// takes the session's lock while holding mu_.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "plexus/client/client.h"
#include "plexus/client/client_session.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

class DataPath : public SessionObserver {
 public:
  // `options` and `session` outlive the data path (the session is only
  // used once a session is installed).
  DataPath(const ClientOptions& options, ClientSession& session);
  ~DataPath() override;
  DataPath(const DataPath&) = delete;
  DataPath& operator=(const DataPath&) = delete;

  // --- puts (data_io.cc)
  // The shards of the row-major global array `data` for each device of
  // the slice's map `map` (`local`: one shard's spec). Replicas share one
  // Storage; on this machine it is a memfd the workers map.
  absl::StatusOr<std::vector<std::shared_ptr<Storage>>> CutShards(
      const proto::SliceInfo& map, const void* data, const ArgSpec& arg,
      const TensorSpec& local) const;
  // Keeps the shards of put `id` (on slice `slice_id`) until the server
  // says the buffer is released for good, to put them again should the
  // host holding one be lost (Recovery.reput_ids).
  void KeepPut(uint64_t id, uint64_t slice_id,
               std::vector<std::shared_ptr<Storage>> shards);
  // Sends the shards (of spec `local`) of put `id` (of session `epoch`) to
  // their devices; a shard whose host is lost goes to the device that took
  // its place. `progress`, if not null, counts the bytes as they go.
  // `resizes`: the slice's resizes() the shards were cut at.
  absl::Status SendShards(const Slice& slice, uint64_t id, const ArgSpec& arg,
                          const TensorSpec& local,
                          const std::vector<std::shared_ptr<Storage>>& shards,
                          uint64_t resizes, uint64_t epoch,
                          TransferProgress* progress);

  // --- reads (data_io.cc): one attempt each (Client's recovering.cc runs
  // them again after a lost host).
  absl::Status Fetch(const Future& future, void* dst,
                     TransferProgress* progress);
  absl::Status Wait(const Future& future);
  absl::Status WaitMany(const std::vector<Future>& futures,
                        absl::Time deadline);
  // Sequential dispatch: blocks until every input is computed (or failed).
  void AwaitInputs(const std::vector<Future>& inputs);

  // --- relayed answers (relay.cc; transport/relay_links.h)
  // Which output shards of a relayed call its workers answer on the links
  // (Call.relay, Call.relay_first_shard): those a fetch reads (PlanFetch).
  enum class Relay { kNone, kEveryShard, kFirstShard };
  // Whether a call on a slice of map `slice` with outputs `outputs` and
  // their ids `ids`, made right after the client waited on a result, goes
  // with Call.relay: relays are on (ClientOptions::relay_answers), each
  // output's shard is small (transport::kRelayedValueBytes at most), a
  // fetch of every output reads all its shards (kEveryShard) or, of every
  // output, one replica (kFirstShard: a replicated value's device 0), and
  // a relay link is open to each worker holding a shard so read. If so,
  // `ids` are remembered as relayed: a fetch or wait of one of those
  // shards reads its answer on the link instead of asking the worker.
  Relay RelayCall(const proto::SliceInfo& slice,
                  absl::Span<const ArgSpec> outputs,
                  absl::Span<const uint64_t> ids);
  // Relay links opened, and the fetches and waits their answers served
  // (ClientCounters).
  std::atomic<int64_t> relay_links_opened{0};
  std::atomic<int64_t> answers_relayed{0};

  // --- connections (data_path.cc)
  // A data-plane connection, for session `epoch`, to the worker holding
  // `device`, in use until it is handed back (Checkin: kept for reuse;
  // Discard: closed). While in use it is woken (shut down) when the server
  // reports its worker down, the session ends or the client closes, so no
  // fetch waits on a worker that will not answer. `also_on`: other workers
  // whose loss ends the request too (a wait on many workers' shards ends
  // when any of them is lost).
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> Checkout(
      const proto::SliceDevice& device, uint64_t epoch,
      absl::Span<const int64_t> also_on = {});
  void Checkin(int64_t worker_id,
               std::unique_ptr<transport::DataPlaneConnection> conn,
               uint64_t epoch);
  void Discard(std::unique_ptr<transport::DataPlaneConnection> conn);
  // Runs `fn` with a pooled connection (of session `epoch`) to the worker
  // of `device`; a failure against a worker the server reported down says
  // so, and one of a session that ended says what was lost with it
  // (`buffer`).
  absl::Status WithConnection(
      const proto::SliceDevice& device, uint64_t epoch, uint64_t buffer,
      const std::function<absl::Status(transport::DataPlaneConnection&)>& fn);
  bool SameMachine(const proto::SliceDevice& device) const;
  // Why worker `worker_id` is down (the server's word), or OK.
  absl::Status WorkerStatus(int64_t worker_id);
  // Drops the pool and the kept puts (the client closed).
  void Clear();

  transport::DataPlaneCounters& data_counters() { return data_counters_; }
  std::atomic<int64_t> bytes_put{0};
  std::atomic<int64_t> bytes_fetched{0};
  std::atomic<int64_t> wait_round_trips{0};

  // --- SessionObserver (data_path.cc)
  void SessionInstalled(uint64_t epoch,
                        const transport::DataPlaneIdentity& id) override;
  void StreamBroke() override;
  void SessionEnded() override;
  void WorkerDown(int64_t worker, const absl::Status& why) override;
  void PutsReleased(const absl::flat_hash_set<uint64_t>& ids) override;
  void RePut(uint64_t id, int32_t shard) override;
  void SessionDone() override;
  void SessionResumed(uint64_t epoch,
                      const transport::DataPlaneIdentity& id) override;

 private:
  // Whether `future` may be read: valid, of a session that still holds it,
  // and not failed (the error of the first that does not hold).
  absl::Status Readable(const Future& future) const;

  // Whether connections of session `epoch` may be made and pooled.
  bool UsableLocked(uint64_t epoch) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return usable_ && epoch_ == epoch;
  }
  // Why session `epoch`'s request cannot go on (its end, or the close),
  // as the session words it.
  absl::Status SessionGone(uint64_t epoch) const;
  // The relayed answer of `key` from `worker`'s link: its value or its
  // error; nullopt where there is none to wait for (the call was not
  // relayed, another thread reads the link, the worker skipped it, the
  // link ended, or no answer came within kRelayWait): fetch it then.
  // `keep`: a value read stays with the link for the next reader (a
  // wait's, which a fetch follows). `deadline`: the caller's own
  // (WaitMany's); where it passes first, nullopt with `*timed_out` set,
  // the link kept for the answer still due.
  std::optional<absl::StatusOr<std::shared_ptr<Storage>>> AwaitRelayed(
      int64_t worker, const ShardKey& key, bool keep,
      absl::Time deadline = absl::InfiniteFuture(), bool* timed_out = nullptr);
  // Whether `key` is a relayed call's output shard whose answer comes on
  // a link (a fetch or wait reads it there: AwaitRelayed).
  bool IsRelayed(const ShardKey& key) const;
  // A fetch read (or gave up on) buffer `id`: no later read waits for its
  // relayed answers.
  void ForgetRelayed(uint64_t id);
  // After a fetch or wait answered by `device`'s worker: opens a relay
  // link to it, where relays are on and it has none (once per worker and
  // session; a worker that refuses or is slow to answer is not asked
  // again in this session).
  void MaybeLink(const proto::SliceDevice& device, uint64_t epoch);
  bool IsRelayedLocked(const ShardKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct RelayLink;
  // Shuts down and forgets the links (of `worker` only, if not -1).
  void DropLinksLocked(int64_t worker = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `link` if it is still `worker`'s (it ended).
  void DropLink(int64_t worker, const std::shared_ptr<RelayLink>& link);

  // Puts shards again for a recovery (its own thread: the session's reader
  // must not wait on a worker).
  void RePutLoop(uint64_t epoch);
  // One shard of SendShards, sent again (at most twice) if its host is
  // lost and the slice remapped meanwhile. FailedPrecondition if the
  // slice was resized since the shards were cut (its map has other
  // devices: the put is refused by the server too).
  absl::Status SendShard(const Slice& slice, uint64_t id, int j,
                         const Storage& shard, int64_t bytes, uint64_t resizes,
                         uint64_t epoch, TransferProgress* progress);

  const ClientOptions& options_;
  ClientSession& session_;
  const std::string machine_id_;
  transport::DataPlaneCounters data_counters_;

  mutable absl::Mutex mu_;
  // The session whose connections may be used (SessionInstalled), and
  // whether they still may (false once its stream broke or it ended).
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool usable_ ABSL_GUARDED_BY(mu_) = false;
  transport::DataPlaneIdentity identity_ ABSL_GUARDED_BY(mu_){};
  // Workers the server declared down in this session, and why.
  absl::flat_hash_map<int64_t, absl::Status> workers_down_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t,
           std::vector<std::unique_ptr<transport::DataPlaneConnection>>>
      pool_ ABSL_GUARDED_BY(mu_);
  // Connections checked out now: the worker each talks to, and the other
  // workers whose loss also wakes it (Checkout's also_on).
  struct InUse {
    int64_t worker = 0;
    std::vector<int64_t> also_on;
    // Shut down to wake its user (SessionEnded, WorkerDown): never pooled
    // again, even if its request had ended first and it looks healthy.
    bool shut = false;
    bool NeedsWorker(int64_t w) const;
  };
  absl::flat_hash_map<transport::DataPlaneConnection*, InUse> in_use_
      ABSL_GUARDED_BY(mu_);
  struct KeptPut {
    uint64_t slice_id = 0;
    std::vector<std::shared_ptr<Storage>> shards;
  };
  absl::flat_hash_map<uint64_t, KeptPut> kept_puts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, int32_t>> reputs_ ABSL_GUARDED_BY(mu_);
  // Started on the session's first reput; joined when the session is done.
  std::thread reputter_;
  // The relay links of this session, by worker; the workers that would not
  // take one; the outputs of relayed calls not read yet (oldest first, at
  // most kRelayedIds), each with whether only its shard 0 is relayed.
  absl::flat_hash_map<int64_t, std::shared_ptr<RelayLink>> links_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> unlinked_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> relayed_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> relayed_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
