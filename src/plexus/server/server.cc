#include "plexus/server/server.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpcpp/grpcpp.h"
#include "plexus/common/address.h"
#include "plexus/common/logging.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/tls.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/admission.h"
#include "plexus/server/cluster_state.h"
#include "plexus/server/gang_scheduler.h"
#include "plexus/server/out_queue.h"

namespace plexus {
namespace {

using WorkerStream =
    grpc::ServerReaderWriter<proto::ServerToWorker, proto::WorkerToServer>;
using ClientStream =
    grpc::ServerReaderWriter<proto::ServerToClient, proto::ClientToServer>;

class ServerImpl : public Server, public proto::Controller::Service {
 public:
  ServerImpl(const ServerOptions& options, ClusterSecret secret)
      : options_(options),
        secret_(std::move(secret)),
        admission_(options.admission),
        scheduler_({.consistent_order = options.consistent_order}) {}

  ~ServerImpl() override {
    Shutdown();
    // Sessions were cancelled by Shutdown(); give in-flight unary calls a
    // moment, then cancel whatever is left.
    if (grpc_server_)
      grpc_server_->Shutdown(
          absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    if (liveness_.joinable()) liveness_.join();
  }

  absl::Status Init() {
    {
      absl::MutexLock lock(&mu_);
      state_.SetTenants(options_.tenants);
    }
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentialsFor(options_.tls_cert_file, options_.tls_key_file);
    if (!credentials.ok()) return credentials.status();
    anonymous_clients_ = options_.anonymous_clients &&
                         IsLoopbackHost(HostOfAddress(options_.listen_address));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options_.listen_address, *credentials, &port);
    builder.SetMaxReceiveMessageSize(256 << 20);
    builder.SetMaxSendMessageSize(256 << 20);
    builder.RegisterService(this);
    grpc_server_ = builder.BuildAndStart();
    if (!grpc_server_ || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options_.listen_address));
    }
    std::string host =
        options_.listen_address.substr(0, options_.listen_address.rfind(':'));
    address_ = absl::StrCat(host, ":", port);
    advertised_ = AdvertisedAddress(options_.advertise_address, address_);
    liveness_ = std::thread([this] { LivenessLoop(); });
    SPDLOG_INFO(
        "listening on {}{} ({}; client sessions without a tenant "
        "credential {})",
        address_,
        advertised_ == address_ ? ""
                                : absl::StrCat(", advertised as ", advertised_),
        options_.tls_cert_file.empty() ? "plain text" : "TLS",
        anonymous_clients_ ? "open as tenant \"default\"" : "are refused");
    return absl::OkStatus();
  }

  std::string address() const override { return address_; }
  std::string advertised_address() const override { return advertised_; }
  const ClusterSecret& secret() const override { return secret_; }

  void Wait() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&shutdown_));
  }

  void Shutdown() override {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    {
      absl::MutexLock admission(&admission_mu_);
      stopping_ = true;
      admission_room_.SignalAll();
    }
    for (auto& [id, ctx] : worker_contexts_) ctx->TryCancel();
    for (auto& [id, ctx] : client_contexts_) ctx->TryCancel();
  }

  // When a worker was last heard from (heard_, below).
  struct LastHeard {
    absl::Time at;
    bool handling = false;  // its reader is handling a message
  };

  void CheckLiveness() override {
    {
      absl::MutexLock lock(&mu_);
      AnswerSlicesLocked();  // slice requests past their deadline fail
    }
    // Read from the stamps alone: a check never waits on the state lock to
    // see who was heard, and a stamp never waits on it to be made.
    const absl::Time now = options_.clock->Now();
    std::vector<int64_t> late;
    {
      absl::MutexLock lock(&heard_mu_);
      for (const auto& [id, heard] : heard_) {
        if (SilentLocked(heard, now)) late.push_back(id);
      }
    }
    for (int64_t id : late) {
      WorkerDown(id,
                 absl::StrCat("worker ", id, " missed heartbeats for ",
                              absl::FormatDuration(options_.heartbeat_timeout)),
                 /*only_if_silent=*/true);
    }
  }

  // Worker `id` was heard from at `now` (by default, the time read under
  // heard_mu_: a check never reads the stamps between the two): registered,
  // or its reader read a message, which it handles now.
  void HeardFrom(int64_t id, absl::Time now = absl::InfinitePast()) {
    absl::Duration silent;
    bool was_heard;
    {
      absl::MutexLock lock(&heard_mu_);
      if (now == absl::InfinitePast()) now = options_.clock->Now();
      auto [it, fresh] = heard_.try_emplace(id);
      LastHeard& heard = it->second;
      was_heard = !fresh;
      silent = heard.handling ? absl::ZeroDuration() : now - heard.at;
      heard.at = now;
      heard.handling = was_heard;
    }
    // A near miss: a worker that was still alive, but late enough that the
    // deadline is worth a look (a starved or stalled host).
    if (was_heard && silent > options_.heartbeat_timeout / 2) {
      SPDLOG_WARN("worker {} was silent for {} (failure deadline {})", id,
                  absl::FormatDuration(silent),
                  absl::FormatDuration(options_.heartbeat_timeout));
    }
  }
  // Its reader handled the message: silence counts from when it was read
  // (no clock read here).
  void Handled(int64_t id) {
    absl::MutexLock lock(&heard_mu_);
    auto it = heard_.find(id);
    if (it != heard_.end()) it->second.handling = false;
  }
  // Silent for the deadline less one check period: declared down by this
  // check or the next, so within the deadline of its last message (and of
  // a hang, which came after it). Not while its reader handles a message:
  // what the server has not read yet is not the worker's silence.
  bool SilentLocked(const LastHeard& heard, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heard_mu_) {
    // (A check period as long as the deadline, as a test that checks by
    // hand sets, leaves the whole deadline: never a negative silence, which
    // found every worker not handling a message silent.)
    const absl::Duration period = LivenessCheckPeriod(options_);
    const absl::Duration silence = period < options_.heartbeat_timeout
                                       ? options_.heartbeat_timeout - period
                                       : options_.heartbeat_timeout;
    return !heard.handling && now - heard.at > silence;
  }
  bool Silent(int64_t id) {
    const absl::Time now = options_.clock->Now();
    absl::MutexLock lock(&heard_mu_);
    auto it = heard_.find(id);
    return it != heard_.end() && SilentLocked(it->second, now);
  }

  // ------------------------------------------------------------ workers
  grpc::Status WorkerSession(grpc::ServerContext* ctx,
                             WorkerStream* stream) override {
    proto::WorkerToServer first;
    if (!stream->Read(&first) || !first.has_register_()) {
      return grpc::Status(grpc::INVALID_ARGUMENT,
                          "the first message must register the worker");
    }
    // A worker of another release would misread the ops it is sent.
    if (absl::Status v = CheckProtocolVersion(
            "server", "worker", first.register_().protocol_version());
        !v.ok()) {
      SPDLOG_WARN("refused a worker registration from host {} (pid {}): {}",
                  first.register_().host_name(), first.register_().pid(),
                  std::string(v.message()));
      return grpc::Status(grpc::FAILED_PRECONDITION, std::string(v.message()));
    }
    // Only a process that holds the cluster secret may join: a worker
    // receives programs and pushed tensors of every client.
    const std::string& credential = first.register_().credential();
    if (!secret_.Verify(CredentialRole::kWorker, 0,
                        reinterpret_cast<const uint8_t*>(credential.data()),
                        credential.size())) {
      SPDLOG_WARN(
          "refused a worker registration from host {} (pid {}, peer {}): "
          "{} worker credential",
          first.register_().host_name(), first.register_().pid(), ctx->peer(),
          credential.empty() ? "no" : "a wrong");
      return grpc::Status(
          grpc::PERMISSION_DENIED,
          absl::StrCat("worker registration refused: ",
                       credential.empty()
                           ? "no worker credential"
                           : "the worker credential does not match",
                       " (start the worker with this cluster's secret: $",
                       kClusterSecretEnv, " or --secret-file)"));
    }
    first.mutable_register_()->clear_credential();  // not kept, not shown
    // A host that rejoins (its session ended on its side) while its old
    // registration still looks alive here: that one is declared down first,
    // so nothing waits on it and its pushes are fenced.
    const std::string rejoined = PreviousRegistration(first.register_());
    int64_t id;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) {
        // Too late to be cancelled by Shutdown(): refused instead.
        return grpc::Status(grpc::CANCELLED, "the server is shutting down");
      }
      control_bytes_in_ += first.ByteSizeLong();
      const absl::Time now = options_.clock->Now();
      WorkerRecord& w = state_.AddWorker(first.register_(), now);
      w.generation = ++generation_;
      id = w.id;
      // Heard from as it registered, before anything is sent to it.
      HeardFrom(id, now);
      // The first message also carries what the worker needs to know of
      // this session.
      proto::ServerToWorker hello;
      hello.set_protocol_version(kProtocolVersion);
      hello.set_generation(w.generation);
      hello.set_heartbeat_interval_ms(
          absl::ToInt64Milliseconds(HeartbeatInterval(options_)));
      hello.set_rejoined(rejoined);
      // One message, reused: the first carries the hello; clearing it
      // keeps its ops' shells, which the next write fills (no allocation
      // per op).
      auto queue = std::make_shared<WorkerQueue>(
          [stream, id,
           msg = std::move(hello)](std::vector<proto::WorkerOp>& ops) mutable {
            msg.set_worker_id(id);
            for (auto& op : ops) *msg.add_ops() = std::move(op);
            const bool written = stream->Write(msg);
            msg.Clear();
            return written;
          });
      // Tell the newcomer about everyone (itself included, so its first
      // message carries its id) and everyone about the newcomer.
      for (auto& [oid, other] : state_.workers()) {
        if (other.alive) queue->Push(PeerOp(other));
      }
      scheduler_.Broadcast(PeerOp(w));
      // A spare, or a host that rejoins, has every XLA program's
      // executables ahead, to take a place at once.
      for (proto::WorkerOp& load : state_.LoadsForStandby(id)) {
        queue->Push(std::move(load));
      }
      scheduler_.AddWorker(id, std::move(queue));
      {
        absl::MutexLock admission(&admission_mu_);
        admission_.AddWorker(id, first.register_().devices_size());
      }
      worker_contexts_[id] = ctx;
      AnswerSlicesLocked();  // slice requests that waited for its devices
      SPDLOG_INFO(
          "worker {} registered: host {}, {} device(s), pid {}, data plane "
          "{}, generation {}{}",
          id, first.register_().host_name(), first.register_().devices_size(),
          first.register_().pid(), first.register_().data_address(),
          w.generation, rejoined.empty() ? "" : "; it rejoins: " + rejoined);
    }
    proto::WorkerToServer msg;
    while (stream->Read(&msg)) {
      // Any message shows the worker alive: stamped as it is read, before
      // anything below waits for a lock (CheckLiveness).
      HeardFrom(id);
      if (msg.has_heartbeat()) {
        absl::MutexLock lock(&mu_);
        control_bytes_in_ += msg.ByteSizeLong();
        if (WorkerRecord* w = state_.FindWorker(id)) {
          w->stats = msg.heartbeat();
          w->last_heartbeat = options_.clock->Now();
          w->heartbeats++;
        }
      } else if (msg.has_transfer_failed()) {
        RelayTransferFailure(id, msg.transfer_failed());
      } else if (msg.has_calls_done()) {
        control_bytes_in_ += msg.ByteSizeLong();
        bool pending = false;
        {
          absl::MutexLock admission(&admission_mu_);
          admission_.Completed(id, msg.calls_done());
          for (uint64_t copy : msg.calls_done().copies_done()) {
            copies_arrived_.push_back(copy);
          }
          pending = CompletionsPendingLocked();
          // Nothing for the records (a call ends with its last worker's
          // report): the room it left is used now, under this one lock.
          if (!pending) AdmitLocked();
        }
        // Into the records (ApplyCompletionsLocked) if the state lock is
        // free; the releases they let go then ride with the calls that the
        // room they left admits (one write to each worker, not two). If a
        // client's batch is being routed, it applies them as it ends.
        // Admission never waits for the state lock.
        if (pending) {
          WorkerOps releases;
          bool applied = false;
          if (mu_.TryLock()) {
            ApplyCompletionsLocked(&releases);
            mu_.Unlock();
            applied = true;
          }
          bool wait_for_state = false;
          {
            absl::MutexLock admission(&admission_mu_);
            AdmitLocked(std::move(releases));
            wait_for_state =
                !applied && !routing_batch_ && CompletionsPendingLocked();
          }
          if (wait_for_state) {  // another holder of the state lock (rare)
            absl::MutexLock lock(&mu_);
            ApplyCompletionsLocked(&releases);
            if (!releases.empty()) scheduler_.Submit({std::move(releases)});
          }
        }
      }
      Handled(id);
    }
    WorkerDown(id, absl::StrCat("worker ", id,
                                " lost its connection to the "
                                "server (process exited or was killed)"));
    {
      absl::MutexLock lock(&heard_mu_);
      heard_.erase(id);
    }
    std::shared_ptr<WorkerQueue> queue;
    {
      absl::MutexLock lock(&mu_);
      queue = scheduler_.RemoveWorker(id);
      worker_contexts_.erase(id);
    }
    // The writer uses `stream`, which dies when this handler returns: stop
    // it here. A client session waiting for room may still hold the queue
    // (and destroy it later); it no longer writes.
    if (queue) queue->Stop();
    return grpc::Status::OK;
  }

  // ------------------------------------------------------------ clients
  grpc::Status ClientSession(grpc::ServerContext* ctx,
                             ClientStream* stream) override {
    proto::ClientToServer msg;
    if (!stream->Read(&msg)) return grpc::Status::OK;
    if (absl::Status v =
            CheckProtocolVersion("server", "client", msg.protocol_version());
        !v.ok()) {
      SPDLOG_WARN("refused client '{}' ({}): {}", msg.client_name(),
                  ctx->peer(), std::string(v.message()));
      return grpc::Status(grpc::FAILED_PRECONDITION, std::string(v.message()));
    }
    absl::StatusOr<std::string> tenant = AuthenticateTenant(msg);
    msg.clear_tenant_credential();  // verified; not kept, not shown
    if (!tenant.ok()) {
      SPDLOG_WARN("refused client '{}' ({}): {}", msg.client_name(),
                  ctx->peer(), std::string(tenant.status().message()));
      return grpc::Status(grpc::PERMISSION_DENIED,
                          std::string(tenant.status().message()));
    }
    uint64_t id;
    OutQueue<proto::ServerToClient>* out;
    {
      absl::MutexLock lock(&mu_);
      const ClientRecord& client = state_.AddClient(msg.client_name(), *tenant);
      id = client.id;
      {
        const TenantPolicy& policy = state_.PolicyOf(client);
        absl::MutexLock admission(&admission_mu_);
        admission_.AddClient(id, policy.weight, policy.max_calls_in_flight);
      }
      auto queue = std::make_unique<OutQueue<proto::ServerToClient>>(
          [stream, id](std::vector<proto::ServerToClient>& parts) {
            proto::ServerToClient merged;
            merged.set_client_id(id);
            for (auto& p : parts) merged.MergeFrom(p);
            merged.set_client_id(id);
            return stream->Write(merged);
          });
      out = queue.get();
      client_queues_[id] = std::move(queue);
      client_contexts_[id] = ctx;
      // The first message carries the client id and the session's
      // credential, which its data-plane connections prove to the workers.
      proto::ServerToClient hello;
      const Credential credential = secret_.Derive(CredentialRole::kClient, id);
      hello.set_credential(credential.data(), credential.size());
      hello.set_protocol_version(kProtocolVersion);
      out->Push(std::move(hello));
      SPDLOG_INFO("client {} connected: {} (tenant {})", id, msg.client_name(),
                  *tenant);
    }
    HandleClientBatch(ctx, id, msg, out);
    {
      // Each batch is parsed onto an arena and dropped with it once routed
      // (routing copies what it keeps): its ops are allocated by bumping a
      // pointer in a block this session reuses, and freed at once, not one
      // by one (a batch of chained calls is thousands of small messages).
      std::vector<char> block(kBatchArenaBlock);
      google::protobuf::ArenaOptions arena_options;
      arena_options.initial_block = block.data();
      arena_options.initial_block_size = block.size();
      arena_options.max_block_size = kBatchArenaBlock;
      google::protobuf::Arena arena(arena_options);
      while (true) {
        auto* batch =
            google::protobuf::Arena::CreateMessage<proto::ClientToServer>(
                &arena);
        if (!stream->Read(batch)) break;
        HandleClientBatch(ctx, id, *batch, out);
        arena.Reset();
      }
    }

    std::unique_ptr<OutQueue<proto::ServerToClient>> queue;
    {
      absl::MutexLock lock(&mu_);
      std::set<int64_t> touched = state_.RemoveClient(id);  // and its waits
      {
        // Its queued calls are dropped before the workers hear it is gone,
        // and its calls in flight no longer hold their windows.
        absl::MutexLock admission(&admission_mu_);
        const int64_t dropped = admission_.RemoveClient(id);
        if (dropped > 0) {
          SPDLOG_INFO("client {}: dropped {} unit(s) of work it had queued", id,
                      dropped);
        }
        AdmitLocked();
      }
      proto::WorkerOp gone;
      gone.mutable_client_gone()->set_client_id(id);
      for (int64_t w : touched) scheduler_.Send(w, gone);
      // Hosts its slices leave idle stand by for the other clients' work.
      WorkerOps loads;
      state_.LoadStandbys(&loads);
      for (auto& [w, ops] : loads) {
        for (proto::WorkerOp& load : ops) scheduler_.Send(w, std::move(load));
      }
      queue = std::move(client_queues_[id]);
      client_queues_.erase(id);
      client_contexts_.erase(id);
      SPDLOG_INFO("client {} disconnected; its slices and buffers are freed",
                  id);
      AnswerSlicesLocked();
    }
    queue.reset();  // the only owner: stops and joins the writer
    return grpc::Status::OK;
  }

  // The block each client session parses its batches into (larger ones
  // take more blocks of this size, freed after the batch).
  static constexpr size_t kBatchArenaBlock = 256 << 10;

  // The tenant a session's first message proves (common/credentials.h: a
  // tenant credential over its name, compared in constant time), or
  // "default" for an anonymous session where anonymous_clients_ allows it.
  // PermissionDenied saying what to set otherwise.
  absl::StatusOr<std::string> AuthenticateTenant(
      const proto::ClientToServer& first) const {
    const std::string& credential = first.tenant_credential();
    if (first.tenant().empty() && credential.empty()) {
      if (anonymous_clients_) return std::string(kDefaultTenant);
      return absl::PermissionDeniedError(
          "this server admits tenant sessions only: set $PLEXUS_TENANT and "
          "$PLEXUS_TENANT_TOKEN (the operator "
          "prints a token with `plexus token --tenant NAME`), or give the "
          "client the cluster secret");
    }
    const std::string tenant =
        first.tenant().empty() ? std::string(kDefaultTenant) : first.tenant();
    if (absl::Status s = CheckTenantName(tenant); !s.ok()) {
      return absl::PermissionDeniedError(
          absl::StrCat("tenant '", tenant, "': ", s.message()));
    }
    if (!secret_.Verify(CredentialRole::kTenant, tenant,
                        reinterpret_cast<const uint8_t*>(credential.data()),
                        credential.size())) {
      return absl::PermissionDeniedError(absl::StrCat(
          credential.empty() ? "no tenant token for tenant '"
                             : "the tenant token does not match tenant '",
          tenant,
          "' on this cluster (the operator prints one with `plexus token "
          "--tenant ",
          tenant, "`)"));
    }
    return tenant;
  }

  void HandleClientBatch(grpc::ServerContext* ctx, uint64_t id,
                         const proto::ClientToServer& msg,
                         OutQueue<proto::ServerToClient>* out) {
    WaitForRoomInQueue(ctx, id);
    absl::ReleasableMutexLock lock(&mu_);
    {
      // Completions reported from here on wait for the end of the batch.
      absl::MutexLock admission(&admission_mu_);
      routing_batch_ = true;
    }
    control_bytes_in_ += msg.ByteSizeLong();
    // One unit per op, so the scheduler can keep (or, in the test-only
    // bypass, break) the order of calls across islands.
    std::vector<WorkerOps> units;
    std::vector<uint64_t> seqs;  // each unit's call record, if a call
    proto::ServerToClient reply;
    bool last_was_release = false;
    bool released_slice = false;  // room under max_devices for waiters
    for (const proto::ClientOp& op : msg.ops()) {
      // Releases commute with each other: consecutive ones share a unit, so
      // each worker gets them as one op.
      const bool release = op.op_case() == proto::ClientOp::kRelease;
      if (!(release && last_was_release)) {
        units.emplace_back();
        seqs.push_back(0);
      }
      last_was_release = release;
      WorkerOps& ops = units.back();
      switch (op.op_case()) {
        case proto::ClientOp::kSliceRequest: {
          // One that cannot be met yet waits in state_: its reply comes
          // later (AnswerSlicesLocked), and the rest of the batch goes on.
          auto slice = state_.RequestSlice(id, op.slice_request(),
                                           options_.clock->Now());
          if (slice.has_value()) {
            AddSliceReply(id, op.slice_request().request_id(), *slice, &reply);
          } else {
            SPDLOG_INFO("client {}: slice request {} waits: {}", id,
                        op.slice_request().request_id(),
                        state_.WaitingFor(state_.pending_slices().size() - 1));
          }
          break;
        }
        case proto::ClientOp::kSliceRelease:
          if (state_.ReleaseSlice(id, op.slice_release()).ok()) {
            released_slice = true;
            state_.LoadStandbys(&ops);  // hosts it leaves idle stand by
          }
          break;
        case proto::ClientOp::kProgram: {
          absl::Status s = state_.RegisterProgram(id, op.program(), &ops);
          if (!s.ok()) {
            proto::CallError* e = reply.add_errors();
            *e->mutable_status() = StatusToProto(s);
          }
          break;
        }
        case proto::ClientOp::kCall: {
          absl::Status s = state_.RouteCall(id, op.call(), &ops, &seqs.back());
          if (!s.ok()) {
            proto::CallError* e = reply.add_errors();
            e->set_call_id(op.call().call_id());
            for (uint64_t o : op.call().output_ids()) e->add_output_ids(o);
            *e->mutable_status() = StatusToProto(s);
            // The client may already be waiting on a worker for these
            // outputs: tell the workers too.
            state_.FailCallOutputs(id, op.call(), s, &ops);
          }
          break;
        }
        case proto::ClientOp::kPut: {
          proto::Recovery reput;
          absl::Status s = state_.RoutePut(id, op.put(), &ops, &reput);
          if (reput.reput_ids_size() > 0) {
            *reply.add_recoveries() = std::move(reput);
          }
          if (!s.ok()) {
            proto::CallError* e = reply.add_errors();
            e->add_output_ids(op.put().buffer_id());
            *e->mutable_status() = StatusToProto(s);
          }
          break;
        }
        case proto::ClientOp::kRelease:
          state_.RouteRelease(id, op.release(), &ops);
          break;
        case proto::ClientOp::kSnapshot:
          state_.RouteSnapshot(id, op.snapshot(), &ops);
          break;
        case proto::ClientOp::kStats:
          if (ClientRecord* c = state_.FindClient(id)) c->stats = op.stats();
          break;
        default:
          break;
      }
    }
    if (reply.slices_size() || reply.errors_size() || reply.recoveries_size()) {
      out->Push(std::move(reply));
    }
    // Completions reported while it was routed; their releases go with it.
    WorkerOps released;
    ApplyCompletionsLocked(&released, /*batch_ends=*/true);
    TellReleasedPutsLocked();
    if (released_slice) AnswerSlicesLocked();
    // Into the client's queue at admission, still under the state lock (so
    // nothing of a client that is being removed gets in); admitted to the
    // workers under the admission lock alone.
    absl::MutexLock admission(&admission_mu_);
    // Units that only say what will exist or what failed (puts' Declares,
    // program loads, refused calls' failures) use no device and need
    // nothing that comes before them: they go to the workers now, ahead of
    // the client's calls still waiting, so a put's bytes never wait at a
    // worker for a Declare held behind those calls. Calls and releases (a
    // release must follow the calls that read its buffer) keep the
    // client's order at admission.
    std::vector<WorkerOps> express;
    for (size_t u = 0; u < units.size(); ++u) {
      AdmissionUnit unit = MakeAdmissionUnit(std::move(units[u]), seqs[u]);
      // Releases and snapshots' copies follow the calls before them.
      if (!unit.is_call() && !Ordered(unit.ops)) {
        if (!unit.ops.empty()) express.push_back(std::move(unit.ops));
        continue;
      }
      admission_.Enqueue(id, std::move(unit));
    }
    if (!express.empty()) scheduler_.Submit(std::move(express));
    lock.Release();
    // The releases that completions let go need no order but that of the
    // calls before them, which are done: they go with the calls admitted
    // now (one write to each worker, not two), as in WorkerSession.
    AdmitLocked(std::move(released));
  }

  // Whether `ops` (not a call's) must keep the client's order at
  // admission: releases and snapshots' copies follow the calls before them.
  static bool Ordered(const WorkerOps& ops) {
    for (const auto& [w, list] : ops) {
      for (const proto::WorkerOp& op : list) {
        if (op.has_release() || op.has_transfer()) return true;
      }
    }
    return false;
  }

  // Back-pressure on one client: its stream is not read while it has a
  // full quota of calls waiting at the server (others go on). Ends when
  // its calls are admitted, or it leaves, or the server shuts down.
  void WaitForRoomInQueue(grpc::ServerContext* ctx, uint64_t id) {
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

  // Calls done and snapshot copies arrived (CallsDone) into the records;
  // the releases held back for them, which go to the workers now, are
  // appended to `releases`. Those reported while a client's batch is
  // routed wait for its end (`batch_ends`): the worker sessions need not
  // wait for the state lock, and the records are mostly written by the
  // thread that routes.
  void ApplyCompletionsLocked(WorkerOps* releases, bool batch_ends = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    {
      absl::MutexLock admission(&admission_mu_);
      if (batch_ends) routing_batch_ = false;
      admission_.TakeDoneCalls(&done_calls_);
      copies_to_apply_.clear();
      copies_to_apply_.swap(copies_arrived_);
    }
    if (done_calls_.empty() && copies_to_apply_.empty()) return;
    for (const auto& [seq, failed] : done_calls_) {
      state_.CallDone(seq, failed, releases);
    }
    for (uint64_t copy : copies_to_apply_) state_.CopyArrived(copy, releases);
    TellReleasedPutsLocked();
  }
  bool CompletionsPendingLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_) {
    return admission_.has_done_calls() || !copies_arrived_.empty();
  }

  // Hands the gang scheduler every unit admission lets go now, as one
  // batch in the order admission chose, after `first` (ops that need no
  // admission) if any.
  void AdmitLocked(WorkerOps first = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_) {
    std::vector<WorkerOps> batch;
    if (!first.empty()) batch.push_back(std::move(first));
    const size_t admitted_from = batch.size();
    uint64_t client;
    AdmissionUnit unit;
    while (admission_.Next(&client, &unit))
      batch.push_back(std::move(unit.ops));
    if (batch.empty()) return;
    const bool admitted = batch.size() > admitted_from;
    scheduler_.Submit(std::move(batch));
    if (admitted) admission_room_.SignalAll();
  }

  // ------------------------------------------------------------ status
  absl::Status WaitForWorkers(int n, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int alive = 0;
      for (const auto& [id, w] : state_.workers()) alive += w.alive;
      return shutdown_ || alive >= n;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("fewer than ", n, " workers registered within ",
                       absl::FormatDuration(timeout)));
    }
    return shutdown_ ? absl::CancelledError("server shut down")
                     : absl::OkStatus();
  }

  grpc::Status GetStatus(grpc::ServerContext*,
                         const proto::StatusRequest* request,
                         proto::ClusterStatus* status) override {
    absl::MutexLock lock(&mu_);
    if (request->fresh_timeout_ms() > 0) {
      // Wait for one heartbeat from every live worker (heartbeats are
      // recorded under mu_, so Await re-checks as they arrive).
      std::map<int64_t, int64_t> seen;
      for (const auto& [id, w] : state_.workers()) {
        if (w.alive) seen[id] = w.heartbeats;
      }
      auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (const auto& [id, count] : seen) {
          const WorkerRecord* w = state_.FindWorker(id);
          if (w != nullptr && w->alive && w->heartbeats == count) return false;
        }
        return true;
      };
      mu_.AwaitWithTimeout(absl::Condition(&fresh),
                           absl::Milliseconds(request->fresh_timeout_ms()));
    }
    status->set_address(advertised_);
    status->set_calls_routed(state_.calls_routed());
    status->set_epoch(scheduler_.epoch());
    status->set_scheduler(options_.consistent_order ? "gang/fair"
                                                    : "none (test only)");
    status->set_control_bytes_in(control_bytes_in_);
    status->set_data_bytes(0);  // the server has no data path
    for (const auto& [id, w] : state_.workers()) {
      auto* ws = status->add_workers();
      ws->set_worker_id(id);
      ws->set_host_name(w.info.host_name());
      ws->set_pid(w.info.pid());
      ws->set_alive(w.alive);
      ws->set_down_reason(w.down_reason);
      ws->set_data_address(w.info.data_address());
      ws->set_generation(w.generation);
      ws->set_spare(w.info.spare());
      *ws->mutable_devices() = w.info.devices();
      *ws->mutable_stats() = w.stats;
    }
    for (const auto& [id, c] : state_.clients()) {
      auto* cs = status->add_clients();
      cs->set_client_id(id);
      cs->set_name(c.name);
      cs->set_tenant(c.tenant);
      cs->set_slices(static_cast<int32_t>(c.slices.size()));
      *cs->mutable_stats() = c.stats;
      cs->set_live_bytes(c.live_bytes);
      absl::MutexLock admission(&admission_mu_);
      if (const Admission::ClientView* v = admission_.Find(id)) {
        cs->set_weight(v->weight);
        cs->set_calls_pending(v->pending_calls);
        cs->set_calls_in_flight(v->in_flight);
        cs->set_calls_admitted(v->admitted);
        cs->set_device_micros(v->device_micros);
      }
    }
    for (const auto& [id, s] : state_.slices()) {
      auto* ss = status->add_slices();
      ss->set_slice_id(id);
      ss->set_client_id(s.client_id);
      *ss->mutable_devices() = state_.DescribeSlice(s).devices();
      ss->set_generation(s.generation);
      ss->set_broken(s.broken);
    }
    *status->mutable_recovery() = state_.recovery_counters();
    status->mutable_recovery()->set_snapshot_recopies_pending(
        state_.SnapshotRecopiesPending());
    status->mutable_recovery()->set_snapshots_incomplete(
        state_.SnapshotsIncomplete());
    status->mutable_recovery()->set_call_records(
        static_cast<int64_t>(state_.records().calls().size()));
    status->mutable_recovery()->set_buffer_records(
        static_cast<int64_t>(state_.records().buffers().size()));
    const absl::Time now = options_.clock->Now();
    for (size_t i = 0; i < state_.pending_slices().size(); ++i) {
      const PendingSlice& p = state_.pending_slices()[i];
      auto* ps = status->add_pending_slices();
      ps->set_client_id(p.client_id);
      ps->set_request_id(p.request.request_id());
      ps->set_num_devices(p.request.num_devices());
      ps->set_waiting_for(state_.WaitingFor(i));
      ps->set_waited_ms(absl::ToInt64Milliseconds(now - p.since));
      ps->set_left_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(p.deadline - now)));
    }
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext* ctx,
                        const proto::ShutdownRequest* request,
                        proto::ShutdownReply*) override {
    const std::string& credential = request->credential();
    if (!secret_.Verify(CredentialRole::kAdmin, 0,
                        reinterpret_cast<const uint8_t*>(credential.data()),
                        credential.size())) {
      SPDLOG_WARN("refused a shutdown request from {}: {} admin credential",
                  ctx->peer(), credential.empty() ? "no" : "a wrong");
      return grpc::Status(
          grpc::PERMISSION_DENIED,
          credential.empty()
              ? "shutdown refused: the request carries no admin credential"
              : "shutdown refused: the admin credential does not match this "
                "cluster's secret");
    }
    SPDLOG_INFO("shutdown requested by {}", ctx->peer());
    // On this thread: Shutdown() only marks the server down and cancels the
    // sessions (it never waits on an RPC), and the owner's Wait() returns
    // once it has. The reply therefore means the server is going down, and
    // no thread is left holding `this` when the owner destroys the server
    // (its destructor waits for this handler to return).
    Shutdown();
    return grpc::Status::OK;
  }

 private:
  static proto::WorkerOp PeerOp(const WorkerRecord& w) {
    proto::WorkerOp op;
    auto* p = op.mutable_peer();
    p->set_worker_id(w.id);
    p->set_machine_id(w.info.machine_id());
    p->set_data_address(w.info.data_address());
    p->set_unix_path(w.info.unix_path());
    p->set_generation(w.generation);
    return op;
  }

  // What became of the registration a rejoining worker names (empty for a
  // first registration). One this server still counts alive is declared
  // down now: the host left it behind.
  std::string PreviousRegistration(const proto::RegisterWorker& reg) {
    if (reg.previous_worker_id() == 0) return "";
    const std::string was =
        absl::StrCat("worker ", reg.previous_worker_id(), " (generation ",
                     reg.previous_generation(), ")");
    bool alive = false;
    {
      absl::MutexLock lock(&mu_);
      const WorkerRecord* old = state_.FindWorker(reg.previous_worker_id());
      if (old == nullptr || old->generation != reg.previous_generation()) {
        return absl::StrCat(was,
                            " is not one of this server's registrations (the "
                            "server restarted)");
      }
      if (!old->alive) {
        return absl::StrCat(was, " was declared down: ", old->down_reason);
      }
      alive = true;
    }
    if (alive) {
      WorkerDown(reg.previous_worker_id(),
                 absl::StrCat("worker ", reg.previous_worker_id(),
                              " lost its session and rejoined as a fresh "
                              "host"));
    }
    return absl::StrCat(was, " was declared down as it rejoined");
  }

  static void AddSliceReply(uint64_t client_id, uint64_t request_id,
                            const absl::StatusOr<proto::SliceInfo>& slice,
                            proto::ServerToClient* reply) {
    proto::SliceReply* r = reply->add_slices();
    r->set_request_id(request_id);
    if (slice.ok()) {
      *r->mutable_slice() = *slice;
      SPDLOG_INFO("client {}: slice {} of {} device(s)", client_id,
                  slice->slice_id(), slice->devices_size());
    } else {
      *r->mutable_error() = StatusToProto(slice.status());
    }
  }

  // Answers the waiting slice requests that can be met now or whose
  // deadline has passed, each on its client's stream.
  void AnswerSlicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (SliceAnswer& a : state_.ServePendingSlices(options_.clock->Now())) {
      auto it = client_queues_.find(a.client_id);
      if (it == client_queues_.end()) continue;
      if (!a.slice.ok()) {
        SPDLOG_INFO("client {}: slice request {} refused: {}", a.client_id,
                    a.request_id, std::string(a.slice.status().message()));
      }
      proto::ServerToClient reply;
      AddSliceReply(a.client_id, a.request_id, a.slice, &reply);
      it->second->Push(std::move(reply));
    }
  }

  // Worker `from` could not push a shard to the destination's data plane:
  // the destination fails that entry, so its consumers hear why instead of
  // waiting for bytes that will not come.
  void RelayTransferFailure(int64_t from, const proto::TransferFailed& failed) {
    absl::MutexLock lock(&mu_);
    control_bytes_in_ += failed.ByteSizeLong();
    SPDLOG_WARN("worker {}: {}", from, failed.status().message());
    const WorkerRecord* dst = state_.FindWorker(failed.dst_worker_id());
    if (dst == nullptr || !dst->alive) return;  // PeerDown said it all
    proto::WorkerOp op;
    *op.mutable_transfer_failed() = failed;
    scheduler_.Send(failed.dst_worker_id(), std::move(op));
  }

  // `only_if_silent`: a worker that missed heartbeats, unless a message of
  // it was read while this waited for the state lock.
  void WorkerDown(int64_t id, const std::string& reason,
                  bool only_if_silent = false) {
    absl::MutexLock lock(&mu_);
    WorkerRecord* w = state_.FindWorker(id);
    if (w == nullptr || !w->alive) return;
    if (only_if_silent && !Silent(id)) return;
    // What is known done counts as done: it need not run again.
    {
      WorkerOps releases;
      ApplyCompletionsLocked(&releases);
      if (!releases.empty()) scheduler_.Submit({std::move(releases)});
    }
    std::string message = absl::StrCat(reason, " [host ", w->info.host_name(),
                                       ", pid ", w->info.pid(), "]");
    if (shutdown_) {
      SPDLOG_INFO("{}", message);  // expected: the cluster is going down
    } else {
      SPDLOG_WARN("{}", message);
    }
    const WorkerLoss loss = state_.LoseWorker(id, message);
    const std::set<uint64_t>& clients = loss.clients;
    // Clients with a slice remapped onto the spare: their work recovers
    // (ClusterState::RecoverClient), including what waits at admission.
    std::map<uint64_t, std::vector<TakenWork>> recovering;
    for (uint64_t c : clients) {
      for (uint64_t sid : loss.remapped) {
        if (state_.slices().at(sid).client_id == c) recovering[c];
      }
    }
    {
      absl::MutexLock admission(&admission_mu_);
      admission_.RemoveWorker(id);
      for (auto& [c, taken] : recovering) {
        for (AdmissionUnit& unit : admission_.TakePending(c)) {
          TakenWork& t = taken.emplace_back();
          t.call_seq = unit.call_seq;
          for (auto& [w, list] : unit.ops) {
            for (const proto::WorkerOp& op : list) {
              if (op.has_load()) {
                t.unsent_loads.emplace_back(w, op.load().program_id());
              }
            }
          }
          if (unit.call_seq != 0) continue;
          for (auto& [w, list] : unit.ops) {
            for (const proto::WorkerOp& op : list) {
              if (!op.has_release()) continue;
              for (uint64_t b : op.release().buffer_ids()) {
                if (std::find(t.release_ids.begin(), t.release_ids.end(), b) ==
                    t.release_ids.end()) {
                  t.release_ids.push_back(b);
                }
              }
            }
          }
          // Ops other than releases (failures of refused calls) stay.
          for (auto& [w, list] : unit.ops) {
            for (proto::WorkerOp& op : list) {
              if (!op.has_release()) t.ops[w].push_back(std::move(op));
            }
          }
        }
      }
      // Calls still waiting that need it fail now, in their place, rather
      // than after the calls in front of them have run.
      const int64_t failed =
          admission_.FailCallsOn(id, absl::UnavailableError(message));
      if (failed > 0) {
        SPDLOG_INFO("failed {} waiting call(s) that needed worker {}", failed,
                    id);
      }
      AdmitLocked();
    }
    const proto::Status lost = StatusToProto(absl::UnavailableError(message));
    proto::WorkerOp down;
    down.mutable_peer_down()->set_worker_id(id);
    down.mutable_peer_down()->set_generation(w->generation);
    *down.mutable_peer_down()->mutable_status() = lost;
    scheduler_.Broadcast(down, /*except=*/id);
    auto ctx = worker_contexts_.find(id);
    if (ctx != worker_contexts_.end()) ctx->second->TryCancel();
    if (loss.spare != 0) {
      SPDLOG_INFO("worker {}'s {} slice(s) remapped onto spare worker {}", id,
                  loss.remapped.size(), loss.spare);
    }
    for (uint64_t c : clients) {
      proto::ServerToClient note;
      auto* wd = note.add_workers_down();
      wd->set_worker_id(id);
      *wd->mutable_status() = lost;
      auto r = recovering.find(c);
      if (r != recovering.end()) {
        ClientRecovery rec =
            state_.RecoverClient(c, loss, std::move(r->second));
        SPDLOG_INFO(
            "client {}: {} unit(s) of work routed again, {} buffer(s) under "
            "new ids, {} lost",
            c, rec.work.size(), rec.note.new_ids_size(),
            rec.note.lost_ids_size());
        {
          absl::MutexLock admission(&admission_mu_);
          for (RoutedWork& w : rec.work) {
            admission_.Enqueue(c,
                               MakeAdmissionUnit(std::move(w.ops), w.call_seq));
          }
          AdmitLocked();
        }
        *note.add_recoveries() = std::move(rec.note);
      }
      auto it = client_queues_.find(c);
      if (it != client_queues_.end()) it->second->Push(std::move(note));
    }
    TellReleasedPutsLocked();
  }

  // Each client hears which of its puts are released for good: it drops
  // the data it kept to put them again after a loss.
  void TellReleasedPutsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [client, ids] : state_.TakeReleasedPuts()) {
      auto it = client_queues_.find(client);
      if (it == client_queues_.end()) continue;
      proto::ServerToClient note;
      for (uint64_t id : ids) note.add_released_puts(id);
      it->second->Push(std::move(note));
    }
  }

  void LivenessLoop() {
    // Real (monotonic) time, not the injected clock: what stalls is this
    // process, whatever a test's clock says.
    absl::Time last = absl::Now();
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&shutdown_),
                                 LivenessCheckPeriod(options_))) {
          return;
        }
      }
      const absl::Time now = absl::Now();
      if (ServerStalled(now - last, options_)) ExcuseSilence(now - last);
      last = now;
      CheckLiveness();
    }
  }
  // The server did not run for `stalled` (ServerStalled): no worker's
  // silence of that time counts. Each is deemed heard now, so a worker
  // that really died or hung meanwhile is declared down a deadline from
  // now (a dead one's stream break is seen at once, as ever).
  void ExcuseSilence(absl::Duration stalled) {
    const absl::Time now = options_.clock->Now();
    size_t excused = 0;
    {
      absl::MutexLock lock(&heard_mu_);
      for (auto& [id, heard] : heard_) {
        if (heard.at < now) {
          heard.at = now;
          ++excused;
        }
      }
    }
    SPDLOG_WARN(
        "the server did not run for {} (this process or its machine "
        "stalled); the silence of its {} worker(s) over that time is not "
        "theirs: each has a whole deadline ({}) from now",
        absl::FormatDuration(stalled), excused,
        absl::FormatDuration(options_.heartbeat_timeout));
  }

  const ServerOptions options_;
  const ClusterSecret secret_;
  std::string address_;
  std::string advertised_;  // what clients and status are told
  // Whether a session without a tenant credential opens (as "default"):
  // options_.anonymous_clients on a loopback listen address. Set by Init.
  bool anonymous_clients_ = false;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::thread liveness_;

  // The scheduler lock: everything below, and the order in which ops enter
  // the worker queues (one consistent order across clients).
  absl::Mutex mu_;
  ClusterState state_ ABSL_GUARDED_BY(mu_);
  // Owns the worker queues and the order of everything put on them.
  // The admission lock: taken after mu_ when both are held, never before.
  absl::Mutex admission_mu_ ABSL_ACQUIRED_AFTER(mu_);
  Admission admission_ ABSL_GUARDED_BY(admission_mu_);
  absl::CondVar admission_room_;  // a client's queue at admission moved
  bool stopping_ ABSL_GUARDED_BY(admission_mu_) = false;
  // Completions not yet in the records (ApplyCompletionsLocked): calls
  // done wait in admission_, snapshot copies arrived here; and whether a
  // client's batch is being routed (it applies them as it ends).
  std::vector<uint64_t> copies_arrived_ ABSL_GUARDED_BY(admission_mu_);
  bool routing_batch_ ABSL_GUARDED_BY(admission_mu_) = false;
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
  GangScheduler scheduler_;
  std::map<int64_t, grpc::ServerContext*> worker_contexts_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<OutQueue<proto::ServerToClient>>>
      client_queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, grpc::ServerContext*> client_contexts_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> control_bytes_in_{0};
  // The generation the last registration was given; each takes the next.
  // It starts at the wall clock in microseconds, so a restarted server's
  // registrations are newer than its predecessor's.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) =
      static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::string AdvertisedAddress(const std::string& advertise,
                              const std::string& bound) {
  if (advertise.empty()) return bound;
  const bool bracketed = advertise.front() == '[';
  const size_t colons = std::count(advertise.begin(), advertise.end(), ':');
  const bool has_port =
      bracketed ? advertise.find("]:") != std::string::npos : colons == 1;
  if (has_port) return advertise;
  const std::string port = bound.substr(bound.rfind(':') + 1);
  // A bare IPv6 address needs its brackets before a port.
  if (!bracketed && colons > 1) return absl::StrCat("[", advertise, "]:", port);
  return absl::StrCat(advertise, ":", port);
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  absl::StatusOr<ClusterSecret> given_or_drawn =
      ClusterSecret::GivenOrGenerate(options.secret);
  if (!given_or_drawn.ok()) return given_or_drawn.status();
  auto server = std::make_unique<ServerImpl>(options, *given_or_drawn);
  absl::Status s = server->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace plexus
