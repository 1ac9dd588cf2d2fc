// The Plexus client: the single controller. Connects to the server, asks
// for slices, compiles programs for them and calls them. Calls return
// futures at once; the ops travel to the server in batches on one stream
// (never one RPC per call) and the client never sits on the critical path.
// Bulk bytes go straight to and from workers over the data plane (put and
// fetch), never through the server.
//
// Client, Slice, Program and Future are safe to use from several threads.
// Every blocking method waits without holding a lock the I/O threads need.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/client/reconnect.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

class ClientCore;
class BufferHandle;
struct SessionTag;

enum class Placement { kAny, kOneHost, kSpread };

struct SliceOptions {
  int num_devices = 1;
  std::vector<int32_t> mesh_shape;      // default: [num_devices]
  std::vector<std::string> axis_names;  // default: ["devices"]
  Placement placement = Placement::kAny;
  // Only devices of these hosts (host names as their workers registered).
  std::vector<std::string> hosts;
  // Not on the hosts of these slices (this client's own).
  std::vector<uint64_t> avoid_slices;
  // How long the server may hold the request for capacity it lacks now
  // (live devices or hosts, room under the tenant's max_devices): past it,
  // DeadlineExceeded saying what it waited for. Zero: ResourceExhausted
  // at once.
  absl::Duration timeout = absl::Seconds(30);
  // When a host of the slice is lost and no spare is free: wait for one,
  // break, or shrink along mesh axis `elastic_axis` to the live hosts (no
  // smaller than `min_devices`), growing back as hosts join if `grow`
  // (docs/scheduling.md, "When a host is lost").
  proto::LossPolicy on_loss = proto::LOSS_WAIT;
  int32_t min_devices = 0;
  bool grow = false;
  int32_t elastic_axis = 0;
  // When a higher-priority tenant's slice is mapped to its devices: share
  // them, shrink off them, or be suspended until they free (its calls
  // wait at the server meanwhile); the default shrinks where on_loss does
  // (docs/scheduling.md, "Priorities").
  proto::PreemptPolicy on_preempt = proto::PREEMPT_DEFAULT;
};

// The request that asks for a slice as `options` say.
proto::SliceRequest ToProto(const SliceOptions& options);

// A set of virtual devices granted by the server, with a mesh shape.
// Thread-safe: Close() may race calls on the slice from other threads; each
// such call either fails with FailedPrecondition ("... slice was closed")
// or reaches the server before the slice's release (and computes).
// A slice outlives its client's session: after a reconnect the client asks
// for it again with the same options (Rebind: a new id and map), or, if it
// cannot be granted again, its uses fail with lost() (reconnect.h).
class Slice : public std::enable_shared_from_this<Slice> {
 public:
  // The server's id for it in the current session (a reconnect changes it).
  uint64_t id() const { return id_.load(std::memory_order_acquire); }
  // The id it was first granted under; stays across reconnects.
  uint64_t first_id() const { return first_id_; }
  // The session it is granted in (ClientCore's epoch).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  const SliceOptions& options() const { return options_; }
  // Why it could not be granted again after a reconnect, or OK.
  absl::Status lost() const;
  int num_devices() const { return info().devices_size(); }
  // The slice's current map of virtual devices (its device indices) to
  // physical ones. A remap (a host lost, a spare in its place) makes a new
  // one, with a higher generation(); a reference to an older one stays
  // valid as long as the slice.
  const proto::SliceInfo& info() const {
    return *current_.load(std::memory_order_acquire);
  }
  uint64_t generation() const { return info().generation(); }
  // Distinct hosts the slice spans.
  int num_hosts() const;
  // How many times it was resized (Resize); programs compiled before the
  // last resize are refused by the server.
  uint64_t resizes() const { return info().resizes(); }
  // What Resize moved: the slice's live values and their bytes (over all
  // shards of the new map).
  struct Resized {
    int values_moved = 0;
    int64_t bytes_moved = 0;
  };
  // Resizes the slice to `num_devices` along mesh axis `axis` (its other
  // axes keep their sizes) while the job runs: the server maps it anew
  // (ClusterState::ResizeSlice) and moves every live value onto the new
  // map under a new id, after the calls issued before; futures stay valid
  // and read the moved values. Returns once the server has routed the
  // moves, with info() the new map; a refusal says what and why, and then
  // nothing changed.
  absl::StatusOr<Resized> Resize(int num_devices, int axis);
  // Suspends the slice (ClusterState::SuspendSlice): calls and puts on it
  // are refused until Resume(); its devices count against no quota and
  // claim nothing for its priority; its values stay in the workers'
  // memory, futures stay valid and readable. Calls issued before go on.
  // With `to_files`, every live value is also written to files of the
  // server's park directory (a file per device) and released from the
  // workers' memory: Suspend returns once every file is written and synced
  // and the server recorded every value as parked (what was parked, and
  // its bytes over all devices); futures read as parked
  // (FailedPrecondition) until Resume reads the values back, on any hosts,
  // workers and server restarted meanwhile or not.
  absl::StatusOr<Resized> Suspend(bool to_files = false);
  // Resumes it (ClusterState::ResumeSlice): on its own devices while no
  // other slice took them, else on others the tenant may hold, its values
  // moved there under new ids, as a resize's (futures follow). Returns
  // what moved; refused (it stays suspended) while too few devices are
  // free.
  absl::StatusOr<Resized> Resume();
  bool suspended() const { return info().suspended(); }
  // Why the server holds it suspended for a higher priority; empty if not.
  std::string preempted() const { return info().preempted(); }
  // Returns the slice to the server. Futures on it stay readable until
  // released; new calls on it fail. Never blocks: a call still being
  // queued sends the release after its own op.
  void Close();
  bool closed() const;

  // Internal. A call (or put) holds the slice from its closed() check until
  // its op is queued; Close() during a hold queues the release at the last
  // Unhold(). Hold() is false (and holds nothing) once the slice is closed.
  bool Hold();
  void Unhold();

  // Internal. The server remapped the slice (ClientCore's reader).
  void Remap(proto::SliceInfo info);
  // Internal. Granted again in session `epoch` (ClientCore's reconnect), or
  // not: `lost` says why.
  void Rebind(proto::SliceInfo info, uint64_t epoch);
  void MarkLost(absl::Status lost);
  // Internal. The slices options().avoid_slices named when it was made,
  // to name them by their ids of the day when it is asked for again.
  void SetAvoided(std::vector<std::weak_ptr<Slice>> slices);
  std::vector<std::weak_ptr<Slice>> avoided() const;

  // Internal.
  Slice(std::shared_ptr<ClientCore> core, proto::SliceInfo info,
        SliceOptions options, uint64_t epoch);
  ~Slice();

 private:
  // Suspend's and Resume's request, `req` naming which.
  absl::StatusOr<Resized> SendSuspendOrResume(
      proto::SliceResize req, const char* what,
      std::vector<uint64_t>* tokens = nullptr,
      std::vector<uint64_t>* parked_ids = nullptr);
  // How long Suspend(to_files) waits, once the files are written, for the
  // server's note that it recorded the values as parked.
  static constexpr absl::Duration kParkedNoteWait = absl::Seconds(30);

  const std::shared_ptr<ClientCore> core_;
  const uint64_t first_id_;
  const SliceOptions options_;
  std::atomic<uint64_t> id_;
  std::atomic<uint64_t> epoch_;
  absl::Mutex maps_mu_;
  // Every map the slice had, the last current; never shrinks (remaps are
  // few), so info() references stay valid.
  std::deque<proto::SliceInfo> maps_ ABSL_GUARDED_BY(maps_mu_);
  std::atomic<const proto::SliceInfo*> current_{nullptr};

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<Slice>> avoided_ ABSL_GUARDED_BY(mu_);
};

// A program compiled for a slice: static input and output specs. Like its
// slice, it outlives a session: a reconnect registers it again (Rebind),
// or its calls fail with lost(). Thread-safe.
class Program {
 public:
  const std::string& name() const { return def_.name(); }
  const std::vector<ArgSpec>& inputs() const { return inputs_; }
  const std::vector<ArgSpec>& outputs() const { return outputs_; }
  const std::shared_ptr<Slice>& slice() const { return slice_; }
  // The id it is registered under in the current session.
  uint64_t id() const { return id_.load(std::memory_order_acquire); }
  // The session it is registered in.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // As first registered (a reconnect registers a copy whose XLA islands
  // name the workers of the slice's new map).
  const proto::ProgramDef& def() const { return def_; }
  // Why it could not be registered again after a reconnect, or OK.
  absl::Status lost() const;
  // The inputs each call consumes (XLA donation: def().xla()
  // .donated_inputs): their futures are released by the call and refused
  // afterwards.
  const std::vector<int>& donated_inputs() const { return donated_; }

  // Internal (ClientCore's reconnect).
  void Rebind(uint64_t id, uint64_t epoch);
  void MarkLost(absl::Status lost);

  // Internal.
  Program(uint64_t id, proto::ProgramDef def, std::vector<ArgSpec> inputs,
          std::vector<ArgSpec> outputs, std::shared_ptr<Slice> slice,
          uint64_t epoch)
      : id_(id),
        epoch_(epoch),
        def_(std::move(def)),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        slice_(std::move(slice)),
        donated_(def_.xla().donated_inputs().begin(),
                 def_.xla().donated_inputs().end()) {}

 private:
  std::atomic<uint64_t> id_;
  std::atomic<uint64_t> epoch_;
  mutable absl::Mutex mu_;
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  proto::ProgramDef def_;
  std::vector<ArgSpec> inputs_;
  std::vector<ArgSpec> outputs_;
  std::shared_ptr<Slice> slice_;
  std::vector<int> donated_;
};

// A value that may not be computed yet: a sharded buffer on a slice.
// Copies share one buffer; when the last copy goes, the workers free it.
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<BufferHandle> handle)
      : handle_(std::move(handle)) {}
  bool valid() const { return handle_ != nullptr; }
  uint64_t buffer_id() const;
  // buffer_id() and the map of slice() it is on, read together: a resize
  // (the server's or the client's) changes both at once. Every read of its
  // shards (fetch, wait) goes by this pair.
  std::pair<uint64_t, const proto::SliceInfo*> placed() const;
  const ArgSpec& arg() const;
  const TensorSpec& spec() const { return arg().global; }
  const Sharding& sharding() const { return arg().sharding; }
  const std::shared_ptr<Slice>& slice() const;
  // The session it was made in; once that session ended, it is lost.
  uint64_t epoch() const;
  const std::shared_ptr<BufferHandle>& handle() const { return handle_; }

 private:
  std::shared_ptr<BufferHandle> handle_;
};

// Calls recorded in order and sent as batches: a long graph sends each
// kStreamedOps ops recorded as they come (the first kFirstOpsAfterWait
// after the client waited on a result), so the server and workers run its
// first calls while the rest are recorded; Submit sends the rest. Every
// call recorded is made: the graph's batches go in order, one graph id
// (Call.graph_id) for all of them; another thread's calls may go between
// two batches. A graph destroyed with calls recorded and not submitted
// does not send those, and their outputs fail (FailedPrecondition, saying
// so) rather than wait for a call that never comes.
class Graph {
 public:
  // A batch sent while recording: the pipelining it buys (a 2,000-call
  // tiny chain 0.7x the time of one batch at the end, bench/xla.py) against
  // a message per batch (at 64, back-to-back graphs of 128 calls went as
  // two messages each: chained dispatch 0.93x).
  static constexpr size_t kStreamedOps = 128;
  // The first batch after the client waited on a result (the cluster may
  // be idle: a training loop's step after it read the loss) goes at this
  // many, so the cluster starts on it while the rest is recorded, and each
  // next batch twice the last, up to kStreamedOps (the cluster is kept fed
  // while the client records faster than it runs).
  static constexpr size_t kFirstOpsAfterWait = 16;

  // `site`: Client::CallSite's id for where it was issued (0: none).
  absl::StatusOr<std::vector<Future>> Call(const Program& program,
                                           const std::vector<Future>& inputs,
                                           uint32_t site = 0);
  // Sends the recorded calls not sent yet. The graph ends: a call recorded
  // after it starts another.
  absl::Status Submit();
  // Ops recorded and not sent yet.
  size_t size() const { return ops_.size(); }

  // Internal.
  explicit Graph(std::shared_ptr<ClientCore> core) : core_(std::move(core)) {}
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

 private:
  // Queues the recorded ops for the server (in sequential dispatch, each
  // once its inputs are computed).
  absl::Status Send();
  // Fails the outputs of the recorded calls not sent, and forgets them.
  void Abandon();
  // Forgets the recorded ops, their inputs and the futures they hold.
  void ClearRecorded();

  std::shared_ptr<ClientCore> core_;
  std::vector<proto::ClientOp> ops_;
  // Per op, in sequential dispatch only (ClientOptions::sequential_dispatch).
  std::vector<std::vector<Future>> op_inputs_;
  // Every future the recorded calls read or write, held until they are
  // sent: a future dropped while recording must not be released before
  // the calls that use it reach the server.
  std::vector<Future> keep_;
  // The session of its first recorded call (null: none yet); every call
  // of the graph is of that session.
  std::shared_ptr<SessionTag> session_;
  // Its id (Call.graph_id), taken by its first recorded call (0: none
  // yet); each Submit starts another graph.
  uint64_t graph_id_ = 0;
  // The ops at which the batch being recorded is sent (0: none recorded).
  size_t batch_ops_ = 0;
};

struct ClientOptions {
  std::string name = "client";
  // Use shared memory with workers on this machine for put and fetch, and
  // the server's unix socket for its ops (else TCP).
  bool shared_memory = true;
  // Sequential dispatch, for comparison: a call is sent only once every
  // input it reads is computed (one round trip per dependent call). The
  // default, parallel asynchronous dispatch, sends calls at once and lets
  // the workers arrange inputs before they exist.
  bool sequential_dispatch = false;
  // How long a buffer's release queued alone waits (real time) for the
  // next op to go with it to the server before it goes by itself. A loop of
  // call, fetch, drop then sends each release with the next call: one
  // message to the server and one to each worker where there were two
  // (each costs every process on the way a thread wake-up). Flush() and
  // the session's end send it at once.
  absl::Duration release_linger = absl::Milliseconds(1);
  // A call (or put, or program) made after the client waited on a result
  // (Fetch, Wait, WaitMany) since its last op, while nothing is being
  // written to the server, is written by the thread that made it instead
  // of waking the sender thread: a blocking round trip (call, then wait)
  // then costs one thread wake-up less. A loop that issues calls without
  // waiting keeps handing them to the sender, which writes them in
  // batches beside the loop (written inline, each would cost the loop a
  // write). False: the sender writes every op.
  bool send_inline_after_wait = true;
  // Such a call (made right after a wait) goes with Call.relay where its
  // outputs' shards are small (16 KiB at most) and the client has a relay
  // link to each worker of its slice (opened after its first fetch from
  // that worker): each worker then sends the outputs it computes on the
  // link as soon as they are decided, and a fetch or wait of them reads
  // them there, with no FETCH sent (transport/relay_links.h): a blocking
  // round trip takes the three messages any path through the server
  // needs, not four. Anything else is fetched as before. The Python
  // client turns it off with $PLEXUS_RELAY_ANSWERS=0.
  bool relay_answers = true;
  // Who the session opens as (common/credentials.h, tenant credentials):
  //   - `tenant` and `tenant_token` (32 hex digits, `plexus token`), else
  //     $PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN;
  //   - no token, but the cluster secret (`secret`, else
  //     $PLEXUS_CLUSTER_SECRET): the token is derived from it, for
  //     `tenant` (else $PLEXUS_TENANT, else "default");
  //   - neither: anonymous, which a loopback server admits as "default"
  //     and a server off loopback refuses.
  std::string tenant;
  std::string tenant_token;
  std::optional<ClusterSecret> secret;
  // The CA the server's TLS certificate is checked against (a PEM file;
  // common/tls.h); empty: $PLEXUS_TLS_CA, else plain text.
  std::string tls_ca;
  // After the session with the server ends without Close (the server
  // restarted, or the connection broke), how long the client keeps trying
  // to open a new one at the same address (back-off from 0.1 s to 2 s).
  // In the new session it asks for its slices again and registers its
  // programs again; futures of the old session are lost (reconnect.h).
  // Calls, puts and slice requests made meanwhile wait for it (at most
  // this long; a slice request at most its own timeout), then fail with
  // UNAVAILABLE naming the server and the wait. Zero: no reconnect, every
  // use fails once the session ended (the embedded cluster's clients:
  // their workers end with the server).
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // Every deadline, back-off and time stamp of the client reads this clock
  // (common/clock.h); tests inject a FakeClock. Not owned; outlives the
  // client.
  Clock* clock = Clock::Real();
};

struct ClientCounters {
  int64_t bytes_put = 0;
  int64_t bytes_fetched = 0;
  int64_t calls = 0;
  int64_t live_futures = 0;
  // Times the client waited on a worker's answers to readiness requests:
  // one per shard for Wait, one per worker for WaitMany.
  int64_t wait_round_trips = 0;
  // Messages written to the server: each a batch of every op queued while
  // the last one was written (one call alone when the client waits on each).
  int64_t messages_sent = 0;
  // Of those, written by the thread that made the op, not the sender
  // thread (ClientOptions::send_inline_after_wait).
  int64_t messages_sent_inline = 0;
  // Of those, sent as frames on the server's ops listener (its session's
  // ops moved there: ServerToClient.ops_*), not on the gRPC stream.
  int64_t messages_sent_as_frames = 0;
  // Relay links opened (one per worker fetched from), and the fetches and
  // waits answered by a relayed answer (ClientOptions::relay_answers).
  int64_t relay_links_opened = 0;
  int64_t answers_relayed = 0;
};

// The payload bytes of one put or fetch: all it will move, once known, and
// those moved so far, counted as they go (client/data_io.cc). The operation
// writes it; any thread may read it while it runs (the Python client's
// progress line), without a lock.
struct TransferProgress {
  std::atomic<int64_t> total_bytes{0};
  std::atomic<int64_t> done_bytes{0};
};

// What the server's last recovery of a lost host did to this client's
// slices and calls (proto::Recovery, in words): the progress line's
// "host3 lost; remapped onto host5; recomputing 12 calls".
struct RecoverySummary {
  absl::Time when;        // the client heard it
  std::string lost_host;  // "worker 7" where no slice of this client had it
  std::vector<std::string> remapped_onto;  // the hosts that took its place
  int64_t calls_recomputed = 0;
  int64_t values_lost = 0;
  int64_t slices_broken = 0;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& address, const ClientOptions& options = {});
  ~Client();  // Close()

  // The current session's client id (a reconnect changes it).
  uint64_t client_id() const;

  absl::StatusOr<std::shared_ptr<Slice>> CreateSlice(
      const SliceOptions& options);
  // Infers output specs from the kernel's rules; errors name the program.
  absl::StatusOr<std::shared_ptr<Program>> Compile(
      const std::shared_ptr<Slice>& slice, const std::string& name,
      const std::string& kernel, const Attrs& attrs,
      const std::vector<ArgSpec>& inputs);
  // Returns at once with one future per output.
  // An XLA program: a StableHLO module (see proto::XlaProgram) whose
  // inputs and outputs the caller read from the lowering. Inputs must be
  // replicated or split.
  absl::StatusOr<std::shared_ptr<Program>> CompileXla(
      const std::shared_ptr<Slice>& slice, const std::string& name,
      proto::XlaProgram xla, const std::vector<ArgSpec>& inputs,
      std::vector<ArgSpec> outputs);
  // `site`: CallSite's id for where it was issued (0: none).
  absl::StatusOr<std::vector<Future>> Call(const Program& program,
                                           const std::vector<Future>& inputs,
                                           uint32_t site = 0);
  // An id for a place in the program that issues calls ("train.py:42 in
  // step"), which the timeline names each call by; the same for the same
  // text (0 past 4096 distinct ones).
  uint32_t CallSite(const std::string& text);
  // CollectTrace with this session's credential: this client's events.
  absl::StatusOr<proto::TraceReply> Trace(int64_t since_ns,
                                          absl::Duration timeout);
  Graph NewGraph();
  // Copies `data` (the row-major global array) onto the slice's workers.
  // `progress`, if not null, counts the shards' bytes as they go.
  absl::StatusOr<Future> Put(const std::shared_ptr<Slice>& slice,
                             const void* data, const ArgSpec& arg,
                             TransferProgress* progress = nullptr);
  // Blocks until the value is ready, then writes the global array (row
  // major, arg().global.byte_size() bytes) to `dst`. `progress`, if not
  // null, counts the shards' bytes as they arrive (from zero again if a
  // lost host makes it read the recovered value).
  absl::Status Fetch(const Future& future, void* dst,
                     TransferProgress* progress = nullptr);
  // Blocks until every shard is ready, or returns the error that made it
  // fail. With a timeout: DeadlineExceeded when it passes.
  absl::Status Wait(const Future& future);
  // Blocks until every shard of every future is ready, in one round trip
  // per worker (all its shards' waits are sent at once, to every worker,
  // before any answer is read), or until `deadline`: then DeadlineExceeded
  // saying how many futures were not confirmed ready. A failed future's
  // error is returned as Wait returns it.
  absl::Status WaitMany(const std::vector<Future>& futures,
                        absl::Time deadline = absl::InfiniteFuture());
  // Fetch, Wait and WaitMany go on through a lost host whose values the
  // server recovers (client/recovering.cc): a read that fails because a
  // host was lost waits for the server's word on the loss, then reads the
  // recovered value (under its new id, from its new place), or returns
  // DATA_LOSS if it was lost.
  // Asks for an in-memory copy of each future's shards on another host of
  // its slice (peer to peer, after the calls before it; asynchronous),
  // replacing its previous one: should a host be lost, its shards are
  // restored from the copy instead of being recomputed or lost.
  absl::Status Snapshot(const std::vector<Future>& futures);
  // The sessions that ended under this client, oldest first: what each
  // lost and what the reconnect after it restored (reconnect.h).
  std::vector<SessionEnd> SessionEnds() const;
  SessionState state() const;
  // The last recovery that touched this client, if one has.
  std::optional<RecoverySummary> LastRecovery() const;
  // Sends everything queued now (calls are otherwise sent as soon as the
  // sender thread wakes).
  void Flush();
  ClientCounters counters() const;
  // Closes the session: the server frees the client's slices and buffers.
  void Close();

 private:
  explicit Client(std::shared_ptr<ClientCore> core) : core_(std::move(core)) {}
  // One attempt of each (data_io.cc).
  absl::StatusOr<Future> PutOnce(const std::shared_ptr<Slice>& slice,
                                 const void* data, const ArgSpec& arg,
                                 TransferProgress* progress);
  absl::Status FetchOnce(const Future& future, void* dst,
                         TransferProgress* progress);
  absl::Status WaitOnce(const Future& future);
  absl::Status WaitManyOnce(const std::vector<Future>& futures,
                            absl::Time deadline);
  // Checks argument (or output) specs against the slice: valid, evenly
  // split, within every device's budget.
  static absl::Status CheckArgs(const Slice& slice, const std::string& what,
                                const char* kind,
                                const std::vector<ArgSpec>& args);
  // Checks the outputs and registers the program with the server.
  absl::StatusOr<std::shared_ptr<Program>> Register(
      const std::shared_ptr<Slice>& slice, proto::ProgramDef def,
      const std::vector<ArgSpec>& inputs, std::vector<ArgSpec> outputs);
  std::shared_ptr<ClientCore> core_;
};

// The cluster status as the server sees it. With `fresh`, the server
// answers once every live worker has reported after the request (one
// heartbeat, ~500 ms): the way to wait for a change in worker stats.
absl::StatusOr<proto::ClusterStatus> GetClusterStatus(
    const std::string& address, bool fresh = false);
// Asks the server to shut down (and, for an embedded cluster, its workers),
// with the admin credential derived from the cluster's `secret`;
// PermissionDenied if the server holds another secret.
absl::Status ShutdownServer(const std::string& address,
                            const ClusterSecret& secret);
// Every process's timeline ring, through the server (timeline/timeline.h):
// events that end at or after `since_ns` on the server's clock (0: all the
// rings hold); without `events`, only the server's time now. Waits up to
// `timeout` for the workers' rings.
// `client_id` 0 with the admin credential reads every client's events; a
// client's id with its session credential its own (TraceRequest).
struct TraceAuth {
  uint64_t client_id = 0;
  std::optional<Credential> credential;
};
absl::StatusOr<proto::TraceReply> CollectTrace(
    const std::string& address, int64_t since_ns, bool events = true,
    absl::Duration timeout = absl::Seconds(10), const TraceAuth& auth = {});

}  // namespace plexus
