// ServerImpl: construction, Init, Wait and Shutdown, the client side and
// status; Server::Start. The worker side is in server_workers.cc
// (internal/server_impl.h).
#include "plexus/server/server.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "plexus/common/address.h"
#include "plexus/common/logging.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/tls.h"
#include "plexus/server/internal/server_impl.h"

namespace plexus {

ServerImpl::ServerImpl(const ServerOptions& options, ClusterSecret secret)
    : options_(options),
      secret_(std::move(secret)),
      admission_(options.admission),
      scheduler_({.consistent_order = options.consistent_order}) {}

ServerImpl::~ServerImpl() {
  Shutdown();
  // Sessions were cancelled by Shutdown(); give in-flight unary calls a
  // moment, then cancel whatever is left.
  if (grpc_server_)
    grpc_server_->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
  if (liveness_.joinable()) liveness_.join();
}

absl::Status ServerImpl::Init() {
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

void ServerImpl::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shutdown_));
}

void ServerImpl::Shutdown() {
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

grpc::Status ServerImpl::ClientSession(grpc::ServerContext* ctx,
                                       ClientStream* stream) {
  proto::ClientToServer msg;
  if (!stream->Read(&msg)) return grpc::Status::OK;
  if (absl::Status v =
          CheckProtocolVersion("server", "client", msg.protocol_version());
      !v.ok()) {
    SPDLOG_WARN("refused client '{}' ({}): {}", msg.client_name(), ctx->peer(),
                std::string(v.message()));
    return grpc::Status(grpc::FAILED_PRECONDITION, std::string(v.message()));
  }
  absl::StatusOr<std::string> tenant = AuthenticateTenant(msg);
  msg.clear_tenant_credential();  // verified; not kept, not shown
  if (!tenant.ok()) {
    SPDLOG_WARN("refused client '{}' ({}): {}", msg.client_name(), ctx->peer(),
                std::string(tenant.status().message()));
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
          google::protobuf::Arena::CreateMessage<proto::ClientToServer>(&arena);
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
    SPDLOG_INFO("client {} disconnected; its slices and buffers are freed", id);
    AnswerSlicesLocked();
  }
  queue.reset();  // the only owner: stops and joins the writer
  return grpc::Status::OK;
}

absl::StatusOr<std::string> ServerImpl::AuthenticateTenant(
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

void ServerImpl::HandleClientBatch(grpc::ServerContext* ctx, uint64_t id,
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
        auto slice =
            state_.RequestSlice(id, op.slice_request(), options_.clock->Now());
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

void ServerImpl::AddSliceReply(uint64_t client_id, uint64_t request_id,
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

void ServerImpl::AnswerSlicesLocked() {
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

absl::Status ServerImpl::WaitForWorkers(int n, absl::Duration timeout) {
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

grpc::Status ServerImpl::GetStatus(grpc::ServerContext*,
                                   const proto::StatusRequest* request,
                                   proto::ClusterStatus* status) {
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

grpc::Status ServerImpl::Shutdown(grpc::ServerContext* ctx,
                                  const proto::ShutdownRequest* request,
                                  proto::ShutdownReply*) {
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
