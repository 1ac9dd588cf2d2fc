// Internal: a client's session with its server, the control half of a
// Client (the data half is DataPath, data_path.h). It owns the connection
// to the server and everything that lives as long as one session:
//   - opening a session (hello, protocol version, tenant credential) and,
//     when one ends without Close, reconnecting with back-off and restoring
//     the client's slices and programs in the next (reconnect.h has the
//     states: SessionMachine);
//   - the ops queued for the server, sent in batches on the session's one
//     stream (never one RPC per op), with the counters every second;
//   - what the server says on that stream: slice grants, call errors,
//     workers that died, recoveries of lost hosts, puts released;
//   - ids: client-made buffer, call and program ids, and graph ids.
// What the data path must know of it (a session installed or ended, a
// worker down, a put to make again) it hears through SessionObserver.
//
// Threads: the session thread (SessionLoop: runs one session after
// another), and per session the sender (drains queued ops into one message
// per write, and sends counters every second) and the reader (the server's
// messages). Every public method is thread-safe; the blocking ones wait
// without holding the lock the I/O threads need.
//
// Lock order: mu_, then the observer's lock (the observer is called with
// mu_ held and never calls back); made_mu_ is taken alone. Slice::maps_mu_
// comes after mu_ (the reader remaps slices under mu_).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "plexus/client/client.h"
#include "plexus/client/kept_batches.h"
#include "plexus/client/reconnect.h"
#include "plexus/common/clock.h"
#include "plexus/common/ids.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

// One session as the futures made in it know it. The session keeps every
// one it made (a few), so a tag outlives what names it.
struct SessionTag : std::enable_shared_from_this<SessionTag> {
  explicit SessionTag(uint64_t e) : epoch(e) {}
  const uint64_t epoch;
  std::atomic<int64_t> live_futures{0};
};

// What the data path hears of the session. ClientSession calls each of
// these with its lock held (lock order: the session's lock, then the
// observer's), except SessionDone; none may call back into the session or
// block on I/O.
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  // Session `epoch` is the current one; its data-plane connections prove
  // `identity`. Nothing of an earlier session is used again.
  virtual void SessionInstalled(uint64_t epoch,
                                const transport::DataPlaneIdentity& id) = 0;
  // The current session's stream broke (a write failed): no connection is
  // made or pooled for it any more.
  virtual void StreamBroke() = 0;
  // The current session ended (its reader saw the stream end) or the
  // client closed: as StreamBroke, and every connection in use is woken.
  virtual void SessionEnded() = 0;
  // The server declared `worker` down: its connections are woken and none
  // is made to it again in this session.
  virtual void WorkerDown(int64_t worker, const absl::Status& why) = 0;
  // The server will never ask for these puts again (released for good).
  virtual void PutsReleased(const absl::flat_hash_set<uint64_t>& ids) = 0;
  // The server asks for shard `shard` of put `id` again (a recovery).
  virtual void RePut(uint64_t id, int32_t shard) = 0;
  // Called on the session thread, without the lock, once a session's
  // sender and reader have stopped: whatever the observer runs for that
  // session stops too.
  virtual void SessionDone() = 0;
  // The session of `epoch`, which ended with its server, was resumed by
  // the next (ServerToClient.resumed): usable again, with what it kept.
  virtual void SessionResumed(uint64_t epoch,
                              const transport::DataPlaneIdentity& id) = 0;
};

class ClientSession {
 public:
  // What the sender reports every second (proto::ClientStats).
  using StatsFn = std::function<void(proto::ClientStats*)>;
  // `options` and `observer` outlive the session.
  ClientSession(const ClientOptions& options, SessionObserver* observer,
                StatsFn stats);
  ~ClientSession();  // Close()
  ClientSession(const ClientSession&) = delete;
  ClientSession& operator=(const ClientSession&) = delete;

  // Opens the first session with the server at `address` (by 10 s on the
  // client's clock) and starts the session thread.
  absl::Status Open(const std::string& address);
  // Flushes what is queued, ends the session and joins its threads. Every
  // later use fails with FailedPrecondition.
  void Close();
  bool closed() const;
  // FailedPrecondition once Close() has begun: a closed client does no
  // more work (puts, calls, fetches), and says so. Lock-free.
  absl::Status CheckOpen() const;

  // The server's address, as given to Open.
  const std::string& address() const { return address_; }
  // The current session's client id and credential (which the data plane
  // and the Trace RPC prove).
  transport::DataPlaneIdentity identity() const {
    absl::MutexLock lock(&mu_);
    return identity_;
  }
  uint64_t client_id() const {
    return client_id_.load(std::memory_order_acquire);
  }
  // The current session's epoch (1 for the first, +1 per reconnect that
  // did not resume the session).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // The first of `count` new client-made ids (buffers, calls, programs),
  // the others following it, unique across sessions; RESOURCE_EXHAUSTED,
  // and none made, once this client's count of them would pass the id
  // layout's limit (CheckIdsLeft, common/ids.h): past it they would be
  // the server's or another client's.
  absl::StatusOr<uint64_t> NextIds(uint64_t count = 1) {
    uint64_t first = next_id_.load(std::memory_order_relaxed);
    do {
      if (absl::Status s = CheckIdsLeft(
              "this client's ids (of its buffers, calls and programs)", first,
              count);
          !s.ok()) {
        return s;
      }
    } while (!next_id_.compare_exchange_weak(first, first + count,
                                             std::memory_order_relaxed));
    return ClientMadeId(client_id(), first);
  }
  // The count the next id takes (tests start it near the limit).
  void set_next_id_for_test(uint64_t n) { next_id_.store(n); }
  // Graph ids (Call.graph_id): 1, 2, ... for this client's life.
  uint64_t NextGraphId() { return next_graph_id_++; }

  // The open session, waiting for one while the client reconnects, at
  // most until `deadline`. FailedPrecondition once closed; UNAVAILABLE
  // once the client gave up, or when the deadline passes (saying how
  // long it waited for which server).
  absl::StatusOr<std::shared_ptr<SessionTag>> AwaitSession(absl::Time deadline);
  // The same, waiting at most reconnect_timeout (a put, call or program).
  absl::StatusOr<std::shared_ptr<SessionTag>> AwaitSessionForUse() {
    return AwaitSession(options_.clock->Now() + options_.reconnect_timeout);
  }
  // OK while session `epoch` is open; else why what it made is gone:
  // FailedPrecondition once closed, LostWithSession (naming `buffer_id`)
  // once it ended. A session that ended with a server that keeps a journal
  // may be resumed by the next: then this waits for the reconnect's
  // outcome (resumed: OK).
  absl::Status SessionStatus(uint64_t epoch, uint64_t buffer_id = 0) const;
  // Sessions resumed so far (a read that failed as its server went away
  // goes again after one).
  int64_t resumes() const { return resumes_.load(std::memory_order_acquire); }

  // --- what a resume tells the next server (the server keeps a journal:
  // ServerToClient.journaled)
  // A buffer of the open session is live (BufferHandle); ForgetBuffer
  // ends that. `issued`: the op that makes it is queued (a put's is, by
  // then). A call's outputs are live before their op is queued (a graph
  // queues its calls at its end): a resume tells the next server only of
  // those whose op it sends again, or has (Enqueue marks them); the
  // others are routed as new ops after it. Told of one whose op came only
  // after the resume, the server took it for lost (no op sent again made
  // it: a graph open across a server kill lost its outputs).
  void NoteLive(uint64_t buffer_id, uint64_t slice_id, const ArgSpec& arg,
                bool issued = true);
  // The calls and puts kept to send again, at most this many (the oldest
  // go first).
  static constexpr size_t kMaxKeptCalls = 1 << 16;

  // --- ops for the server
  // Queues ops of session `epoch` for the sender; waits while too many
  // are queued. Where the client waited on a result since its last ops
  // and nothing is being written (and no resume is under way), writes them
  // itself (ClientOptions::send_inline_after_wait). Dropped if that session
  // ended: what they made reads as lost with it; unless the server keeps a
  // journal and the session may be resumed: then its calls, puts and programs
  // are kept to send again.
  void Enqueue(std::vector<proto::ClientOp> ops, uint64_t epoch);
  // The client waited on a result (a fetch, a wait): its next ops are
  // likely a round trip's, which the caller writes itself.
  void NoteWaited() { waited_.store(true, std::memory_order_relaxed); }
  // The client waited on a result since its last ops were queued: the
  // cluster may have nothing to run (a graph then sends its first calls
  // early).
  bool waited() const { return waited_.load(std::memory_order_relaxed); }
  // Waits until everything queued has been written (or the session ended).
  // A buffer's release queued alone waits ClientOptions::release_linger
  // for an op to go with; Flush sends it at once.
  void Flush();
  // Messages written to the server so far (ClientCounters::messages_sent).
  int64_t messages_sent() const {
    return messages_sent_.load(std::memory_order_relaxed);
  }
  int64_t messages_sent_inline() const {
    return messages_sent_inline_.load(std::memory_order_relaxed);
  }
  int64_t messages_sent_as_frames() const {
    return messages_sent_as_frames_.load(std::memory_order_relaxed);
  }
  // Asks for a slice in session `epoch` and waits for the server's answer.
  absl::StatusOr<proto::SliceInfo> RequestSlice(proto::SliceRequest req,
                                                uint64_t epoch);
  // Asks the server to resize a slice (ClusterState::ResizeSlice) and waits
  // for its answer: the reply (the new map, what moved) once the new ids
  // of the slice's values are applied (they come in the same message), or
  // the refusal.
  absl::StatusOr<proto::SliceReply> ResizeSlice(proto::SliceResize req,
                                                uint64_t epoch);
  // Never block (destructors call them); dropped once `epoch` ended.
  void ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id, uint64_t epoch);
  void ReleaseSlice(uint64_t slice_id, uint64_t epoch);

  // --- what a reconnect restores
  // Slices and programs to ask for and register again after a reconnect
  // (weak: the user owns them).
  void Track(const std::shared_ptr<Slice>& slice);
  void Track(const std::shared_ptr<Program>& program);
  // The tracked slices that have ids `ids` in session `epoch`.
  std::vector<std::weak_ptr<Slice>> TrackedSlices(
      const std::vector<uint64_t>& ids, uint64_t epoch);
  std::vector<SessionEnd> SessionEnds() const;
  SessionState state() const;

  // --- what the server said of buffers, slices and hosts
  // Errors the server reported for buffers (rejected calls).
  void MarkFailed(uint64_t buffer_id, const absl::Status& status);
  absl::Status BufferStatus(uint64_t buffer_id);
  void ForgetBuffer(uint64_t buffer_id);
  // The id buffer `id` has now (itself unless recovery gave it a new one).
  uint64_t Resolve(uint64_t id) const {
    if (!has_aliases_.load(std::memory_order_acquire)) return id;
    return ResolveSlow(id);
  }
  // The id buffer `id` has now and the map of `slice` it is on, read
  // together: a resize changes both (Slice::Remap, then the aliases) under
  // the session's lock, and a read of one before and the other after it
  // asked a host of one map for an id of the other (a fetch then waited
  // for a declaration that would never come there).
  std::pair<uint64_t, const proto::SliceInfo*> ResolveOn(
      uint64_t id, const Slice& slice) const;
  // Why buffer `id` (as resolved) is lost, or OK.
  absl::Status LostStatus(uint64_t id) const;
  // Whether slice `slice_id` lost a host that no spare replaced.
  bool SliceBroken(uint64_t slice_id) const;
  // How many worker losses the server has told this client of.
  int64_t losses_heard() const;
  // Waits until more than `heard` losses were told, or `timeout` passes on
  // the client's clock (false), or `deadline` does (false; a wait's
  // timeout), or the session ends (false).
  bool AwaitLoss(int64_t heard, absl::Duration timeout,
                 absl::Time deadline = absl::InfiniteFuture());
  // How many notes of values that moved, were made again or lost
  // (proto::Recovery: a resize's, a resume's, a recovery's) it applied.
  int64_t notes_heard() const;
  // Waits until more than `heard` such notes were applied, as AwaitLoss.
  bool AwaitNote(int64_t heard, absl::Duration timeout,
                 absl::Time deadline = absl::InfiniteFuture());
  // A worker said its server went away (IsServerWentAway) while this
  // client's session may still look whole: waits until the session's
  // stream broke or ended, or more than `resumes` sessions were resumed,
  // or the client closed (true), or `timeout` or `deadline` passes on the
  // client's clock (false).
  bool AwaitServerGone(int64_t resumes, absl::Duration timeout,
                       absl::Time deadline = absl::InfiniteFuture());
  // How long the client waits for a server (ClientOptions).
  absl::Duration reconnect_timeout() const {
    return options_.reconnect_timeout;
  }
  // The client's clock now (a wait's deadline is on it).
  absl::Time Now() const { return options_.clock->Now(); }
  // How long the server lets a slice that lost a host wait for another
  // before it breaks (its hello's spare_wait_ms): its word on a loss may
  // come that late.
  absl::Duration spare_wait() const {
    return absl::Milliseconds(spare_wait_ms_.load(std::memory_order_relaxed));
  }
  std::optional<RecoverySummary> LastRecovery() const;
  // The live slices by their current ids, which the server's remaps and
  // losses name.
  void AddSlice(Slice* slice);
  void RemoveSlice(Slice* slice);
  // Device `shard` of live slice `slice_id` in its current map (where a
  // put's shard goes again), if the slice is live and has that device.
  std::optional<proto::SliceDevice> SliceDevice(uint64_t slice_id,
                                                int32_t shard) const;

 private:
  // Sends `op` (a slice request or resize, its request id set by
  // `set_request_id`) and waits for its SliceReply; a refusal is its error.
  // `answer` ("granted the slice") words what a session that ended first
  // did not do.
  absl::StatusOr<proto::SliceReply> AskForSlice(
      proto::ClientOp op, uint64_t epoch, absl::string_view answer,
      absl::FunctionRef<void(proto::ClientOp&, uint64_t)> set_request_id);
  struct Session;  // one session's channel and stream (below)

  // --- opening and reconnecting (client_session.cc)
  // Connects and opens a session (hello, protocol and credential), by
  // `deadline`; Close() cancels it.
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(absl::Time deadline);
  // Sends the hello on `session`'s new stream and reads the server's
  // first answer (client id, credential); Finish says why it refused.
  // Where the answer names the server's ops listener, moves the session's
  // ops there (MoveOpsToFrames).
  absl::Status Handshake(Session& session);
  // Connects to the server's ops listener named in `first` (proving the
  // session's credential), then writes the stream's last message
  // (ClientToServer.ops_on_frames): every later write is an OPS frame
  // there. Where it cannot connect (within kOpsConnectTimeout), logs why
  // and leaves the ops on the stream; an error only where the stream
  // broke.
  absl::Status MoveOpsToFrames(Session& session,
                               const proto::ServerToClient& first);
  static constexpr absl::Duration kOpsConnectTimeout = absl::Seconds(2);
  // One message of the session to the server: an OPS frame once its ops
  // moved, else on the stream. False once it could not be written (a
  // frame's failure cancels the stream, so that its reader sees the end).
  bool WriteToServer(Session& session, const proto::ClientToServer& msg);
  // Makes `session` the current one: a new epoch, its client id and
  // credential, nothing of the last one's records.
  void Install(Session& session);
  // Runs `session`, then the next ones, until Close or the client gives up.
  void SessionLoop(std::unique_ptr<Session> session);
  // A resumed session's restore (session_restore.cc): tells the server
  // every live buffer, sends the kept calls again (ClientToServer.resent),
  // then opens the session for use.
  void ResumeRestore(const std::shared_ptr<SessionTag>& tag);
  // Keeps the calls, puts and programs of `msg`, whose ops left queue_ as
  // number `seq` (NextKeepSeqLocked), in kept_calls_ and kept_programs_.
  void KeepCalls(proto::ClientToServer&& msg, uint64_t seq);
  uint64_t NextKeepSeqLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return next_keep_seq_++;
  }
  // The stream broke: ops still queued are dropped, those a resume needs
  // kept first.
  void KeepUnsentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the next session with back-off; null when closed or given up.
  std::unique_ptr<Session> Reconnect();
  void GiveUpLocked(std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why the client does no work any more, once it gave up.
  absl::Status GaveUpStatusLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status SessionStatusLocked(uint64_t epoch, uint64_t buffer_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void UpdateOpenTagLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether session `epoch` can no longer be used (closed, broken, ended).
  // A resumed session between its install and ResumeRestore's snapshot of
  // what it holds and what it sent: Enqueue waits (an op queued then, its
  // future listed as held but the op not among those sent again, had its
  // output declared lost by the server at the resume's end).
  bool restoring_ ABSL_GUARDED_BY(mu_) = false;
  bool GoneLocked(uint64_t epoch) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return closed_ || machine_.broken() || epoch_.load() != epoch;
  }
  bool Gone(uint64_t epoch) const {
    absl::MutexLock lock(&mu_);
    return GoneLocked(epoch);
  }

  // --- restoring after a reconnect (session_restore.cc)
  // What a restore made again and lost, for the SessionEnd it closes.
  struct Restored {
    int slices_restored = 0, slices_lost = 0;
    int programs_restored = 0, programs_lost = 0;
  };
  // The slices and programs made that are still alive, in order.
  void LiveTracked(std::vector<std::shared_ptr<Slice>>* slices,
                   std::vector<std::shared_ptr<Program>>* programs);
  // Asks for every live slice again and registers every live program
  // again in session `tag`; then the session is open for use.
  void Restore(const std::shared_ptr<SessionTag>& tag);
  // Asks for `slice` again in session `epoch` (with back-off while the
  // server refuses, within the slice's own timeout). False when the
  // session ended meanwhile (the next one tries again).
  bool RestoreSlice(Slice& slice, uint64_t epoch, Restored& counts);
  // The op that registers `program` again in session `epoch` on its
  // slice's new map (`before`: the slice's map in the last session), or
  // nothing when it cannot be (the program is marked lost).
  std::optional<proto::ClientOp> RestoreProgram(
      Program& program, uint64_t epoch,
      const absl::flat_hash_map<const Slice*, proto::SliceInfo>& before,
      Restored& counts);

  // --- the session's traffic (session_traffic.cc)
  void SenderLoop(Session& session);
  void ReaderLoop(Session& session);
  // Takes what is queued into `msg` for one write, and `sending_`; its
  // place among the kept batches in `keep_seq` (0: none).
  void TakeQueuedLocked(proto::ClientToServer& msg, uint64_t& keep_seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `msg` (mu_ not held, `sending_` taken; unless `write` is
  // false) and keeps it to send again after a resume; whether it was
  // written.
  bool WriteTaken(Session& session, proto::ClientToServer& msg,
                  uint64_t keep_seq, bool write);
  // After a write: `sending_` given back; a failed write broke the stream.
  void WroteLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One message from the server, applied (mu_ held).
  void ApplyLocked(const proto::ServerToClient& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reader saw `session`'s stream end: records the end and reconnects
  // or gives up.
  void EndedLocked(const Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- the server's recovery notes (session_recovery.cc)
  uint64_t ResolveSlow(uint64_t id) const;
  void ApplyRecoveryLocked(const proto::Recovery& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A note's old ids now naming its new ones (a recovery's or a resize's).
  void ApplyAliasesLocked(const proto::Recovery& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerDownLocked(const proto::WorkerDown& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions& options_;
  SessionObserver* const observer_;
  const StatsFn stats_;
  std::atomic<uint64_t> client_id_{0};
  // Never reset: ids stay unique across sessions, whatever client ids the
  // server hands out.
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> next_graph_id_{1};

  std::thread session_thread_;
  std::thread sender_;  // of the current session; the session thread joins
  std::thread reader_;

  // closed_, readable without the lock (CheckOpen runs on every call).
  std::atomic<bool> closing_{false};
  std::string address_;  // the server's, as given to Open
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
  transport::DataPlaneIdentity identity_ ABSL_GUARDED_BY(mu_){};
  // The context of a session being opened, for Close to cancel.
  grpc::ClientContext* opening_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<SessionEnd> ends_ ABSL_GUARDED_BY(mu_);
  // Slices and programs made, in order (weak: the user owns them).
  absl::Mutex made_mu_;
  std::vector<std::weak_ptr<Slice>> slices_made_ ABSL_GUARDED_BY(made_mu_);
  std::vector<std::weak_ptr<Program>> programs_made_ ABSL_GUARDED_BY(made_mu_);
  std::vector<proto::ClientOp> queue_ ABSL_GUARDED_BY(mu_);
  // queue_ holds an op other than a buffer's release: the sender goes at
  // once. Releases alone linger (kReleaseLinger) for an op to ride with.
  bool urgent_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> messages_sent_{0};
  std::atomic<int64_t> messages_sent_inline_{0};
  std::atomic<int64_t> messages_sent_as_frames_{0};
  int flushing_ ABSL_GUARDED_BY(mu_) = 0;  // Flush() callers waiting
  // A write is under way (the sender's or an inline one: one at a time).
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  // The stream Enqueue may write to itself: the sender's, while its loop
  // runs (null before it starts and from when it decides to end).
  Session* writable_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The client waited on a result since the last Enqueue (NoteWaited;
  // send_inline_after_wait).
  std::atomic<bool> waited_{false};
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, proto::SliceReply> slice_replies_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  // Recovery: buffers under new ids (old -> newest), buffers lost, slices
  // broken, worker losses heard, and the slices to remap.
  std::atomic<bool> has_aliases_{false};
  absl::flat_hash_map<uint64_t, uint64_t> aliases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> broken_slices_
      ABSL_GUARDED_BY(mu_);
  int64_t losses_heard_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t notes_heard_ ABSL_GUARDED_BY(mu_) = 0;
  // AwaitLoss and AwaitNote: until `*count` (one of the two above) passes
  // `heard`, the timeout or deadline passes, or the session ends.
  bool AwaitCount(int64_t ClientSession::*count, int64_t heard,
                  absl::Duration timeout, absl::Time deadline);
  std::atomic<int64_t> spare_wait_ms_{0};
  absl::flat_hash_map<uint64_t, Slice*> slices_ ABSL_GUARDED_BY(mu_);
  std::optional<RecoverySummary> last_recovery_ ABSL_GUARDED_BY(mu_);
  // Resume (the server keeps a journal): whether it does; the ended
  // session a reconnect asks to resume (its epoch, 0: none, its client id
  // and credential); whether the last session installed was a resume; the
  // messages the sender writes before any queued op (ResumeRestore).
  std::atomic<bool> journaled_{false};
  uint64_t resume_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resume_client_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::string resume_credential_ ABSL_GUARDED_BY(mu_);
  bool last_resumed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::ClientToServer> pre_messages_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> resumes_{0};
  // Live buffers and the calls sent, kept for a resume (a leaf lock).
  struct LiveBuffer {
    uint64_t slice_id = 0;
    ArgSpec arg;
    bool issued = true;  // its op queued (NoteLive)
  };
  // The call outputs among `ops` are issued (NoteLive): called as they
  // are queued or kept, under mu_.
  void MarkIssuedLocked(const std::vector<proto::ClientOp>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Mutex kept_mu_;
  absl::flat_hash_map<uint64_t, LiveBuffer> live_ ABSL_GUARDED_BY(kept_mu_);
  // Calls and puts, as sent; and every program registration (a call sent
  // again may name a program whose registration the last server never
  // read), by program id.
  KeptBatches kept_calls_ ABSL_GUARDED_BY(kept_mu_){kMaxKeptCalls};
  // The next batch's number as it leaves queue_ (KeptBatches orders by it).
  uint64_t next_keep_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, proto::ClientOp> kept_programs_ ABSL_GUARDED_BY(kept_mu_);
};

// One session: the channel and the stream it lives on.
struct ClientSession::Session {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<proto::Controller::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>>
      stream;
  uint64_t client_id = 0;
  transport::DataPlaneIdentity identity{};
  bool resumed = false;  // the server resumed the session asked for
  // The connection to the server's ops listener once the session's ops
  // moved there (MoveOpsToFrames), else null. Written by the one writer
  // of the moment (the sender, or an inline write: `sending_`); closed by
  // the sender before it half-closes the stream, so that the server reads
  // the last frames before the stream's end.
  std::unique_ptr<transport::DataPlaneConnection> ops;
  transport::DataPlaneCounters ops_counters;
};

}  // namespace plexus
