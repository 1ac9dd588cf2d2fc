// ServerImpl: the client side — a client's session (its tenant, then its
// batches routed and admitted) and the answers to its slice requests.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "plexus/common/logging.h"
#include "plexus/common/names.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/server/service/internal/server_impl.h"

namespace plexus {

grpc::Status ServerImpl::ClientSession(grpc::ServerContext* ctx,
                                       ClientStream* stream) {
  proto::ClientToServer msg;
  if (!stream->Read(&msg)) return grpc::Status::OK;
  std::string tenant;
  if (grpc::Status refused = CheckClientHello(ctx, msg, &tenant);
      !refused.ok()) {
    return refused;
  }
  uint64_t id;
  OutQueue<proto::ServerToClient>* out;
  uint64_t ops_generation = 0;
  if (grpc::Status s =
          OpenClient(ctx, stream, msg, tenant, &id, &out, &ops_generation);
      !s.ok()) {
    return s;
  }
  {
    WriterPool::InlineScope inline_write(&worker_writers_);
    HandleClientBatch(ctx, id, msg, out);
  }
  ReadClientBatches(ctx, stream, id, out, ops_generation);
  if (ops_generation != 0) {
    // No frame of the session is applied after this (a shutdown does not
    // wait for the ones on their way).
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = shutdown_;
    }
    client_ops_->Close(ops_generation,
                       stopping ? absl::ZeroDuration() : kClientFramesDrain,
                       [ctx] { ctx->TryCancel(); });
  }
  EndClientSession(id);
  return grpc::Status::OK;
}

grpc::Status ServerImpl::CheckClientHello(grpc::ServerContext* ctx,
                                          proto::ClientToServer& msg,
                                          std::string* tenant_out) const {
  if (absl::Status v =
          CheckProtocolVersion("server", "client", msg.protocol_version());
      !v.ok()) {
    SPDLOG_WARN("refused client '{}' ({}): {}", Abbreviated(msg.client_name()),
                ctx->peer(), std::string(v.message()));
    return grpc::Status(grpc::FAILED_PRECONDITION, std::string(v.message()));
  }
  if (absl::Status name = CheckName("client name", msg.client_name());
      !name.ok()) {
    SPDLOG_WARN("refused client ({}): {}", ctx->peer(),
                std::string(name.message()));
    return grpc::Status(grpc::INVALID_ARGUMENT, std::string(name.message()));
  }
  absl::StatusOr<std::string> tenant = AuthenticateTenant(msg);
  msg.clear_tenant_credential();  // verified; not kept, not shown
  if (!tenant.ok()) {
    SPDLOG_WARN("refused client '{}' ({}): {}", msg.client_name(), ctx->peer(),
                std::string(tenant.status().message()));
    return grpc::Status(grpc::PERMISSION_DENIED,
                        std::string(tenant.status().message()));
  }
  *tenant_out = *std::move(tenant);
  return grpc::Status::OK;
}

grpc::Status ServerImpl::OpenClient(grpc::ServerContext* ctx,
                                    ClientStream* stream,
                                    const proto::ClientToServer& msg,
                                    const std::string& tenant, uint64_t* id_out,
                                    OutQueue<proto::ServerToClient>** out_out,
                                    uint64_t* ops_generation_out) {
  absl::MutexLock lock(&mu_);
  if (absl::Status left = state_.CheckClientIdsLeft(); !left.ok()) {
    SPDLOG_ERROR("refused client '{}' ({}): {}", msg.client_name(), ctx->peer(),
                 std::string(left.message()));
    return grpc::Status(grpc::RESOURCE_EXHAUSTED, std::string(left.message()));
  }
  // A session of the run before a restart comes back under its id, with
  // its slices and programs; any other request opens a new one.
  bool resumed = false;
  if (msg.resume_client_id() != 0 &&
      state_.FindClient(msg.resume_client_id())) {
    absl::Status r = ResumeSessionLocked(msg, tenant, msg.resume_client_id());
    if (r.ok()) {
      resumed = true;
    } else {
      SPDLOG_WARN("client '{}' ({}): not resumed, a new session opens: {}",
                  msg.client_name(), ctx->peer(), r.ToString());
    }
  }
  const ClientRecord& client =
      resumed ? *state_.FindClient(msg.resume_client_id())
              : state_.AddClient(msg.client_name(), tenant);
  const uint64_t id = client.id;
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
      },
      OutQueue<proto::ServerToClient>::kDefaultCapacity, "plexus-to-clnt");
  OutQueue<proto::ServerToClient>* out = queue.get();
  client_queues_[id] = std::move(queue);
  client_contexts_[id] = ctx;
  // The first message carries the client id and the session's
  // credential, which its data-plane connections prove to the workers.
  proto::ServerToClient hello;
  const Credential credential = secret_.Derive(CredentialRole::kClient, id);
  hello.set_credential(credential.data(), credential.size());
  hello.set_protocol_version(kProtocolVersion);
  hello.set_spare_wait_ms(absl::ToInt64Milliseconds(options_.spare_wait));
  hello.set_resumed(resumed);
  hello.set_journaled(journal_ != nullptr);
  if (client_ops_ != nullptr) {
    // Its batches may come as frames: each applied as the stream's reader
    // applies one (ReadClientBatches), on the connection's thread.
    const uint64_t generation = ++client_ops_generation_;
    client_ops_->Open(generation, id,
                      [this, ctx, id, out](proto::ClientToServer& batch) {
                        WriterPool::InlineScope inline_write(&worker_writers_);
                        HandleClientBatch(ctx, id, batch, out);
                        return absl::OkStatus();
                      });
    client_ops_generations_[id] = generation;
    hello.set_ops_unix_name(client_ops_->unix_name());
    hello.set_ops_tcp_port(client_ops_->tcp_port());
    hello.set_ops_generation(generation);
    *ops_generation_out = generation;
  }
  AwaitJournalLocked();  // the session, before its client hears its id
  out->Push(std::move(hello));
  SPDLOG_INFO("client {} {}: {} (tenant {})", id,
              resumed ? "resumed its session" : "connected", msg.client_name(),
              tenant);
  *id_out = id;
  *out_out = out;
  return grpc::Status::OK;
}

void ServerImpl::ReadClientBatches(grpc::ServerContext* ctx,
                                   ClientStream* stream, uint64_t id,
                                   OutQueue<proto::ServerToClient>* out,
                                   uint64_t ops_generation) {
  // Each batch is parsed onto an arena and dropped with it once routed
  // (internal/batch_arena.h).
  std::vector<char> block(kBatchArenaBlock);
  google::protobuf::Arena arena(BatchArenaOptions(block));
  bool on_frames = false;
  while (true) {
    auto* batch =
        google::protobuf::Arena::CreateMessage<proto::ClientToServer>(&arena);
    if (!stream->Read(batch)) break;
    if (on_frames) {
      // Its batches come as frames: one more here has no order with them.
      SPDLOG_WARN(
          "client {}: a message on its stream after its ops moved to "
          "frames; ending the session",
          id);
      break;
    }
    if (batch->ops_on_frames()) {
      if (ops_generation == 0) {
        SPDLOG_WARN(
            "client {}: said its ops come as frames where no ops listener "
            "was offered; ending the session",
            id);
        break;
      }
      on_frames = true;
    }
    {
      // A call's first host is written from this thread when its socket
      // has room (no locks are held once HandleClientBatch returns).
      WriterPool::InlineScope inline_write(&worker_writers_);
      HandleClientBatch(ctx, id, *batch, out);
    }
    arena.Reset();
    if (on_frames) {
      // After the stream's own ops: the frames may be applied now.
      client_ops_->MarkerRead(ops_generation);
      SPDLOG_INFO("client {}: its ops now come as frames (generation {})", id,
                  ops_generation);
    }
  }
}

void ServerImpl::EndClientSession(uint64_t id) {
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
    SendPeerOpsLocked();  // the islands' workers they may load from
    for (auto& [w, ops] : loads) {
      for (proto::WorkerOp& load : ops) scheduler_.Send(w, std::move(load));
    }
    queue = std::move(client_queues_[id]);
    client_queues_.erase(id);
    client_contexts_.erase(id);
    client_ops_generations_.erase(id);
    SPDLOG_INFO("client {} disconnected; its slices and buffers are freed", id);
    AnswerSlicesLocked();
    ResolveAwaitedLocked();  // its hosts may take a lost one's place
  }
  queue.reset();  // the only owner: stops and joins the writer
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
        absl::StrCat("tenant '", Abbreviated(tenant), "': ", s.message()));
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
  if (state_.Awaiting(id)) {
    // Its slice lost a host and waits for another: this batch routes on
    // the new map once one takes the place (or fails if none comes in
    // time: ServerOptions::spare_wait bounds the wait).
    SPDLOG_INFO(
        "client {}: its next batch waits for a host to take a lost "
        "one's place",
        id);
    auto settled = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || !state_.Awaiting(id);
    };
    mu_.Await(absl::Condition(&settled));
  }
  // A call or put on a slice the server suspended for a higher priority:
  // the batch waits until the slice resumes (its client did not ask for
  // the suspend), so its ops route, in the order sent, on the map the
  // slice resumes on. Its client leaving ends the wait (checked each
  // second: the stream's end does not signal mu_).
  for (std::optional<PreemptionHold> held =
           state_.HeldByPreemption(id, msg.ops());
       held.has_value(); held = state_.HeldByPreemption(id, msg.ops())) {
    SPDLOG_INFO("client {}: its next batch waits: {}", id, held->why);
    const int64_t held_ns = timeline_.NowNs();
    const uint64_t sid = held->slice_id;
    auto resumed = [this, sid, ctx]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || ctx->IsCancelled() || !state_.IsPreempted(sid);
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&resumed), absl::Seconds(1))) {
    }
    if (shutdown_ || ctx->IsCancelled()) return;
    // In the job's timeline as the span it waited (a resize's lane).
    RecordResize(id, held_ns,
                 absl::StrCat("a batch waited while slice ", sid,
                              " was suspended for a higher priority"));
  }
  {
    // Completions reported from here on wait for the end of the batch.
    absl::MutexLock admission(&admission_mu_);
    routing_batch_ = true;
  }
  control_bytes_in_ += msg.ByteSizeLong();
  // One unit per op, so the scheduler can keep (or, in the test-only
  // bypass, break) the order of calls across islands.
  RoutedBatch batch;
  batch.resent = msg.resent();
  if (batch.resent) {
    state_.PlanResent(id, msg.ops());
    SPDLOG_INFO(
        "client {}: {} op(s) sent again after the resume; {} buffer(s) to "
        "make again",
        id, msg.ops_size(),
        state_.FindClient(id) ? state_.FindClient(id)->needed.size() : 0);
  }
  bool last_was_release = false;
  for (const proto::ClientOp& op : msg.ops()) {
    // Releases commute with each other: consecutive ones share a unit, so
    // each worker gets them as one op.
    const bool release = op.op_case() == proto::ClientOp::kRelease;
    if (!(release && last_was_release)) {
      batch.units.emplace_back();
      batch.seqs.push_back(0);
      batch.executes.emplace_back();
    }
    last_was_release = release;
    RouteClientOpLocked(id, op, &batch);
  }
  if (batch.reply.slices_size() || batch.reply.errors_size() ||
      batch.reply.recoveries_size()) {
    out->Push(std::move(batch.reply));
  }
  // What the batch journaled (a program, a slice) is durable before its
  // calls go anywhere.
  AwaitJournalLocked();
  // Completions reported while it was routed; their releases go with it.
  Released released;
  ApplyCompletionsLocked(&released, /*batch_ends=*/true);
  TellReleasedPutsLocked();
  // Into the client's queue at admission, still under the state lock (so
  // nothing of a client that is being removed gets in); admitted to the
  // workers under the admission lock alone.
  {
    absl::MutexLock admission(&admission_mu_);
    EnqueueBatchLocked(id, &batch);
  }
  // What the server decides from this batch comes after it at admission:
  // a resize moves the values the batch's calls make, so its moves (and
  // the releases of the old copies) must follow those calls on every
  // worker. Decided before the batch was queued, they went ahead of it:
  // a move read a value its call had not made yet, and the old map's
  // collective lost ranks to releases that went first.
  if (batch.released_slice) AnswerSlicesLocked();
  // A slice granted may take devices from lower priorities. A resize the
  // client's values stopped (a partial gradient, a size a dimension does
  // not divide) may go once it releases them: tried again then.
  if (batch.granted_slice ||
      (batch.released_values && HoldsRefusedSlice(id, yield_refusals_))) {
    YieldSlicesLocked();
  }
  if (batch.released_values && HoldsRefusedSlice(id, grow_refusals_)) {
    GrowSlicesLocked();
  }
  absl::MutexLock admission(&admission_mu_);
  lock.Release();
  // The releases that completions let go need no order but that of the
  // calls before them, which are done: they go with the calls admitted
  // now (one write to each worker, not two), as in WorkerSession.
  AdmitLocked(std::move(released));
}

void ServerImpl::RouteClientOpLocked(uint64_t id, const proto::ClientOp& op,
                                     RoutedBatch* batch) {
  WorkerOps& ops = batch->units.back();
  switch (op.op_case()) {
    case proto::ClientOp::kSliceRequest: {
      // One that cannot be met yet waits in state_: its reply comes
      // later (AnswerSlicesLocked), and the rest of the batch goes on.
      auto slice =
          state_.RequestSlice(id, op.slice_request(), options_.clock->Now());
      if (slice.has_value()) {
        batch->granted_slice |= slice->ok();
        AddSliceReply(id, op.slice_request().request_id(), *slice,
                      &batch->reply);
      } else {
        SPDLOG_INFO("client {}: slice request {} waits: {}", id,
                    op.slice_request().request_id(),
                    state_.WaitingFor(state_.pending_slices().size() - 1));
      }
      break;
    }
    case proto::ClientOp::kSliceResize:
      ResizeSliceLocked(id, op.slice_resize(), batch);
      break;
    case proto::ClientOp::kSliceRelease:
      if (state_.ReleaseSlice(id, op.slice_release()).ok()) {
        batch->released_slice = true;
        grow_refusals_.erase(op.slice_release());
        yield_refusals_.erase(op.slice_release());
        state_.LoadStandbys(&ops);  // hosts it leaves idle stand by
      }
      break;
    case proto::ClientOp::kProgram: {
      absl::Status s = state_.RegisterClientProgram(id, op.program(), &ops);
      if (!s.ok()) {
        proto::CallError* e = batch->reply.add_errors();
        *e->mutable_status() = StatusToProto(s);
      }
      break;
    }
    case proto::ClientOp::kCall: {
      if (!batch->clock_read) {
        state_.set_now(options_.clock->Now());
        batch->clock_read = true;
      }
      bool routed = true;
      absl::Status s =
          batch->resent ? absl::OkStatus() : state_.RefuseOnSuspended(id, op);
      if (s.ok()) {
        s = batch->resent
                ? state_.RouteResentCall(id, op.call(), &ops,
                                         &batch->seqs.back(), &routed)
                : state_.RouteCall(id, op.call(), &ops, &batch->seqs.back(),
                                   &batch->executes.back());
      }
      if (!s.ok()) {
        proto::CallError* e = batch->reply.add_errors();
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
      absl::Status s =
          batch->resent ? absl::OkStatus() : state_.RefuseOnSuspended(id, op);
      if (s.ok()) {
        s = batch->resent ? state_.RouteResentPut(id, op.put(), &ops, &reput)
                          : state_.RoutePut(id, op.put(), &ops, &reput);
      }
      if (reput.reput_ids_size() > 0) {
        *batch->reply.add_recoveries() = std::move(reput);
      }
      if (!s.ok()) {
        proto::CallError* e = batch->reply.add_errors();
        e->add_output_ids(op.put().buffer_id());
        *e->mutable_status() = StatusToProto(s);
        // Its shards may already be on their way to the workers.
        state_.FailRefusedPut(id, op.put(), s, &ops);
      }
      break;
    }
    case proto::ClientOp::kRelease:
      state_.RouteRelease(id, op.release(), &ops);
      batch->released_values = true;
      break;
    case proto::ClientOp::kLive: {
      proto::Recovery lost = state_.RestoreLiveBuffers(id, op.live(), &ops);
      const int lost_count = lost.lost_ids_size();
      if (lost.lost_ids_size() > 0) {
        const ClientRecord* c = state_.FindClient(id);
        SPDLOG_WARN("client {}: {} buffer(s) lost with the restart: {} [{}]",
                    id, lost.lost_ids_size(), lost.status().message(),
                    c != nullptr ? c->lost_detail : "");
        *batch->reply.add_recoveries() = std::move(lost);
      }
      if (const ClientRecord* c = state_.FindClient(id);
          c != nullptr && op.live().done()) {
        SPDLOG_INFO(
            "client {}: resumed; {} live buffer(s) kept as the workers gave "
            "them back, {} call(s) and put(s) sent again ran again, {} lost",
            id, c->resume_kept, c->resume_ran_again, lost_count);
      }
      break;
    }
    case proto::ClientOp::kSnapshot:
      state_.RouteSnapshot(id, op.snapshot(), &ops);
      break;
    case proto::ClientOp::kStats:
      if (ClientRecord* c = state_.FindClient(id)) c->stats = op.stats();
      break;
    case proto::ClientOp::kSite:
      if (ClientRecord* c = state_.FindClient(id);
          c != nullptr && c->call_sites.size() < ClientRecord::kMaxCallSites) {
        // Bounded like every string a client sends (common/names.h).
        c->call_sites[op.site().id()] =
            op.site().text().substr(0, kMaxNameBytes);
      }
      break;
    default:
      break;
  }
}

void ServerImpl::EnqueueBatchLocked(uint64_t id, RoutedBatch* batch) {
  SendPeerOpsLocked();
  // Units that only say what will exist or what failed (puts' Declares,
  // program loads, refused calls' failures) use no device and need
  // nothing that comes before them: they go to the workers now, ahead of
  // the client's calls still waiting, so a put's bytes never wait at a
  // worker for a Declare held behind those calls. Calls and releases (a
  // release must follow the calls that read its buffer) keep the
  // client's order at admission.
  std::vector<WorkerOps> express;
  // The calls' wait at admission starts now (timeline).
  const int64_t routed_ns =
      batch->clock_read && timeline_.enabled() ? timeline_.NowNs() : 0;
  for (size_t u = 0; u < batch->units.size(); ++u) {
    AdmissionUnit unit =
        MakeAdmissionUnit(std::move(batch->units[u]), batch->seqs[u],
                          std::move(batch->executes[u]));
    if (unit.is_call()) unit.routed_ns = routed_ns;
    // Releases and snapshots' copies follow the calls before them.
    if (!unit.is_call() && !Ordered(unit.ops)) {
      if (!unit.ops.empty()) express.push_back(std::move(unit.ops));
      continue;
    }
    admission_.Enqueue(id, std::move(unit));
  }
  if (!express.empty()) scheduler_.Submit(std::move(express));
}

void ServerImpl::ResizeSliceLocked(uint64_t id, const proto::SliceResize& req,
                                   RoutedBatch* batch) {
  int before = 0;
  if (auto s = state_.slices().find(req.slice_id());
      s != state_.slices().end()) {
    before = static_cast<int>(s->second.devices.size());
  }
  const int64_t start_ns = timeline_.enabled() ? timeline_.NowNs() : 0;
  const char* what = req.suspend()  ? "suspend"
                     : req.resume() ? "resume"
                                    : "resize";
  absl::StatusOr<SliceResized> resized = state_.ChangeSlice(id, req);
  if (!resized.ok()) {
    SPDLOG_INFO("client {}: {} of slice {} refused: {}", id, what,
                req.slice_id(), std::string(resized.status().message()));
    AddSliceReply(id, req.request_id(), resized.status(), &batch->reply);
    return;
  }
  std::string done;
  if (req.suspend() || req.resume()) {
    done = resized->why;
  } else {
    done = absl::StrCat("slice ", req.slice_id(), " from ", before, " to ",
                        req.num_devices(), " devices, ", resized->values_moved,
                        " values moved (", resized->bytes_moved, " bytes)");
  }
  SPDLOG_INFO("client {}: {}", id, done);
  RecordResize(id, start_ns, done);
  AddSliceReply(id, req.request_id(), resized->slice, &batch->reply);
  proto::SliceReply& reply = *batch->reply.mutable_slices()->rbegin();
  reply.set_values_moved(resized->values_moved);
  reply.set_bytes_moved(resized->bytes_moved);
  for (uint64_t token : resized->wait_ids) reply.add_wait_ids(token);
  for (uint64_t id : resized->parked_ids) reply.add_parked_ids(id);
  // The new ids reach the client with the reply (one message), so it
  // never names a moved value by its old id on the new map.
  *batch->reply.add_recoveries() = std::move(resized->note);
  // Each move a unit of its own (a call, in the client's order), then the
  // releases of the old copies, after them.
  for (auto& [seq, ops] : resized->work) {
    batch->units.push_back(std::move(ops));
    batch->seqs.push_back(seq);
    batch->executes.emplace_back();
  }
  if (resized->freed_devices) {
    batch->released_slice = true;
    state_.LoadStandbys(&batch->units.back());  // hosts it leaves idle
  }
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
  std::vector<SliceAnswer> answers =
      state_.ServePendingSlices(options_.clock->Now());
  if (!answers.empty()) AwaitJournalLocked();  // the grants, before replies
  for (SliceAnswer& a : answers) {
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
  bool granted = false;
  for (const SliceAnswer& a : answers) granted |= a.slice.ok();
  if (granted) YieldSlicesLocked();
  GrowSlicesLocked();
}

bool ServerImpl::HoldsRefusedSlice(
    uint64_t client_id, const std::map<uint64_t, std::string>& refusals) {
  for (const auto& [sid, why] : refusals) {
    auto it = state_.slices().find(sid);
    if (it != state_.slices().end() && it->second.client_id == client_id) {
      return true;
    }
  }
  return false;
}

void ServerImpl::YieldSlicesLocked() {
  const int64_t start_ns = timeline_.NowNs();
  state_.set_now(options_.clock->Now());  // a preempted slice's since
  std::map<uint64_t, std::string> why_not;
  auto yielded = state_.YieldToPriorities(&why_not);
  SendServerResizesLocked(std::move(yielded), why_not, yield_refusals_,
                          "does not yield to a higher priority", start_ns);
}

void ServerImpl::GrowSlicesLocked() {
  const int64_t start_ns = timeline_.NowNs();
  state_.set_now(options_.clock->Now());
  std::map<uint64_t, std::string> why_not;
  auto grown = state_.GrowSlices(&why_not);
  SendServerResizesLocked(std::move(grown), why_not, grow_refusals_,
                          "could grow back but does not", start_ns);
}

void ServerImpl::SendServerResizesLocked(
    std::vector<std::pair<uint64_t, SliceResized>> resized,
    const std::map<uint64_t, std::string>& why_not,
    std::map<uint64_t, std::string>& refusals, const char* refused,
    int64_t start_ns) {
  for (const auto& [sid, why] : why_not) {
    // Said once per reason: a resize is tried each time it may go.
    if (refusals[sid] == why) continue;
    refusals[sid] = why;
    SPDLOG_INFO("slice {} {}: {}", sid, refused, why);
  }
  for (auto& [client_id, r] : resized) {
    refusals.erase(r.slice.slice_id());
    auto queue = client_queues_.find(client_id);
    proto::ServerToClient note;
    const std::string what = r.why;
    SPDLOG_INFO("client {}: {}", client_id, what);
    SendServerResizeLocked(client_id, std::move(r), what, start_ns, &note);
    if (queue != client_queues_.end()) queue->second->Push(std::move(note));
  }
}

void ServerImpl::SendServerResizeLocked(uint64_t client_id,
                                        SliceResized resized,
                                        const std::string& what,
                                        int64_t start_ns,
                                        proto::ServerToClient* note) {
  RecordResize(client_id, start_ns, what);
  *note->add_recoveries() = std::move(resized.note);
  SendPeerOpsLocked();
  absl::MutexLock admission(&admission_mu_);
  for (auto& [seq, ops] : resized.work) {
    admission_.Enqueue(client_id, MakeAdmissionUnit(std::move(ops), seq));
  }
  AdmitLocked();
}

}  // namespace plexus
