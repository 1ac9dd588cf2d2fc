// ServerImpl: status and administration — waiting for workers, GetStatus,
// and the Shutdown RPC.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/server/service/internal/server_impl.h"
#include "plexus/server/why/why.h"

namespace plexus {

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
  FillStatus(*request, status);
  return grpc::Status::OK;
}

void ServerImpl::FillStatus(const proto::StatusRequest& request,
                            proto::ClusterStatus* status) {
  absl::MutexLock lock(&mu_);
  if (request.fresh_timeout_ms() > 0) {
    AwaitFreshStatsLocked(absl::Milliseconds(request.fresh_timeout_ms()));
  }
  status->set_address(advertised_);
  status->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(HeartbeatInterval(options_)));
  status->set_web_address(web_advertised_);
  status->set_calls_routed(state_.calls_routed());
  status->set_transfers_routed(state_.transfers_routed());
  status->set_epoch(scheduler_.epoch());
  status->set_scheduler(options_.consistent_order ? "gang/fair"
                                                  : "none (test only)");
  status->set_control_bytes_in(control_bytes_in_);
  status->set_data_bytes(0);  // the server has no data path
  FillWorkersAndClientsLocked(status);
  FillSlicesLocked(status);
  FillWaitsLocked(request, status);
  FillGraphsLocked(status);
}

void ServerImpl::AwaitFreshStatsLocked(absl::Duration timeout) {
  // Every live worker is asked for a heartbeat now, read after it applied
  // this op (and every op sent before it): a beat already on its way when
  // the request came does not count. Its next periodic beat is awaited
  // too (a beat is read after the ones before it), so what a caller sent
  // just before asking (a release lingering in its client) has a period
  // to arrive, as it always had. Heartbeats are recorded under mu_, so
  // Await re-checks as they arrive.
  const uint64_t request = ++stats_requests_;
  struct Asked {
    int64_t id;
    int64_t heartbeats;
  };
  std::vector<Asked> asked;
  for (const auto& [id, w] : state_.workers()) {
    if (!w.alive) continue;
    proto::WorkerOp op;
    op.mutable_send_stats()->set_request_id(request);
    scheduler_.Send(id, std::move(op));
    // The answer is one beat, the next periodic one another.
    asked.push_back({id, w.heartbeats + 1});
  }
  auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Asked& a : asked) {
      const WorkerRecord* w = state_.FindWorker(a.id);
      if (w != nullptr && w->alive &&
          (w->stats_answered < request || w->heartbeats <= a.heartbeats)) {
        return false;
      }
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&fresh), timeout);
}

void ServerImpl::FillWorkersAndClientsLocked(proto::ClusterStatus* status) {
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
    ws->set_stats_age_ms(
        absl::ToInt64Milliseconds(options_.clock->Now() - w.last_heartbeat));
  }
  for (const auto& [id, c] : state_.clients()) {
    auto* cs = status->add_clients();
    cs->set_client_id(id);
    cs->set_name(c.name);
    cs->set_tenant(c.tenant);
    cs->set_slices(static_cast<int32_t>(c.slices.size()));
    *cs->mutable_stats() = c.stats;
    cs->set_live_bytes(c.live_bytes);
    if (auto g = client_ops_generations_.find(id);
        g != client_ops_generations_.end()) {
      const int64_t frames = client_ops_->frames(g->second);
      cs->set_ops_on_frames(frames > 0);
      cs->set_ops_frames(frames);
    }
    absl::MutexLock admission(&admission_mu_);
    if (const Admission::ClientView* v = admission_.Find(id)) {
      cs->set_weight(v->weight);
      cs->set_calls_pending(v->pending_calls);
      cs->set_calls_in_flight(v->in_flight);
      cs->set_calls_admitted(v->admitted);
      cs->set_device_micros(v->device_micros);
    }
  }
}

void ServerImpl::FillSlicesLocked(proto::ClusterStatus* status) {
  for (const auto& [id, s] : state_.slices()) {
    auto* ss = status->add_slices();
    ss->set_slice_id(id);
    ss->set_client_id(s.client_id);
    *ss->mutable_devices() = state_.DescribeSlice(s).devices();
    ss->set_generation(s.generation);
    ss->set_broken(s.broken);
    ss->set_suspended(s.suspended);
    ss->set_preempted(s.preempted);
    if (!s.awaiting.empty()) {
      ss->set_awaiting(s.awaiting);
      ss->set_awaiting_left_ms(std::max<int64_t>(
          0,
          absl::ToInt64Milliseconds(s.awaiting_until - options_.clock->Now())));
    }
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
}

void ServerImpl::FillWaitsLocked(const proto::StatusRequest& request,
                                 proto::ClusterStatus* status) {
  const absl::Time now = options_.clock->Now();
  if (request.why_after_ms() >= 0) {
    WhyOptions why;
    why.now = now;
    if (request.why_after_ms() > 0) {
      why.after = absl::Milliseconds(request.why_after_ms());
    }
    why.silent_after = options_.heartbeat_timeout * 3 / 10;
    absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>> not_done;
    absl::flat_hash_map<uint64_t, WhyOptions::AdmissionQueue> queues;
    {
      absl::MutexLock admission(&admission_mu_);
      not_done = admission_.WorkersNotDone();
      for (const auto& [id, c] : state_.clients()) {
        const Admission::ClientView* v = admission_.Find(id);
        if (v == nullptr) continue;
        WhyOptions::AdmissionQueue& q = queues[id];
        q.weight = v->weight;
        if (v->pending_calls > 0) q.seqs = admission_.PendingCallSeqs(id);
      }
    }
    why.not_done = &not_done;
    why.admission = &queues;
    for (proto::WhyEntry& e : ExplainWaits(state_, why)) {
      *status->add_why() = std::move(e);
    }
  }
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
}

void ServerImpl::FillGraphsLocked(proto::ClusterStatus* status) {
  constexpr int kMaxGraphs = 100;
  const absl::Time now = options_.clock->Now();
  struct Graph {
    proto::GraphStatus status;
    absl::Time oldest = absl::InfiniteFuture();
  };
  std::map<std::pair<uint64_t, uint64_t>, Graph> graphs;  // (client, graph)
  for (const auto& [seq, call] : state_.records().calls()) {
    if (call.graph_id == 0) continue;
    Graph& g = graphs[{call.client_id, call.graph_id}];
    if (call.done) {
      g.status.set_calls_done(g.status.calls_done() + 1);
      if (call.failed) g.status.set_calls_failed(g.status.calls_failed() + 1);
    } else {
      g.status.set_calls_running(g.status.calls_running() + 1);
      if (call.routed != absl::InfinitePast()) {
        g.oldest = std::min(g.oldest, call.routed);
      }
    }
  }
  for (auto& [key, g] : graphs) {
    if (g.status.calls_running() == 0) continue;  // done: not in flight
    if (status->graphs_size() == kMaxGraphs) break;
    g.status.set_client_id(key.first);
    g.status.set_graph_id(key.second);
    if (g.oldest != absl::InfiniteFuture()) {
      g.status.set_waited_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(now - g.oldest)));
    }
    *status->add_graphs() = std::move(g.status);
  }
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
  {
    absl::MutexLock lock(&mu_);
    shutdown_requested_ = true;  // a standby stops too
  }
  // On this thread: Shutdown() only marks the server down and cancels the
  // sessions (it never waits on an RPC), and the owner's Wait() returns
  // once it has. The reply therefore means the server is going down, and
  // no thread is left holding `this` when the owner destroys the server
  // (its destructor waits for this handler to return).
  Shutdown();
  return grpc::Status::OK;
}

}  // namespace plexus
