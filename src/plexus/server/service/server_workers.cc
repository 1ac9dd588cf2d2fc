// ServerImpl: the worker side — a worker's session (registration, then
// what it reports), when it was last heard from, and what follows when it
// is declared down.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpc/slice.h"
#include "plexus/common/logging.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/thread_name.h"
#include "plexus/server/recovery/settle_loss.h"
#include "plexus/server/service/internal/server_impl.h"

namespace plexus {

void ServerImpl::CheckLiveness() {
  {
    absl::MutexLock lock(&mu_);
    AnswerSlicesLocked();  // slice requests past their deadline fail
    // Slices waiting for a host: one came free, or the wait is over.
    ResolveAwaitedLocked();
  }
  EndResumeWait();  // after a restart: who did not come back
  MaybeCompactJournal();
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

void ServerImpl::HeardFrom(int64_t id, absl::Time now) {
  absl::Duration silent;
  bool was_heard;
  {
    absl::MutexLock lock(&heard_mu_);
    if (now == absl::InfinitePast()) now = options_.clock->Now();
    auto [it, fresh] = heard_.try_emplace(id);
    LastHeard& heard = it->second;
    was_heard = !fresh;
    silent = heard.handling > 0 ? absl::ZeroDuration() : now - heard.at;
    heard.at = now;
    if (was_heard) ++heard.handling;  // until Handled
  }
  // A near miss: a worker that was still alive, but late enough that the
  // deadline is worth a look (a starved or stalled host).
  if (was_heard && silent > options_.heartbeat_timeout / 2) {
    SPDLOG_WARN("worker {} was silent for {} (failure deadline {})", id,
                absl::FormatDuration(silent),
                absl::FormatDuration(options_.heartbeat_timeout));
  }
}

bool ServerImpl::SilentLocked(const LastHeard& heard, absl::Time now) {
  // (A check period as long as the deadline, as a test that checks by
  // hand sets, leaves the whole deadline: never a negative silence, which
  // found every worker not handling a message silent.)
  const absl::Duration period = LivenessCheckPeriod(options_);
  const absl::Duration silence = period < options_.heartbeat_timeout
                                     ? options_.heartbeat_timeout - period
                                     : options_.heartbeat_timeout;
  return heard.handling == 0 && now - heard.at > silence;
}

bool ServerImpl::Silent(int64_t id) {
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&heard_mu_);
  auto it = heard_.find(id);
  return it != heard_.end() && SilentLocked(it->second, now);
}

grpc::Status ServerImpl::ServeWorker(grpc::ServerContext* ctx,
                                     WorkerStream* stream) {
  proto::WorkerToServer first;
  if (!stream->Read(&first) || !first.has_register_()) {
    return grpc::Status(grpc::INVALID_ARGUMENT,
                        "the first message must register the worker");
  }
  if (grpc::Status refused = CheckRegistration(ctx, first); !refused.ok()) {
    return refused;
  }
  first.mutable_register_()->clear_credential();  // not kept, not shown
  // A host that rejoins (its session ended on its side) while its old
  // registration still looks alive here: that one is declared down first,
  // so nothing waits on it and its pushes are fenced.
  const std::string rejoined = PreviousRegistration(first.register_());
  int64_t id;
  std::shared_ptr<WorkerChannel> channel;
  if (grpc::Status s =
          RegisterWorker(ctx, stream, first, rejoined, &id, &channel);
      !s.ok()) {
    return s;
  }
  if (first.register_().ops_on_data_plane() &&
      options_.worker_ops_on_data_plane && options_.tls_cert_file.empty()) {
    MoveOpsToDataPlane(ctx, id, first.register_(), *channel);
  }
  // Its calls done come back on the ops connection once its ops go there,
  // read with every other worker's by the reports poller.
  absl::Notification reports_ended;
  const bool polled =
      channel->on_data_plane() && PollReports(ctx, id, channel, &reports_ended);
  proto::WorkerToServer msg;
  while (stream->Read(&msg)) OnWorkerMessage(id, msg, msg.ByteSizeLong());
  if (polled) {
    // Reports still on their way are taken first: a worker that died
    // closed its socket after them. One still up (declared down, or the
    // server shutting down) has its connection shut after a bound.
    reports_ended.WaitForNotificationWithTimeout(kReportsDrain);
    channel->Shutdown();
    reports_poller_->Remove(id);  // no report of its is applied after
  }
  EndWorkerSession(id, channel.get(), ctx->IsCancelled());
  return grpc::Status::OK;
}

bool ServerImpl::PollReports(grpc::ServerContext* ctx, int64_t id,
                             const std::shared_ptr<WorkerChannel>& channel,
                             absl::Notification* ended) {
  const int fd = channel->DupReportsFd();
  if (fd < 0) return false;
  auto on_report = [this, id](std::string& bytes) {
    thread_local proto::WorkerToServer msg;
    if (!msg.ParseFromString(bytes)) {
      return absl::DataLossError(
          absl::StrCat("a REPORTS frame of ", bytes.size(),
                       " bytes is not a WorkerToServer"));
    }
    OnWorkerMessage(id, msg, bytes.size());
    return absl::OkStatus();
  };
  auto on_end = [this, ctx, id, channel, ended](const absl::Status& why) {
    ended->Notify();
    if (channel->shut_down()) return;  // the session's end shut it
    SPDLOG_WARN("worker {}: its ops connection ended ({}); ending its session",
                id, why.ToString());
    ctx->TryCancel();
  };
  if (absl::Status s = reports_poller_->Add(id, fd, on_report, on_end);
      !s.ok()) {
    SPDLOG_WARN(
        "worker {}: its reports cannot be polled ({}); ending its "
        "session",
        id, s.ToString());
    ctx->TryCancel();
    return false;
  }
  return true;
}

void ServerImpl::MoveOpsToDataPlane(grpc::ServerContext* ctx, int64_t id,
                                    const proto::RegisterWorker& reg,
                                    WorkerChannel& channel) {
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    const WorkerRecord* w = state_.FindWorker(id);
    if (w == nullptr || !w->alive) return;
    generation = w->generation;
  }
  const transport::DataPlaneIdentity me{
      .peer = {.role = CredentialRole::kServer, .id = 0},
      .credential = secret_.Derive(CredentialRole::kServer),
      .generation = generation};
  // Real time: the worker's heartbeats wait unread meanwhile.
  const absl::Time give_up =
      Clock::Real()->Now() + options_.heartbeat_timeout / 2;
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> conn =
      transport::DataPlaneConnection::Connect(
          reg.data_address(),
          reg.machine_id() == machine_id_ ? reg.unix_path() : "",
          /*counters=*/nullptr, me, [ctx, give_up] {
            return ctx->IsCancelled() || Clock::Real()->Now() > give_up;
          });
  if (!conn.ok()) {
    SPDLOG_WARN(
        "worker {}: its ops stay on its gRPC stream: cannot open its data "
        "plane at {}: {}",
        id, reg.data_address(), conn.status().ToString());
    return;
  }
  const bool shm = (*conn)->uses_shared_memory();
  if (!channel.MoveToDataPlane(*std::move(conn))) return;
  SPDLOG_INFO("worker {}: ops now on its data plane ({}), generation {}", id,
              shm ? "unix socket" : "TCP", generation);
}

absl::Status ServerImpl::UseWireWriterForWorkers() {
  // Its index among the methods of plexus.proto's service Controller.
  constexpr int kWorkerSession = 0;
  using Generated = grpc::internal::BidiStreamingHandler<
      proto::Controller::Service, proto::WorkerToServer, proto::ServerToWorker>;
  if (dynamic_cast<Generated*>(GetHandler(kWorkerSession)) == nullptr) {
    return absl::InternalError(
        "the Controller service's first method is not WorkerSession (its "
        "handler is not the generated one): plexus.proto and "
        "UseWireWriterForWorkers disagree");
  }
  MarkMethodStreamed(
      kWorkerSession,
      new grpc::internal::BidiStreamingHandler<
          ServerImpl, proto::WorkerToServer, grpc::ByteBuffer>(
          [](ServerImpl* self, grpc::ServerContext* ctx, WorkerStream* stream) {
            return self->ServeWorker(ctx, stream);
          },
          this));
  return absl::OkStatus();
}

grpc::Status ServerImpl::CheckRegistration(
    grpc::ServerContext* ctx, const proto::WorkerToServer& first) const {
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
  return grpc::Status::OK;
}

grpc::Status ServerImpl::RegisterWorker(grpc::ServerContext* ctx,
                                        WorkerStream* stream,
                                        const proto::WorkerToServer& first,
                                        const std::string& rejoined,
                                        int64_t* id_out,
                                        std::shared_ptr<WorkerChannel>* out) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    // Too late to be cancelled by Shutdown(): refused instead.
    return grpc::Status(grpc::CANCELLED, "the server is shutting down");
  }
  control_bytes_in_ += first.ByteSizeLong();
  const absl::Time now = options_.clock->Now();
  // A worker that kept its state comes back as the host it was, if this
  // server restarted on a journal that knows it; else it is a fresh host
  // (and drops what it kept).
  const uint64_t generation = ++generation_;
  WorkerRecord* resumed =
      first.register_().kept_state()
          ? state_.ResumeWorker(first.register_(), generation, now)
          : nullptr;
  WorkerRecord& w = resumed != nullptr
                        ? *resumed
                        : state_.AddWorker(first.register_(), now, generation);
  const int64_t id = w.id;
  // Heard from as it registered, before anything is sent to it.
  HeardFrom(id, now);
  // The first message also carries what the worker needs to know of
  // this session.
  proto::ServerToWorker hello;
  hello.set_protocol_version(kProtocolVersion);
  hello.set_generation(w.generation);
  hello.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(HeartbeatInterval(options_)));
  // A worker taken back is the host it was, not a rejoin.
  if (resumed == nullptr) hello.set_rejoined(rejoined);
  hello.set_resumed(resumed != nullptr);
  hello.set_temp_floor(state_.temporary_floor());
  AwaitJournalLocked();  // the registration, before the worker hears it
  // Each write is one ServerToWorker in wire form (WorkerChannel): on the
  // stream, or, once ServeWorker moved them, as frames on the data plane.
  proto::ServerToWorker head;
  head.set_worker_id(id);
  auto channel = std::make_shared<WorkerChannel>(
      stream, ctx, hello.SerializeAsString(), head.SerializeAsString(), id);
  auto queue = std::make_shared<WorkerQueue>(
      [channel](std::vector<OutOp>& ops) { return channel->Write(ops); },
      &worker_writers_, WorkerQueue::kDefaultCapacity,
      [channel] { return channel->WritableNow(); });
  *out = channel;
  // It is told of itself now, and of each other host only as an op it is
  // sent names it (ClusterState::TellPeer): a registration costs O(1)
  // ops, not one to every host and every host to it.
  state_.TellPeer(id, id);
  // A spare, or a host that rejoins, has every XLA program's
  // executables ahead, to take a place at once (told of the islands'
  // workers it may load them from).
  std::vector<proto::WorkerOp> loads = state_.LoadsForStandby(id);
  WorkerOps peers = state_.TakePeerOps();
  for (auto& [to, list] : peers) {
    for (proto::WorkerOp& op : list) {
      if (to == id) {
        queue->Push(std::move(op));
      } else {
        scheduler_.Send(to, std::move(op));
      }
    }
  }
  for (proto::WorkerOp& load : loads) queue->Push(std::move(load));
  scheduler_.AddWorker(id, std::move(queue));
  {
    absl::MutexLock admission(&admission_mu_);
    admission_.AddWorker(id, first.register_().devices_size());
  }
  worker_contexts_[id] = ctx;
  AnswerSlicesLocked();    // slice requests that waited for its devices
  ResolveAwaitedLocked();  // slices that waited for a host
  SPDLOG_INFO(
      "worker {} {}: host {}, {} device(s), pid {}, data plane "
      "{}, generation {}{}",
      id,
      resumed != nullptr
          ? absl::StrCat("came back with what it kept (",
                         first.register_().inventory_size(), " shard(s))")
          : std::string("registered"),
      first.register_().host_name(), first.register_().devices_size(),
      first.register_().pid(), first.register_().data_address(), w.generation,
      rejoined.empty() || resumed != nullptr ? ""
                                             : "; it rejoins: " + rejoined);
  *id_out = id;
  return grpc::Status::OK;
}

void ServerImpl::OnWorkerMessage(int64_t id, proto::WorkerToServer& msg,
                                 size_t bytes) {
  // Any message shows the worker alive: stamped as it is read, before
  // anything below waits for a lock (CheckLiveness).
  HeardFrom(id);
  if (msg.has_heartbeat()) {
    OnHeartbeat(id, msg);
  } else if (msg.has_timeline()) {
    OnTimelineChunk(id, *msg.mutable_timeline());
  } else if (msg.has_transfer_failed()) {
    RelayTransferFailure(id, msg.transfer_failed());
  } else if (msg.has_calls_done()) {
    control_bytes_in_ += static_cast<int64_t>(bytes);
    // What the room admits goes to its first host from this thread.
    WriterPool::InlineScope inline_write(&worker_writers_);
    OnCallsDone(id, msg.calls_done());
  }
  Handled(id);
}

void ServerImpl::OnHeartbeat(int64_t id, const proto::WorkerToServer& msg) {
  const int64_t read_ns = timeline_.NowNs();
  {
    absl::MutexLock lock(&mu_);
    control_bytes_in_ += msg.ByteSizeLong();
    if (WorkerRecord* w = state_.FindWorker(id)) {
      w->stats = msg.heartbeat();
      w->last_heartbeat = options_.clock->Now();
      w->heartbeats++;
      w->stats_answered = std::max(w->stats_answered, w->stats.answers());
    }
  }
  OnClockProbe(id, msg.heartbeat().clock(), read_ns);
}

void ServerImpl::OnCallsDone(int64_t id, const proto::CallsDone& done) {
  {
    absl::MutexLock admission(&admission_mu_);
    admission_.Completed(id, done);
    for (uint64_t copy : done.copies_done()) {
      copies_arrived_.push_back(copy);
    }
    // The room it left is used now, under this one lock, unless this
    // thread applies completions to the records next: their releases
    // then ride with the calls that room admits (one write to each
    // worker, not two).
    if (!CompletionsPendingLocked() || routing_batch_ ||
        draining_completions_) {
      AdmitLocked();
      return;
    }
    draining_completions_ = true;
  }
  DrainCompletions();
}

void ServerImpl::DrainCompletions() {
  while (true) {
    Released releases;
    {
      absl::MutexLock lock(&mu_);
      ApplyCompletionsLocked(&releases);
    }
    absl::MutexLock admission(&admission_mu_);
    AdmitLocked(std::move(releases));
    // More reported meanwhile by threads that left them to this one; a
    // batch being routed applies them as it ends.
    if (!CompletionsPendingLocked() || routing_batch_) {
      draining_completions_ = false;
      return;
    }
  }
}

void ServerImpl::EndWorkerSession(int64_t id, WorkerChannel* channel,
                                  bool cut) {
  std::string heard;
  {
    absl::MutexLock lock(&heard_mu_);
    if (auto it = heard_.find(id); it != heard_.end()) {
      heard = absl::StrCat(
          "; last heard from ",
          absl::FormatDuration(absl::Trunc(
              options_.clock->Now() - it->second.at, absl::Milliseconds(1))),
          " before");
    }
  }
  // Which end closed it is all a stream's end says: a worker that closed
  // it (its session ended on its side: it logs why) or a connection cut
  // under it (its process ended, its host or network failed, or the
  // channel's keepalive found the other end silent).
  WorkerDown(id,
             absl::StrCat("worker ", id, " lost its connection to the server (",
                          cut ? "the connection was cut: its process "
                                "ended, its host or network failed, or "
                                "a keepalive went unanswered"
                              : "the worker closed its stream",
                          heard, ")"));
  {
    absl::MutexLock lock(&heard_mu_);
    heard_.erase(id);
  }
  ForgetTimelineOf(id);
  std::shared_ptr<WorkerQueue> queue;
  {
    absl::MutexLock lock(&mu_);
    queue = scheduler_.RemoveWorker(id);
    worker_contexts_.erase(id);
  }
  // The writer uses `stream`, which dies when this handler returns: stop
  // it here (a write blocked on the frames' socket woken first). A client
  // session waiting for room may still hold the queue (and destroy it
  // later); it no longer writes.
  if (channel != nullptr) channel->Shutdown();
  if (queue) queue->Stop();
}

void ServerImpl::SendPeerOpsLocked() {
  WorkerOps peers = state_.TakePeerOps();
  if (peers.empty()) return;
  // Ahead of every unit not yet admitted (ClusterState::TellPeer).
  std::vector<WorkerOps> units;
  units.push_back(std::move(peers));
  scheduler_.Submit(std::move(units));
}

std::string ServerImpl::PreviousRegistration(const proto::RegisterWorker& reg) {
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

void ServerImpl::RelayTransferFailure(int64_t from,
                                      const proto::TransferFailed& failed) {
  absl::MutexLock lock(&mu_);
  control_bytes_in_ += failed.ByteSizeLong();
  SPDLOG_WARN("worker {}: {}", from, failed.status().message());
  const WorkerRecord* dst = state_.FindWorker(failed.dst_worker_id());
  if (dst == nullptr || !dst->alive) return;  // PeerDown said it all
  proto::WorkerOp op;
  *op.mutable_transfer_failed() = failed;
  scheduler_.Send(failed.dst_worker_id(), std::move(op));
}

void ServerImpl::WorkerDown(int64_t id, const std::string& reason,
                            bool only_if_silent) {
  const int64_t start_ns = timeline_.NowNs();
  absl::MutexLock lock(&mu_);
  WorkerRecord* w = state_.FindWorker(id);
  if (w == nullptr || !w->alive) return;
  if (only_if_silent && !Silent(id)) return;
  // What is known done counts as done: it need not run again.
  {
    Released releases;
    ApplyCompletionsLocked(&releases);
    if (!releases.empty()) {
      std::vector<GangUnit> unit;
      unit.push_back(ReleasedUnit(std::move(releases)));
      scheduler_.Submit(std::move(unit));
    }
  }
  std::string message = absl::StrCat(reason, " [host ", w->info.host_name(),
                                     ", pid ", w->info.pid(), "]");
  if (shutdown_) {
    SPDLOG_INFO("{}", message);  // expected: the cluster is going down
  } else {
    SPDLOG_WARN("{}", message);
  }
  const absl::Time now = options_.clock->Now();
  // A slice waiting for a host that loses another breaks (one at a time).
  for (const WorkerLoss& ended : state_.EndAwaited(now, id)) {
    SPDLOG_WARN("slice(s) waiting since worker {} was lost break: {}",
                ended.worker_id, ended.reason);
    SettleLossLocked(ended);
  }
  const WorkerLoss loss = state_.LoseWorker(
      id, message, now, shutdown_ ? absl::ZeroDuration() : options_.spare_wait);
  {
    absl::MutexLock admission(&admission_mu_);
    // Clients whose slices were remapped onto a spare, or wait for one:
    // their work waiting at admission is held, to be routed again on the
    // new map as their loss is settled. Calls of the others still waiting
    // that need it fail now, in their place, rather than after the calls
    // in front of them have run.
    const int64_t failed = HoldForLoss(state_, admission_, loss);
    if (failed > 0) {
      SPDLOG_INFO("failed {} waiting call(s) that needed worker {}", failed,
                  id);
    }
    AdmitLocked();
  }
  proto::WorkerOp down;
  down.mutable_peer_down()->set_worker_id(id);
  down.mutable_peer_down()->set_generation(w->generation);
  *down.mutable_peer_down()->mutable_status() =
      StatusToProto(absl::UnavailableError(message));
  scheduler_.Broadcast(down, /*except=*/id);
  auto ctx = worker_contexts_.find(id);
  if (ctx != worker_contexts_.end()) ctx->second->TryCancel();
  if (loss.spare != 0) {
    SPDLOG_INFO("worker {}'s {} slice(s) remapped onto spare worker {}", id,
                loss.remapped.size(), loss.spare);
  }
  if (loss.promoted != 0) {
    SPDLOG_INFO(
        "worker {} held no slice: spare worker {} takes its place as a host "
        "for new slices",
        id, loss.promoted);
    AnswerSlicesLocked();  // requests that waited for its devices
  }
  if (!loss.awaiting.empty()) {
    SPDLOG_WARN(
        "worker {}'s {} slice(s) wait up to {} for a host to take its place "
        "(no spare is free); their clients' work waits meanwhile",
        id, loss.awaiting.size(), absl::FormatDuration(options_.spare_wait));
  }
  SettleLossLocked(loss);
  TellReleasedPutsLocked();
  RecordRecovery(loss.spare != 0 ? "host lost, its slices remapped onto a spare"
                 : !loss.shrunk.empty() ? "host lost, its slices shrank"
                 : !loss.awaiting.empty()
                     ? "host lost, its slices wait for a host"
                 : !loss.broken.empty() ? "host lost, its slices broke"
                                        : "host lost",
                 start_ns, id);
}

void ServerImpl::SettleLossLocked(const WorkerLoss& loss) {
  const int64_t start_ns = timeline_.NowNs();
  std::set<uint64_t> connected;
  for (uint64_t c : loss.clients) {
    if (client_queues_.count(c) > 0) connected.insert(c);
  }
  std::vector<ClientSettlement> settled;
  {
    absl::MutexLock admission(&admission_mu_);
    settled = SettleLoss(state_, admission_, loss,
                         [&](uint64_t c) { return connected.count(c) > 0; });
  }
  if (settled.empty()) return;
  for (const ClientSettlement& c : settled) {
    for (const std::string& what : c.shrunk) {
      SPDLOG_WARN("client {}: {}", c.client_id, what);
      RecordResize(c.client_id, start_ns, what);
    }
    if (c.recovered) {
      RecordRecovery("work recomputed or restored", start_ns, loss.worker_id,
                     c.client_id);
      SPDLOG_INFO(
          "client {}: {} unit(s) of work routed again, {} buffer(s) under "
          "new ids, {} lost",
          c.client_id, c.units_routed, c.new_ids, c.lost_ids);
    } else if (c.lost_ids > 0) {
      SPDLOG_INFO("client {}: {} buffer(s) lost with worker {}", c.client_id,
                  c.lost_ids, loss.worker_id);
    }
  }
  // The peers the recovered work needs know each other before any of it
  // can be admitted.
  SendPeerOpsLocked();
  {
    absl::MutexLock admission(&admission_mu_);
    EnqueueSettled(admission_, loss, settled);
    AdmitLocked();
  }
  for (ClientSettlement& c : settled) {
    client_queues_.at(c.client_id)->Push(std::move(c.note));
  }
}

void ServerImpl::ResolveAwaitedLocked() {
  if (state_.awaited().empty()) return;
  std::vector<WorkerLoss> settled = state_.ResumeAwaited();
  for (const WorkerLoss& loss : settled) {
    SPDLOG_INFO(
        "worker {}'s {} slice(s), which waited for a host, remapped onto "
        "worker {}",
        loss.worker_id, loss.remapped.size(), loss.spare);
  }
  for (WorkerLoss& loss : state_.EndAwaited(options_.clock->Now())) {
    SPDLOG_WARN("worker {}'s {} slice(s) break: {}", loss.worker_id,
                loss.broken.size(), loss.reason);
    settled.push_back(std::move(loss));
  }
  for (const WorkerLoss& loss : settled) SettleLossLocked(loss);
  if (!settled.empty()) TellReleasedPutsLocked();
}

void ServerImpl::LivenessLoop() {
  // Real time, not the injected clock: what stalls is this process,
  // whatever a test's clock says (a FakeClock test calls CheckLiveness
  // itself after Advance; this loop's real period does not matter there).
  Clock* const real = Clock::Real();
  absl::Time last = real->Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&shutdown_),
                               LivenessCheckPeriod(options_))) {
        return;
      }
    }
    const absl::Time now = real->Now();
    if (ServerStalled(now - last, options_)) ExcuseSilence(now - last);
    if (peer_watch_ != nullptr && now - last >= options_.standby_lease) {
      // Long enough for the other server to have taken over.
      peer_watch_->Arm(absl::StrCat("this server did not run for ",
                                    absl::FormatDuration(now - last),
                                    ", past its standby lease"));
    }
    last = now;
    CheckLiveness();
  }
}

void ServerImpl::ExcuseSilence(absl::Duration stalled) {
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

}  // namespace plexus
