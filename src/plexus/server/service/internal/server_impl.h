// Internal: the Server implementation, also the gRPC Controller service.
// See server.h. Its methods are defined by theme: server.cc (construction,
// Init, Wait, Shutdown), server_workers.cc (worker sessions and liveness),
// server_clients.cc (client sessions, admission, slice answers) and
// server_status.cc (GetStatus, the Shutdown RPC). The helpers a session
// calls per message or per batch are inline, below the class.
//
// Thread-safe: every session runs on its own gRPC thread; the locks, in the
// order they are taken, are mu_, admission_mu_, heard_mu_ (see the fields).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "plexus/journal/journal.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/model_journal.h"
#include "plexus/server/scheduling/admission.h"
#include "plexus/server/scheduling/gang_scheduler.h"
#include "plexus/server/scheduling/out_queue.h"
#include "plexus/server/server.h"
#include "plexus/server/service/internal/batch_arena.h"
#include "plexus/server/service/internal/client_ops_listener.h"
#include "plexus/server/service/internal/worker_channel.h"
#include "plexus/server/standby/journal_feed.h"
#include "plexus/server/standby/peer_watch.h"
#include "plexus/timeline/clock_offset.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/frame_poller.h"
#include "plexus/web/web_server.h"

namespace plexus {

class ServerImpl final : public Server, public proto::Controller::Service {
  // A worker's stream writes ServerToWorker messages as the bytes its
  // writer encodes (scheduling/worker_wire.h; UseWireWriterForWorkers).
  using WorkerStream =
      grpc::ServerReaderWriter<grpc::ByteBuffer, proto::WorkerToServer>;
  using ClientStream =
      grpc::ServerReaderWriter<proto::ServerToClient, proto::ClientToServer>;

 public:
  ServerImpl(const ServerOptions& options, ClusterSecret secret);
  ~ServerImpl() override;

  absl::Status Init();

  std::string address() const override { return address_; }
  std::string advertised_address() const override { return advertised_; }
  std::string web_address() const override { return web_advertised_; }
  const ClusterSecret& secret() const override { return secret_; }

  void Wait() override;
  void Shutdown() override;
  bool stepped_down() const override { return stepped_down_.load(); }

  // When a worker was last heard from (heard_, below).
  struct LastHeard {
    absl::Time at;
    // Its readers handling a message now (its stream's, and its reports'
    // on the ops connection).
    int handling = 0;
  };

  void CheckLiveness() override;

  // Worker `id` was heard from at `now` (by default, the time read under
  // heard_mu_: a check never reads the stamps between the two): registered,
  // or its reader read a message, which it handles now.
  void HeardFrom(int64_t id, absl::Time now = absl::InfinitePast());
  // Its reader handled the message: silence counts from when it was read
  // (no clock read here).
  void Handled(int64_t id);
  // Silent for the deadline less one check period: declared down by this
  // check or the next, so within the deadline of its last message (and of
  // a hang, which came after it). Not while its reader handles a message:
  // what the server has not read yet is not the worker's silence.
  bool SilentLocked(const LastHeard& heard, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heard_mu_);
  bool Silent(int64_t id);

  // ------------------------------------------------------------ workers
  // Registration, then each message the worker sends, then its end.
  grpc::Status ServeWorker(grpc::ServerContext* ctx, WorkerStream* stream);
  // Makes ServeWorker the handler of the Controller's WorkerSession
  // method, in place of the generated one whose stream writes
  // proto::ServerToWorker: the same method, the same bytes on the wire.
  // Called by Init, before the service is registered.
  absl::Status UseWireWriterForWorkers();
  // The first message's protocol version and worker credential: OK, or
  // the refusal the session answers with (and logs).
  grpc::Status CheckRegistration(grpc::ServerContext* ctx,
                                 const proto::WorkerToServer& first) const;
  // Records the worker, opens its queue (the hello, its peers, the loads a
  // standby needs) and answers what waited for it; `*id` its id.
  // CANCELLED once the server is shutting down.
  // `*channel`: how its messages reach it (WorkerChannel).
  grpc::Status RegisterWorker(grpc::ServerContext* ctx, WorkerStream* stream,
                              const proto::WorkerToServer& first,
                              const std::string& rejoined, int64_t* id,
                              std::shared_ptr<WorkerChannel>* channel);
  // Opens the ops connection to the worker's data plane (proving the
  // server credential; the unix socket where the worker shares this
  // machine) and moves its messages there (WorkerChannel::MoveToDataPlane).
  // Where it cannot, logs why and leaves them on the stream. Gives up
  // within half the heartbeat deadline (its reads wait meanwhile).
  void MoveOpsToDataPlane(grpc::ServerContext* ctx, int64_t id,
                          const proto::RegisterWorker& reg,
                          WorkerChannel& channel);
  // How long a session's end waits for the reports still on their way
  // before it shuts the ops connection (ServeWorker).
  static constexpr absl::Duration kReportsDrain = absl::Milliseconds(100);
  // The worker's messages on its ops connection (REPORTS frames: its
  // calls done, heartbeats, timeline chunks and transfer failures once its
  // ops moved there), each applied as its stream's are (OnWorkerMessage),
  // by the reports poller, until the connection ends (`ended` notified);
  // an end the server did not cause cancels the session. False where they
  // cannot be polled (the session is cancelled then, or the channel shut
  // down already).
  bool PollReports(grpc::ServerContext* ctx, int64_t id,
                   const std::shared_ptr<WorkerChannel>& channel,
                   absl::Notification* ended);
  // One message of worker `id` (`bytes` in wire form), from its stream or
  // a REPORTS frame: the worker heard from, then its heartbeat, timeline
  // chunk, transfer failure or calls done applied.
  void OnWorkerMessage(int64_t id, proto::WorkerToServer& msg, size_t bytes);
  // A heartbeat: its stats into the worker's record, its clock probe.
  void OnHeartbeat(int64_t id, const proto::WorkerToServer& msg);
  // Calls done and copies arrived: into admission at once; into the
  // records now if the state lock is free, else by whoever holds it.
  void OnCallsDone(int64_t id, const proto::CallsDone& done);
  // The session ended: the worker is down, its stamps, timeline estimate,
  // queue and context go. `cut`: the stream did not end by the worker's
  // close (its call was cancelled: the connection dropped); the reason
  // says which, and how long before the worker was last heard from.
  void EndWorkerSession(int64_t id, WorkerChannel* channel, bool cut);

  // ------------------------------------------------------------ clients
  // The hello, then each batch the client sends, then its end.
  grpc::Status ClientSession(grpc::ServerContext* ctx,
                             ClientStream* stream) override;
  // The first message's protocol version, client name and tenant
  // credential (cleared from `msg`): OK with `*tenant` set, or the refusal
  // the session answers with (and logs).
  grpc::Status CheckClientHello(grpc::ServerContext* ctx,
                                proto::ClientToServer& msg,
                                std::string* tenant) const;
  // Records the client, opens its queue and sends the hello (its id and
  // credential); `*id` and `*out` its id and queue. RESOURCE_EXHAUSTED
  // when no client id is left.
  // Where the server has an ops listener, the hello names it and
  // `*ops_generation` is the session's (else 0).
  grpc::Status OpenClient(grpc::ServerContext* ctx, ClientStream* stream,
                          const proto::ClientToServer& msg,
                          const std::string& tenant, uint64_t* id,
                          OutQueue<proto::ServerToClient>** out,
                          uint64_t* ops_generation);
  // Reads and handles the session's batches until its stream ends; from
  // its message ops_on_frames on, the stream carries nothing but its end
  // and the batches come as frames (ClientOpsListener, session
  // `ops_generation`).
  void ReadClientBatches(grpc::ServerContext* ctx, ClientStream* stream,
                         uint64_t id, OutQueue<proto::ServerToClient>* out,
                         uint64_t ops_generation);
  // How long a session's end waits for the frames still on their way
  // (ClientOpsListener::Close).
  static constexpr absl::Duration kClientFramesDrain = absl::Seconds(1);
  // The session ended: the client's records, queued work, slices and
  // queue go; the workers and the waiting slice requests hear of it.
  void EndClientSession(uint64_t id);

  // The tenant a session's first message proves (common/credentials.h: a
  // tenant credential over its name, compared in constant time), or
  // "default" for an anonymous session where anonymous_clients_ allows it.
  // PermissionDenied saying what to set otherwise.
  absl::StatusOr<std::string> AuthenticateTenant(
      const proto::ClientToServer& first) const;

  // Routes one batch (under the state lock) and hands its units to
  // admission; replies (slices, errors, re-puts) go on `out`.
  void HandleClientBatch(grpc::ServerContext* ctx, uint64_t id,
                         const proto::ClientToServer& msg,
                         OutQueue<proto::ServerToClient>* out);
  // A batch as HandleClientBatch routes it.
  struct RoutedBatch {
    std::vector<WorkerOps> units;  // one per op (consecutive releases: one)
    std::vector<uint64_t> seqs;    // each unit's call record, if a call
    // Each unit's Executes in wire form, if a call.
    std::vector<std::shared_ptr<CallExecutes>> executes;
    proto::ServerToClient reply;   // for the client, if anything
    bool released_slice = false;   // room under max_devices for waiters
    bool granted_slice = false;    // lower priorities may yield to it
    bool released_values = false;  // a refused resize may go now
    bool clock_read = false;       // once per batch, at its first call
    bool resent = false;           // sent again after a resume (ClusterState::
                                   // RouteResentCall)
  };
  // One op of a batch, into `batch->units.back()` and its reply.
  void RouteClientOpLocked(uint64_t id, const proto::ClientOp& op,
                           RoutedBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // slice.resize: the model's ResizeSlice, its reply and note into the
  // batch's reply, its moves and releases as units after the current one.
  void ResizeSliceLocked(uint64_t id, const proto::SliceResize& req,
                         RoutedBatch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The routed units into the client's queue at admission; those that
  // need no order (declares, loads, failures) straight to the workers.
  void EnqueueBatchLocked(uint64_t id, RoutedBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, admission_mu_);

  // Whether `ops` (not a call's) must keep the client's order at
  // admission: releases and snapshots' copies follow the calls before them.
  static bool Ordered(const WorkerOps& ops);

  // Back-pressure on one client: its stream is not read while it has a
  // full quota of calls waiting at the server (others go on). Ends when
  // its calls are admitted, or it leaves, or the server shuts down.
  void WaitForRoomInQueue(grpc::ServerContext* ctx, uint64_t id);

  // What completions let go: releases as ops for each worker, and those
  // of values on slices over several hosts gathered by slice, each sent
  // as one op encoded once and shared by its hosts (ReleasedUnit).
  struct Released {
    WorkerOps ops;
    SharedReleases shared;
    bool empty() const {
      if (!ops.empty()) return false;
      for (const auto& [slice, release] : shared) {
        if (!release.ids.empty()) return false;
      }
      return true;
    }
  };
  // The unit that sends `released`.
  static GangUnit ReleasedUnit(Released released);
  // Calls done and snapshot copies arrived (CallsDone) into the records;
  // the releases held back for them, which go to the workers now, are
  // added to `released`. Those reported while a client's batch is
  // routed wait for its end (`batch_ends`): the worker sessions need not
  // wait for the state lock, and the records are mostly written by the
  // thread that routes.
  void ApplyCompletionsLocked(Released* released, bool batch_ends = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies completions until none is queued (or a batch being routed
  // will), admitting what the room they left lets go with their releases.
  // Called by the one worker session that set draining_completions_.
  void DrainCompletions() ABSL_LOCKS_EXCLUDED(mu_, admission_mu_);
  bool CompletionsPendingLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_) {
    return admission_.has_done_calls() || !copies_arrived_.empty();
  }

  // Hands the gang scheduler every unit admission lets go now, as one
  // batch in the order admission chose, after `first` (releases that need
  // no admission) if any.
  void AdmitLocked(Released first = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_);

  // ------------------------------------------------------------ status
  absl::Status WaitForWorkers(int n, absl::Duration timeout) override;

  grpc::Status GetStatus(grpc::ServerContext*,
                         const proto::StatusRequest* request,
                         proto::ClusterStatus* status) override;
  // Starts web_ where ServerOptions::web_listen asks for it (Init).
  absl::Status StartWeb();
  // What GetStatus answers, for it and the live page (web_); without the
  // why list when request.why_after_ms() < 0.
  void FillStatus(const proto::StatusRequest& request,
                  proto::ClusterStatus* status);
  // Asks every worker alive now for a heartbeat (SendStats) and waits, up
  // to `timeout` (real time: the caller's RPC budget), for each one's
  // answer, figures read after the request came, and its next periodic
  // heartbeat after that.
  void AwaitFreshStatsLocked(absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FillStatus's parts: the workers and clients (with their admission
  // view); the slices and recovery counters; the why list and the waiting
  // slice requests.
  void FillWorkersAndClientsLocked(proto::ClusterStatus* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillSlicesLocked(proto::ClusterStatus* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillWaitsLocked(const proto::StatusRequest& request,
                       proto::ClusterStatus* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The graphs with calls routed and not done (ClusterStatus.graphs): one
  // pass over the call records.
  void FillGraphsLocked(proto::ClusterStatus* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::Status Shutdown(grpc::ServerContext* ctx,
                        const proto::ShutdownRequest* request,
                        proto::ShutdownReply*) override;

  // ------------------------------------------------------------- standby
  // (server_standby.cc)
  // A standby's stream (standby/follower.h): the model as one snapshot,
  // then every journal record as it is appended (journal_feed_), with a
  // keepalive each quarter lease; the standby answers with what it has
  // synced. One standby at a time; it needs the admin credential and a
  // server that keeps a journal.
  grpc::Status Follow(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<proto::FollowUpdate, proto::FollowRequest>*
          stream) override;
  // AwaitJournalLocked's second half: the standby has synced every record
  // appended so far, or is cut off (logged: a takeover would lose them).
  void AwaitStandbyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DetachStandbyLocked(const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ------------------------------------------------------------ timeline
  // (server_trace.cc)
  // Collects every process's ring: the server's, and each live worker's
  // (CollectTimeline; each answers with TimelineChunks), with the clock
  // offsets that align them and the names of programs and call sites.
  grpc::Status Trace(grpc::ServerContext* ctx,
                     const proto::TraceRequest* request,
                     proto::TraceReply* reply) override;
  // The request's credential: the operator's for every client's events, a
  // client's for its own. OK, or the refusal (logged).
  grpc::Status CheckTraceCredential(grpc::ServerContext* ctx,
                                    const proto::TraceRequest& request) const;
  // A live worker a trace asks for its ring, and its clock offset then.
  struct TraceTarget {
    int64_t id;
    std::string host;
    int devices;
    int64_t pid;
    int64_t offset_ns = 0;
    int64_t offset_error_ns = -1;  // no estimate yet
  };
  // The program and call-site names of `only` (0: every client) into
  // `reply`, and the live workers to ask, with their offsets.
  std::vector<TraceTarget> NamesAndWorkersToAsk(uint64_t only,
                                                proto::TraceReply* reply);
  // A heartbeat's clock probe, read at `read_ns`: its completed round trip
  // (if any) into the worker's offset estimate, and a ClockEcho back.
  void OnClockProbe(int64_t worker, const proto::ClockProbe& probe,
                    int64_t read_ns);
  void OnTimelineChunk(int64_t worker, proto::TimelineChunk& chunk);
  // The worker's session ended: no trace waits for it, its estimate goes.
  void ForgetTimelineOf(int64_t worker);
  // The call of record `seq` is done (before CallDone drops its record).
  void RecordCallDoneLocked(uint64_t seq, bool failed, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call unit admitted now: its wait at admission.
  void RecordAdmitted(uint64_t client, const AdmissionUnit& unit,
                      int64_t now_ns);
  // A recovery step, from `start_ns` to now.
  void RecordRecovery(absl::string_view step, int64_t start_ns,
                      int64_t worker = 0, uint64_t client = 0);
  Timeline& timeline() { return timeline_; }

 private:
  // Sends the PeerOps the model made (ClusterState::TakePeerOps) to the
  // workers now, ahead of any unit still to be admitted. Called before
  // every unit the model made goes to admission or the scheduler.
  void SendPeerOpsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What became of the registration a rejoining worker names (empty for a
  // first registration). One this server still counts alive is declared
  // down now: the host left it behind.
  std::string PreviousRegistration(const proto::RegisterWorker& reg);

  static void AddSliceReply(uint64_t client_id, uint64_t request_id,
                            const absl::StatusOr<proto::SliceInfo>& slice,
                            proto::ServerToClient* reply);

  // Answers the waiting slice requests that can be met now or whose
  // deadline has passed, each on its client's stream; then shrinks the
  // slices that yield to a higher priority (YieldSlicesLocked), and grows
  // those that grow back (GrowSlicesLocked) with what is still free.
  void AnswerSlicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ClusterState::YieldToPriorities, sent as GrowSlicesLocked sends a
  // growth. Called after every slice granted.
  void YieldSlicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `refusals` (grow_refusals_, yield_refusals_) names a slice of
  // the client's: a batch of its that released values tries it again.
  bool HoldsRefusedSlice(uint64_t client_id,
                         const std::map<uint64_t, std::string>& refusals)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ClusterState::GrowSlices: each growth's moves to admission in its
  // client's order, its note on the client's stream, a log line and a
  // timeline event.
  void GrowSlicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the resizes the server decided (YieldSlicesLocked,
  // GrowSlicesLocked), each with its `why`, and logs each slice's
  // `why_not` once per reason, remembered in `refusals`.
  void SendServerResizesLocked(
      std::vector<std::pair<uint64_t, SliceResized>> resized,
      const std::map<uint64_t, std::string>& why_not,
      std::map<uint64_t, std::string>& refusals, const char* refused,
      int64_t start_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A resize's timeline event (kind resize, on the "slices" track), from
  // `start_ns` to now, saying `what`.
  void RecordResize(uint64_t client_id, int64_t start_ns,
                    const std::string& what);
  // A resize the server decided (a loss's shrink, a growth) reaches its
  // client: the moves and releases to admission after what the client
  // sent before, the note (new ids, lost ones) into `note`, a timeline
  // event from `start_ns` saying `what`.
  void SendServerResizeLocked(uint64_t client_id, SliceResized resized,
                              const std::string& what, int64_t start_ns,
                              proto::ServerToClient* note)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Worker `from` could not push a shard to the destination's data plane:
  // the destination fails that entry, so its consumers hear why instead of
  // waiting for bytes that will not come.
  void RelayTransferFailure(int64_t from, const proto::TransferFailed& failed);

  // `only_if_silent`: a worker that missed heartbeats, unless a message of
  // it was read while this waited for the state lock.
  void WorkerDown(int64_t id, const std::string& reason,
                  bool only_if_silent = false);
  // Sends what settling `loss` decided (SettleLoss, recovery/
  // settle_loss.h: each connected client's note and its held work routed
  // again or failed): the peer ops first, then the admitted work, then
  // the notes; logs and records each client's resize and recovery.
  void SettleLossLocked(const WorkerLoss& loss)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles the losses waiting for a host that one can take now (it
  // joined or came free) or whose wait is over (ClusterState::
  // ResumeAwaited, EndAwaited). After a registration and on each liveness
  // check.
  void ResolveAwaitedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Each client hears which of its puts are released for good: it drops
  // the data it kept to put them again after a loss.
  void TellReleasedPutsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each client hears which of its values were parked in files (a suspend
  // to files whose parks are done): they read as parked from then on.
  void TellParkedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The journal (ServerOptions::journal_path), opened by Init: a journal
  // that holds records rebuilds the model (ClusterState::Restore), whose
  // workers and sessions then have options_.resume_wait to come back.
  absl::Status OpenJournal();
  // The resume wait is over: workers that did not come back are lost,
  // sessions that did not are ended. Once, from the liveness check.
  void EndResumeWait();
  // Waits until every record the model has journaled is durable: nothing
  // that depends on a change (a program's calls, a slice's, a client's or
  // worker's id) leaves the server before the change would survive a
  // crash. Only after a batch that changed the journal (a session opened,
  // a slice granted or released, a program registered, a worker joined):
  // one group commit (a sync, ~3.5 ms on this VM), held under mu_.
  void AwaitJournalLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compacts the journal once enough was written since the last time
  // (ServerOptions::journal_compact_every); from the liveness check.
  void MaybeCompactJournal();
  // A session asks to be resumed (ClientToServer.resume_client_id): its
  // credential and tenant are checked, then it waits (bounded by the resume
  // wait) for the workers of its slices to come back. OK: `id` resumed.
  absl::Status ResumeSessionLocked(const proto::ClientToServer& msg,
                                   const std::string& tenant, uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void LivenessLoop();
  // The ops listener where client sessions send their ops as frames
  // (client_ops_), where the options allow; a listener that cannot start
  // is logged and the ops stay on the streams.
  void StartClientOpsListener();
  // The server did not run for `stalled` (ServerStalled): no worker's
  // silence of that time counts. Each is deemed heard now, so a worker
  // that really died or hung meanwhile is declared down a deadline from
  // now (a dead one's stream break is seen at once, as ever).
  void ExcuseSilence(absl::Duration stalled);

  const ServerOptions options_;
  const ClusterSecret secret_;
  // This machine (LocalMachineId): a worker of the same one takes its ops
  // connection on its unix socket.
  const std::string machine_id_;
  Timeline timeline_;
  // Each worker's clock offset, from its heartbeats (a leaf lock).
  absl::Mutex clock_mu_;
  absl::flat_hash_map<int64_t, ClockOffsetEstimator> clock_offsets_
      ABSL_GUARDED_BY(clock_mu_);
  // Trace RPCs waiting for workers' rings, by request id (a leaf lock).
  struct PendingTrace {
    std::set<int64_t> waiting;  // workers that have not answered in full
    std::map<int64_t, std::vector<proto::TimelineRing>> rings;
  };
  absl::Mutex trace_mu_;
  absl::CondVar trace_answered_;
  std::map<uint64_t, PendingTrace> traces_ ABSL_GUARDED_BY(trace_mu_);
  // Asks each of `asked` for its ring since `since` (server time) and
  // waits, on the injected clock, until all have answered or `timeout`
  // passed: what came, and in `waiting` who did not answer.
  PendingTrace CollectWorkerRings(const std::vector<TraceTarget>& asked,
                                  int64_t since, absl::Duration timeout);
  uint64_t next_trace_ ABSL_GUARDED_BY(trace_mu_) = 0;
  std::string address_;
  std::string advertised_;  // what clients and status are told
  // Whether a session without a tenant credential opens (as "default"):
  // options_.anonymous_clients on a loopback listen address. Set by Init.
  bool anonymous_clients_ = false;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Where client sessions send their ops as frames (null: none; see
  // ServerOptions::client_ops_on_frames); reset once every session's
  // handler returned. Each session's generation is the next of
  // client_ops_generation_.
  std::unique_ptr<ClientOpsListener> client_ops_;
  // Reads every worker's reports on its ops connection (PollReports).
  // Started by Init; every session removes its worker before it returns.
  std::unique_ptr<transport::FramePoller> reports_poller_;
  std::atomic<uint64_t> client_ops_generation_{0};
  std::thread liveness_;
  // The other server of a pair (ServerOptions::peer_address); null if none.
  std::unique_ptr<PeerWatch> peer_watch_;
  std::atomic<bool> stepped_down_{false};
  // The live page and /metrics (ServerOptions::web_listen); null if none.
  // Reads status through FillStatus; destroyed first.
  std::unique_ptr<web::WebServer> web_;
  std::string web_advertised_;

  // The scheduler lock: everything below, and the order in which ops enter
  // the worker queues (one consistent order across clients).
  absl::Mutex mu_;
  ClusterState state_ ABSL_GUARDED_BY(mu_);
  // The last SendStats request id (AwaitFreshStatsLocked).
  uint64_t stats_requests_ ABSL_GUARDED_BY(mu_) = 0;
  // Owns the worker queues and the order of everything put on them.
  // The admission lock: taken after mu_ when both are held, never before.
  absl::Mutex admission_mu_ ABSL_ACQUIRED_AFTER(mu_);
  Admission admission_ ABSL_GUARDED_BY(admission_mu_);
  absl::CondVar admission_room_;  // a client's queue at admission moved
  bool stopping_ ABSL_GUARDED_BY(admission_mu_) = false;
  // Completions not yet in the records (ApplyCompletionsLocked): one
  // queue, under the admission lock (calls done wait in admission_,
  // snapshot copies arrived here), drained under the state lock by the
  // thread that routes a client's batch as the batch ends
  // (routing_batch_), or else by one worker session's thread at a time
  // (draining_completions_: DrainCompletions), never by two at once.
  std::vector<uint64_t> copies_arrived_ ABSL_GUARDED_BY(admission_mu_);
  bool routing_batch_ ABSL_GUARDED_BY(admission_mu_) = false;
  bool draining_completions_ ABSL_GUARDED_BY(admission_mu_) = false;
  // Their room, reused: taken under admission_mu_, applied under mu_.
  std::vector<std::pair<uint64_t, bool>> done_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> copies_to_apply_ ABSL_GUARDED_BY(mu_);
  // When each worker was last heard from, on the injected clock, kept apart
  // from the state lock: its session's reader stamps every message as it
  // reads it (HeardFrom) and the liveness check reads the stamps, so a
  // heartbeat that arrived is never applied late because the state lock
  // was busy. A leaf lock, held only to stamp or read.
  absl::Mutex heard_mu_ ABSL_ACQUIRED_AFTER(mu_, admission_mu_);
  absl::flat_hash_map<int64_t, LastHeard> heard_ ABSL_GUARDED_BY(heard_mu_);
  // The threads that write the workers' streams (OutQueue in pool mode):
  // a few for all of them, not one each. Before scheduler_, which holds
  // the queues: destroyed after them.
  // A call over H hosts schedules H queues at once: one writer is woken
  // per 16 of them (not 4), since a wake-up costs more than the few small
  // writes it spares another thread (server CPU per chained call at 32
  // hosts 0.87x in bench/dispatch_ab.sh's rounds, 2026-12-07).
  WriterPool worker_writers_{
      {.threads = 4, .queues_per_thread = 16, .name = "plexus-to-wkr"}};
  GangScheduler scheduler_;
  std::map<int64_t, grpc::ServerContext*> worker_contexts_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<OutQueue<proto::ServerToClient>>>
      client_queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, grpc::ServerContext*> client_contexts_
      ABSL_GUARDED_BY(mu_);
  // Each client session's ops generation, where its ops may come as
  // frames (status reads its frames by it).
  std::map<uint64_t, uint64_t> client_ops_generations_ ABSL_GUARDED_BY(mu_);
  // Why each slice that grows back did not, and why each that could yield
  // to a higher priority did not, as last logged (said again only when the
  // reason changes; forgotten when the slice is released).
  std::map<uint64_t, std::string> grow_refusals_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> yield_refusals_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> control_bytes_in_{0};
  // The generation the last registration was given; each takes the next.
  // It starts at the wall clock in microseconds, so a restarted server's
  // registrations are newer than its predecessor's (the real clock whatever
  // options_.clock is: a FakeClock starts every server at the same time).
  uint64_t generation_ ABSL_GUARDED_BY(mu_) =
      static_cast<uint64_t>(absl::ToUnixMicros(Clock::Real()->Now()));
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // The journal and the model's sink over it (null: none). The sink is
  // written under mu_; the journal is thread-safe.
  std::unique_ptr<journal::Journal> journal_;
  std::unique_ptr<JournalSink> journal_sink_ ABSL_GUARDED_BY(mu_);
  int64_t compacted_at_ ABSL_GUARDED_BY(mu_) = 0;  // sink records then
  // The standby following the journal (null: none), and its name.
  std::shared_ptr<JournalFeed> standby_feed_ ABSL_GUARDED_BY(mu_);
  std::string standby_name_ ABSL_GUARDED_BY(mu_);
  // The Shutdown RPC (an operator's): the standby stops too, rather than
  // take over as after a crash or a signal.
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
  // When the resume wait after a restart on a journal ends (InfinitePast:
  // none is running).
  absl::Time resume_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // EndResumeWait is losing the workers that did not come back: sessions
  // resuming wait for it (ResumeSessionLocked).
  bool ending_resume_wait_ ABSL_GUARDED_BY(mu_) = false;
};

// Inline, as they were in the class: the helpers below run on every message
// a worker session reads (server_workers.cc), on every client batch
// (server_clients.cc), or on both, and no hot path calls across translation
// units.

inline void ServerImpl::Handled(int64_t id) {
  absl::MutexLock lock(&heard_mu_);
  auto it = heard_.find(id);
  if (it != heard_.end() && it->second.handling > 0) --it->second.handling;
}

inline GangUnit ServerImpl::ReleasedUnit(Released released) {
  GangUnit unit;
  unit.ops = std::move(released.ops);
  for (auto& [slice, release] : released.shared) {
    if (release.ids.empty()) continue;
    proto::WorkerOp op;
    *op.mutable_release()->mutable_buffer_ids() = {release.ids.begin(),
                                                   release.ids.end()};
    auto encoded = std::make_shared<EncodedOp>();
    encoded->bytes = op.SerializeAsString();
    encoded->workers = std::move(release.hosts);
    unit.shared.push_back(std::move(encoded));
  }
  return unit;
}

inline void ServerImpl::ApplyCompletionsLocked(Released* released,
                                               bool batch_ends) {
  {
    absl::MutexLock admission(&admission_mu_);
    if (batch_ends) routing_batch_ = false;
    admission_.TakeDoneCalls(&done_calls_);
    copies_to_apply_.clear();
    copies_to_apply_.swap(copies_arrived_);
  }
  if (done_calls_.empty() && copies_to_apply_.empty()) return;
  const int64_t now_ns =
      timeline_.enabled() && !done_calls_.empty() ? timeline_.NowNs() : 0;
  for (const auto& [seq, failed] : done_calls_) {
    if (now_ns != 0) RecordCallDoneLocked(seq, failed, now_ns);
    state_.CallDone(seq, failed, &released->ops, &released->shared);
  }
  for (uint64_t copy : copies_to_apply_) {
    state_.CopyArrived(copy, &released->ops);
  }
  TellReleasedPutsLocked();
  TellParkedLocked();
}

inline void ServerImpl::TellParkedLocked() {
  std::map<uint64_t, proto::Recovery> notes = state_.TakeParkedNotes();
  if (notes.empty()) return;
  // Parked in the journal before the client hears it (its suspend returns
  // then): a restart after that keeps the values parked.
  AwaitJournalLocked();
  for (auto& [client, note] : notes) {
    auto it = client_queues_.find(client);
    if (it == client_queues_.end()) continue;
    proto::ServerToClient msg;
    *msg.add_recoveries() = std::move(note);
    it->second->Push(std::move(msg));
  }
}

inline void ServerImpl::AdmitLocked(Released first) {
  std::vector<GangUnit> batch;
  if (!first.empty()) batch.push_back(ReleasedUnit(std::move(first)));
  const size_t admitted_from = batch.size();
  uint64_t client;
  AdmissionUnit unit;
  int64_t now_ns = 0;
  while (admission_.Next(&client, &unit)) {
    if (unit.routed_ns != 0 && timeline_.enabled()) {
      if (now_ns == 0) now_ns = timeline_.NowNs();
      RecordAdmitted(client, unit, now_ns);
    }
    batch.push_back({std::move(unit.ops), std::move(unit.executes), {}});
  }
  if (batch.empty()) return;
  const bool admitted = batch.size() > admitted_from;
  scheduler_.Submit(std::move(batch));
  if (admitted) admission_room_.SignalAll();
}

inline void ServerImpl::TellReleasedPutsLocked() {
  for (auto& [client, ids] : state_.TakeReleasedPuts()) {
    auto it = client_queues_.find(client);
    if (it == client_queues_.end()) continue;
    proto::ServerToClient note;
    for (uint64_t id : ids) note.add_released_puts(id);
    it->second->Push(std::move(note));
  }
}

inline bool ServerImpl::Ordered(const WorkerOps& ops) {
  for (const auto& [w, list] : ops) {
    for (const proto::WorkerOp& op : list) {
      if (op.has_release() || op.has_transfer()) return true;
    }
  }
  return false;
}

inline void ServerImpl::WaitForRoomInQueue(grpc::ServerContext* ctx,
                                           uint64_t id) {
  absl::MutexLock admission(&admission_mu_);
  while (!stopping_) {
    const Admission::ClientView* view = admission_.Find(id);
    if (view == nullptr || view->pending_calls < view->max_calls_in_flight) {
      return;
    }
    // A client that died is seen here within this period (a cancelled
    // stream has no other way to wake this thread).
    if (ctx->IsCancelled()) return;
    admission_room_.WaitWithTimeout(&admission_mu_, absl::Milliseconds(100));
  }
}

}  // namespace plexus
