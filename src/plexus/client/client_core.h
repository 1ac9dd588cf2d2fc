// Internal: the state behind a Client, shared with its slices and futures
// (shared_ptr: futures may outlive the Client object, e.g. in Python; a
// release after Close is then a no-op).
//
// Threads: the session thread (SessionLoop: runs one session after another,
// reconnecting when one ends without Close; reconnect.h has the states),
// and per session the sender (drains queued ops into one message per
// write, and sends counters every second) and the reader (slice replies,
// call errors, workers that died).
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "plexus/client/client.h"
#include "plexus/common/ids.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

// One session as the futures made in it know it. The core keeps every
// one it made (a few), so a tag outlives what names it.
struct SessionTag : std::enable_shared_from_this<SessionTag> {
  explicit SessionTag(uint64_t e) : epoch(e) {}
  const uint64_t epoch;
  std::atomic<int64_t> live_futures{0};
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  explicit ClientCore(ClientOptions options);
  ~ClientCore();
  absl::Status Init(const std::string& address);
  void Close();

  // The server's address, as given to Init.
  const std::string& address() const { return address_; }
  // The current session's client id and credential (which the data plane
  // and the Trace RPC prove).
  transport::DataPlaneIdentity identity() const {
    absl::MutexLock lock(&mu_);
    return identity_;
  }
  // The current session's.
  uint64_t client_id() const {
    return client_id_.load(std::memory_order_acquire);
  }
  uint64_t NextId() { return ClientMadeId(client_id(), next_id_++); }
  // Graph ids (Call.graph_id): 1, 2, ... for this client's life.
  uint64_t NextGraphId() { return next_graph_id_++; }

  // The client's own timeline (timeline/timeline.h): one event per put,
  // fetch and wait it made and per call it issued, recorded on the calling
  // thread (no lock held across I/O). $PLEXUS_TIMELINE_EVENTS sizes it (0:
  // off); $PLEXUS_TEST_TIMELINE_SKEW_MS's "client" skews its clock.
  Timeline& timeline() { return timeline_; }

  // Call sites (proto::CallSite, for the timeline): the id of `text` (the
  // same every time; 0 past kMaxCallSites), and the op that registers
  // `site` with the server if the session of `epoch` has not had it yet
  // (the server forgets sites with the session).
  uint32_t CallSiteId(const std::string& text);
  bool CallSiteOp(uint32_t site, uint64_t epoch, proto::ClientOp* op);
  static constexpr size_t kMaxCallSites = 4096;
  // The current session's epoch (1 for the first, +1 per reconnect).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }

  // The open session, waiting for one while the client reconnects, at
  // most until `deadline`. FailedPrecondition once closed; UNAVAILABLE
  // once the client gave up, or when the deadline passes (saying how
  // long it waited for which server).
  absl::StatusOr<std::shared_ptr<SessionTag>> AwaitSession(absl::Time deadline);
  // OK while session `epoch` is open; else why what it made is gone:
  // FailedPrecondition once closed, LostWithSession (naming `buffer_id`)
  // once it ended.
  absl::Status SessionStatus(uint64_t epoch, uint64_t buffer_id = 0) const;
  absl::Status SessionStatusLocked(uint64_t epoch, uint64_t buffer_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Queues ops of session `epoch` for the sender; waits while too many
  // are queued. Dropped if that session ended: what they made reads as
  // lost with it.
  void Enqueue(std::vector<proto::ClientOp> ops, uint64_t epoch);
  void Flush();
  absl::StatusOr<proto::SliceInfo> RequestSlice(proto::SliceRequest req,
                                                uint64_t epoch);

  void ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id, uint64_t epoch);
  void ReleaseSlice(uint64_t slice_id, uint64_t epoch);
  // Slices and programs to ask for and register again after a reconnect.
  void Track(const std::shared_ptr<Slice>& slice);
  void Track(const std::shared_ptr<Program>& program);
  // The tracked slices that have ids `ids` in session `epoch`.
  std::vector<std::weak_ptr<Slice>> TrackedSlices(
      const std::vector<uint64_t>& ids, uint64_t epoch);
  std::vector<SessionEnd> SessionEnds() const;
  SessionState state() const;
  std::optional<RecoverySummary> LastRecovery() const;

  // Errors the server reported for buffers (rejected calls), and workers
  // known to be down.
  void MarkFailed(uint64_t buffer_id, const absl::Status& status);
  absl::Status BufferStatus(uint64_t buffer_id);
  void ForgetBuffer(uint64_t buffer_id);
  absl::Status WorkerStatus(int64_t worker_id);

  // --- recovery (the server's Recovery notes)
  // The id buffer `id` has now (itself unless recovery gave it a new one).
  uint64_t Resolve(uint64_t id) const {
    if (!has_aliases_.load(std::memory_order_acquire)) return id;
    return ResolveSlow(id);
  }
  // Why buffer `id` (as resolved) is lost, or OK.
  absl::Status LostStatus(uint64_t id) const;
  // Whether slice `slice_id` lost a host that no spare replaced.
  bool SliceBroken(uint64_t slice_id) const;
  // How many worker losses the server has told this client of.
  int64_t losses_heard() const;
  // Waits until more than `heard` losses were told, or `timeout` passes
  // (false), or the session ends (false).
  bool AwaitLoss(int64_t heard, absl::Duration timeout);
  // How long the server lets a slice that lost a host wait for another
  // before it breaks (its hello's spare_wait_ms): its word on a loss may
  // come that late.
  absl::Duration spare_wait() const {
    return absl::Milliseconds(spare_wait_ms_.load(std::memory_order_relaxed));
  }
  void AddSlice(Slice* slice);
  void RemoveSlice(Slice* slice);
  // Keeps the shards of put `id` (on slice `slice_id`) until the server
  // says the buffer is released for good, to put them again should the
  // host holding one be lost (Recovery.reput_ids).
  void KeepPut(uint64_t id, uint64_t slice_id,
               std::vector<std::shared_ptr<Storage>> shards);

  // FailedPrecondition once Close() has begun: a closed client does no
  // more work (puts, calls, fetches), and says so.
  absl::Status CheckOpen() const;

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
  bool SameMachine(const proto::SliceDevice& device) const;

  transport::DataPlaneCounters& data_counters() { return data_counters_; }
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> bytes_put{0};
  std::atomic<int64_t> bytes_fetched{0};
  std::atomic<int64_t> live_futures{0};
  std::atomic<int64_t> wait_round_trips{0};
  bool closed() const;
  const ClientOptions& options() const { return options_; }
  // Sequential dispatch: blocks until every input is computed (or failed).
  void AwaitInputs(const std::vector<Future>& inputs);

 private:
  absl::Mutex sites_mu_;
  std::vector<std::string> sites_ ABSL_GUARDED_BY(sites_mu_);  // id - 1
  absl::flat_hash_map<std::string, uint32_t> site_ids_
      ABSL_GUARDED_BY(sites_mu_);
  uint64_t sites_epoch_ ABSL_GUARDED_BY(sites_mu_) = 0;
  std::vector<bool> sites_sent_ ABSL_GUARDED_BY(sites_mu_);  // in that epoch

 private:
  // --- sessions (client_session.cc)
  struct Session;  // one session's channel and stream (below)
  // Connects and opens a session (hello, protocol and credential), by
  // `deadline`; Close() cancels it.
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(absl::Time deadline);
  // Makes `session` the current one: a new epoch, its client id and
  // credential, nothing of the last one's records.
  void Install(Session& session);
  // Runs `session`, then the next ones, until Close or the client gives up.
  void SessionLoop(std::unique_ptr<Session> session);
  // Opens the next session with back-off; null when closed or given up.
  std::unique_ptr<Session> Reconnect();
  // Asks for every live slice again and registers every live program
  // again in session `tag`; then the session is open for use.
  void Restore(const std::shared_ptr<SessionTag>& tag);
  void GiveUpLocked(std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the client does no work any more, once it gave up.
  absl::Status GaveUpStatusLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // --- the session's traffic (client_core.cc)
  void SenderLoop(Session& session);
  void ReaderLoop(Session& session);
  // --- recovery (recovering.cc)
  uint64_t ResolveSlow(uint64_t id) const;
  // Puts shards again for a recovery (its own thread: the reader must not
  // wait on a worker).
  void RePutLoop();
  void ApplyRecoveryLocked(const proto::Recovery& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions options_;
  std::string machine_id_;
  std::atomic<uint64_t> client_id_{0};
  // Never reset: ids stay unique across sessions, whatever client ids the
  // server hands out.
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> next_graph_id_{1};
  Timeline timeline_;

  std::thread session_thread_;
  std::thread sender_;  // of the current session; the session thread joins
  std::thread reader_;
  transport::DataPlaneCounters data_counters_;

  // closed_, readable without the lock (CheckOpen runs on every call).
  std::atomic<bool> closing_{false};
  std::string address_;  // the server's, as given to Init
  mutable absl::Mutex mu_;
  // The session's state (reconnect.h) and the current session, with its
  // client id and the credential the server issued, which every
  // data-plane connection proves (never sends).
  SessionMachine machine_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_{0};  // written under mu_
  std::shared_ptr<SessionTag> session_tag_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<SessionTag>> tags_ ABSL_GUARDED_BY(mu_);
  // session_tag_ while the session is open for use (kOpen, stream not
  // broken), else null: AwaitSession's path without the lock (every call
  // and put takes it). Written under mu_ (UpdateOpenTagLocked).
  std::atomic<SessionTag*> open_tag_{nullptr};
  void UpdateOpenTagLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  transport::DataPlaneIdentity identity_ ABSL_GUARDED_BY(mu_){};
  // The context of a session being opened, for Close to cancel.
  grpc::ClientContext* opening_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<SessionEnd> ends_ ABSL_GUARDED_BY(mu_);
  // Slices and programs made, in order (weak: the user owns them).
  absl::Mutex made_mu_;
  std::vector<std::weak_ptr<Slice>> slices_made_ ABSL_GUARDED_BY(made_mu_);
  std::vector<std::weak_ptr<Program>> programs_made_ ABSL_GUARDED_BY(made_mu_);
  std::vector<proto::ClientOp> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, proto::SliceReply> slice_replies_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, absl::Status> workers_down_ ABSL_GUARDED_BY(mu_);
  // Recovery: buffers under new ids (old -> newest), buffers lost, slices
  // broken, worker losses heard, and the slices to remap.
  std::atomic<bool> has_aliases_{false};
  absl::flat_hash_map<uint64_t, uint64_t> aliases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> broken_slices_
      ABSL_GUARDED_BY(mu_);
  int64_t losses_heard_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> spare_wait_ms_{0};
  absl::flat_hash_map<uint64_t, Slice*> slices_ ABSL_GUARDED_BY(mu_);
  std::optional<RecoverySummary> last_recovery_ ABSL_GUARDED_BY(mu_);
  struct KeptPut {
    uint64_t slice_id = 0;
    std::vector<std::shared_ptr<Storage>> shards;
  };
  absl::flat_hash_map<uint64_t, KeptPut> kept_puts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, int32_t>> reputs_ ABSL_GUARDED_BY(mu_);
  // Started by the reader on the session's first reput; the session
  // thread joins it when the session ends.
  std::thread reputter_;
  std::map<int64_t,
           std::vector<std::unique_ptr<transport::DataPlaneConnection>>>
      pool_ ABSL_GUARDED_BY(mu_);
  // Connections checked out now: the worker each talks to, and the other
  // workers whose loss also wakes it (Checkout's also_on).
  struct InUse {
    int64_t worker = 0;
    std::vector<int64_t> also_on;
    bool NeedsWorker(int64_t w) const {
      return worker == w ||
             std::find(also_on.begin(), also_on.end(), w) != also_on.end();
    }
  };
  absl::flat_hash_map<transport::DataPlaneConnection*, InUse> in_use_
      ABSL_GUARDED_BY(mu_);
};

// One session: the channel and the stream it lives on.
struct ClientCore::Session {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::Controller::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>>
      stream;
  uint64_t client_id = 0;
  transport::DataPlaneIdentity identity{};
};

// One sharded buffer as the client holds it, in the session that made it.
// The last Future copy destroys it, which releases the buffer on the
// workers (if that session is still open).
class BufferHandle {
 public:
  BufferHandle(std::shared_ptr<ClientCore> core, uint64_t id, ArgSpec arg,
               std::shared_ptr<Slice> slice,
               std::shared_ptr<SessionTag> session)
      : core_(std::move(core)),
        id_(id),
        arg_(std::move(arg)),
        slice_(std::move(slice)),
        session_(std::move(session)) {
    core_->live_futures++;
    session_->live_futures++;
  }
  ~BufferHandle() {
    core_->live_futures--;
    session_->live_futures--;
    core_->ForgetBuffer(id_);
    // A donated buffer was released by the call it was donated to.
    if (!donated()) core_->ReleaseBuffer(id_, slice_->id(), session_->epoch);
  }
  // Donation (a program's donated input): true the first time, and the
  // caller then releases the buffer after the call that consumes it.
  bool Donate() { return !donated_.exchange(true); }
  bool donated() const { return donated_.load(); }
  uint64_t id() const { return id_; }
  uint64_t epoch() const { return session_->epoch; }
  // The id the value has now: recovery may have recomputed it under
  // another (ClientCore::Resolve).
  uint64_t current_id() const { return core_->Resolve(id_); }
  const ArgSpec& arg() const { return arg_; }
  const std::shared_ptr<Slice>& slice() const { return slice_; }

 private:
  std::shared_ptr<ClientCore> core_;
  uint64_t id_;
  ArgSpec arg_;
  std::shared_ptr<Slice> slice_;
  std::shared_ptr<SessionTag> session_;
  std::atomic<bool> donated_{false};
};

}  // namespace plexus
