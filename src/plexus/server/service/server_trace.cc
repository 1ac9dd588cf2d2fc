// ServerImpl: the timeline — the server's own events, the clock offsets of
// its workers (from their heartbeats' probes) and the Trace RPC, which
// collects every process's ring (timeline/timeline.h).
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/server/service/internal/server_impl.h"
#include "plexus/timeline/clock_offset.h"
#include "plexus/timeline/timeline_proto.h"

namespace plexus {

void ServerImpl::RecordCallDoneLocked(uint64_t seq, bool failed,
                                      int64_t now_ns) {
  const CallRecord* rec = state_.records().FindCall(seq);
  if (rec == nullptr || rec->done) return;
  TimelineEvent e;
  e.kind = EventKind::kCall;
  e.start_ns = absl::ToUnixNanos(rec->routed + options_.timeline_skew);
  e.end_ns = now_ns;
  e.client_id = rec->client_id;
  e.call_id = rec->call_id;
  e.program_id = rec->program_id;
  e.buffer_id = rec->output_ids.empty() ? 0 : rec->output_ids.front();
  e.label = rec->site;
  e.graph_id = rec->graph_id;
  e.failed = failed;
  timeline_.Record(e);
}

void ServerImpl::RecordAdmitted(uint64_t client, const AdmissionUnit& unit,
                                int64_t now_ns) {
  TimelineEvent e;
  e.kind = EventKind::kAdmissionWait;
  e.start_ns = unit.routed_ns;
  e.end_ns = now_ns;
  e.client_id = client;
  e.program_id = unit.program_id;
  e.bytes = unit.charged_micros;  // kAdmissionWait: µs charged (timeline.h)
  if (unit.executes != nullptr) e.call_id = unit.executes->call_id();
  for (const auto& [w, ops] : unit.ops) {
    if (e.call_id != 0) break;
    for (const proto::WorkerOp& op : ops) {
      if (op.has_execute()) {
        e.call_id = op.execute().call_id();
        break;
      }
    }
    if (e.call_id != 0) break;
  }
  timeline_.Record(e);
}

void ServerImpl::RecordRecovery(absl::string_view step, int64_t start_ns,
                                int64_t worker, uint64_t client) {
  if (!timeline_.enabled()) return;
  TimelineEvent e;
  e.kind = EventKind::kRecovery;
  e.start_ns = start_ns;
  e.end_ns = timeline_.NowNs();
  e.peer = worker;
  e.client_id = client;
  e.label = timeline_.Intern(step);
  timeline_.Record(e);
}

void ServerImpl::RecordResize(uint64_t client_id, int64_t start_ns,
                              const std::string& what) {
  if (!timeline_.enabled()) return;
  TimelineEvent e;
  e.kind = EventKind::kResize;
  e.start_ns = start_ns;
  e.end_ns = timeline_.NowNs();
  e.client_id = client_id;
  e.label = timeline_.Intern(what);
  timeline_.Record(e);
}

void ServerImpl::OnClockProbe(int64_t worker, const proto::ClockProbe& probe,
                              int64_t read_ns) {
  if (probe.t4() != 0) {
    absl::MutexLock lock(&clock_mu_);
    clock_offsets_[worker].Add({.t1 = probe.t1(),
                                .t2 = probe.t2(),
                                .t3 = probe.t3(),
                                .t4 = probe.t4()});
  }
  if (probe.sent_ns() == 0) return;  // a worker that sends no probes
  proto::WorkerOp op;
  proto::ClockEcho* echo = op.mutable_clock_echo();
  echo->set_t1(probe.sent_ns());
  echo->set_t2(read_ns);
  echo->set_t3(timeline_.NowNs());
  scheduler_.Send(worker, std::move(op));
}

void ServerImpl::OnTimelineChunk(int64_t worker, proto::TimelineChunk& chunk) {
  absl::MutexLock lock(&trace_mu_);
  auto it = traces_.find(chunk.request_id());
  if (it == traces_.end()) return;  // it timed out
  it->second.rings[worker].push_back(std::move(*chunk.mutable_ring()));
  if (chunk.last()) {
    it->second.waiting.erase(worker);
    if (it->second.waiting.empty()) trace_answered_.SignalAll();
  }
}

void ServerImpl::ForgetTimelineOf(int64_t worker) {
  {
    absl::MutexLock lock(&clock_mu_);
    clock_offsets_.erase(worker);
  }
  absl::MutexLock lock(&trace_mu_);
  for (auto& [id, pending] : traces_) {
    if (pending.waiting.erase(worker) > 0 && pending.waiting.empty()) {
      trace_answered_.SignalAll();
    }
  }
}

namespace {

// Keeps the events of `client` and of no client (recovery steps).
void KeepClient(uint64_t client, proto::TimelineRing* ring) {
  auto* events = ring->mutable_events();
  int out = 0;
  for (int i = 0; i < events->size(); ++i) {
    const uint64_t c = events->Get(i).client_id();
    if (c == client || c == 0) events->SwapElements(out++, i);
  }
  while (events->size() > out) events->RemoveLast();
}

// One ring of `reply`, made of a process's chunks (the first one's header,
// every chunk's events).
proto::TimelineRing* AddMergedRing(std::vector<proto::TimelineRing>& chunks,
                                   proto::TraceReply* reply) {
  proto::TimelineRing* ring = reply->add_rings();
  *ring = std::move(chunks.front());
  for (size_t i = 1; i < chunks.size(); ++i) {
    for (proto::TimelineEvent& e : *chunks[i].mutable_events()) {
      *ring->add_events() = std::move(e);
    }
  }
  return ring;
}

}  // namespace

grpc::Status ServerImpl::Trace(grpc::ServerContext* ctx,
                               const proto::TraceRequest* request,
                               proto::TraceReply* reply) {
  reply->set_server_now_ns(timeline_.NowNs());
  if (!request->events()) return grpc::Status::OK;
  if (grpc::Status refused = CheckTraceCredential(ctx, *request);
      !refused.ok()) {
    return refused;
  }
  const uint64_t only = request->client_id();
  const int64_t since = request->since_ns();
  // The server's ring, first.
  {
    std::vector<proto::TimelineRing> own = RingChunks(timeline_, since);
    proto::TimelineRing* ring = AddMergedRing(own, reply);
    ring->set_process("server");
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    ring->set_host_name(host);
    ring->set_pid(getpid());
  }
  std::vector<TraceTarget> asked = NamesAndWorkersToAsk(only, reply);
  const absl::Duration timeout = request->timeout_ms() > 0
                                     ? absl::Milliseconds(request->timeout_ms())
                                     : absl::Seconds(10);
  PendingTrace answered = CollectWorkerRings(asked, since, timeout);
  for (const TraceTarget& a : asked) {
    if (answered.waiting.count(a.id) > 0) {
      reply->add_missing(absl::StrCat("worker ", a.id, " (", a.host,
                                      "): no answer within ",
                                      absl::FormatDuration(timeout)));
      continue;
    }
    auto& chunks = answered.rings[a.id];
    if (chunks.empty()) continue;  // its session ended meanwhile
    proto::TimelineRing* ring = AddMergedRing(chunks, reply);
    ring->set_process(absl::StrCat("worker ", a.id));
    ring->set_worker_id(a.id);
    ring->set_host_name(a.host);
    ring->set_num_devices(a.devices);
    ring->set_pid(a.pid);
    ring->set_offset_ns(a.offset_ns);
    ring->set_offset_error_ns(a.offset_error_ns);
  }
  if (only != 0) {
    for (proto::TimelineRing& ring : *reply->mutable_rings()) {
      KeepClient(only, &ring);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ServerImpl::CheckTraceCredential(
    grpc::ServerContext* ctx, const proto::TraceRequest& request) const {
  // The operator reads every client's events; a client its own.
  const std::string& credential = request.credential();
  const auto* bytes = reinterpret_cast<const uint8_t*>(credential.data());
  const uint64_t only = request.client_id();
  const bool allowed = only == 0
                           ? secret_.Verify(CredentialRole::kAdmin, uint64_t{0},
                                            bytes, credential.size())
                           : secret_.Verify(CredentialRole::kClient, only,
                                            bytes, credential.size());
  if (allowed) return grpc::Status::OK;
  SPDLOG_WARN("refused a trace request from {}: {} credential", ctx->peer(),
              credential.empty() ? "no" : "a wrong");
  return grpc::Status(
      grpc::PERMISSION_DENIED,
      only == 0 ? "the timeline needs the operator's credential (plexus "
                  "trace: --secret-file, $PLEXUS_CLUSTER_SECRET or the "
                  "cluster `plexus up` started) or a client's own "
                  "(client.trace())"
                : absl::StrCat("the credential is not client ", only, "'s"));
}

std::vector<ServerImpl::TraceTarget> ServerImpl::NamesAndWorkersToAsk(
    uint64_t only, proto::TraceReply* reply) {
  std::vector<TraceTarget> asked;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [cid, client] : state_.clients()) {
      if (only != 0 && cid != only) continue;
      for (const auto& [pid, program] : client.programs) {
        proto::ProgramName* n = reply->add_programs();
        n->set_client_id(cid);
        n->set_program_id(pid);
        n->set_name(program.def.name());
      }
      for (const auto& [site, text] : client.call_sites) {
        proto::ClientCallSite* s = reply->add_sites();
        s->set_client_id(cid);
        s->set_site(site);
        s->set_text(text);
      }
    }
    for (const auto& [wid, w] : state_.workers()) {
      if (w.alive) {
        asked.push_back({.id = wid,
                         .host = w.info.host_name(),
                         .devices = w.info.devices_size(),
                         .pid = w.info.pid()});
      }
    }
  }
  absl::MutexLock lock(&clock_mu_);
  for (TraceTarget& a : asked) {
    auto it = clock_offsets_.find(a.id);
    if (it == clock_offsets_.end()) continue;  // 0, error -1: none yet
    a.offset_ns = it->second.offset_ns();
    a.offset_error_ns = it->second.error_ns();
  }
  return asked;
}

ServerImpl::PendingTrace ServerImpl::CollectWorkerRings(
    const std::vector<TraceTarget>& asked, int64_t since,
    absl::Duration timeout) {
  uint64_t request_id;
  {
    absl::MutexLock lock(&trace_mu_);
    request_id = ++next_trace_;
    PendingTrace& pending = traces_[request_id];
    for (const TraceTarget& a : asked) pending.waiting.insert(a.id);
  }
  for (const TraceTarget& a : asked) {
    proto::WorkerOp op;
    op.mutable_collect_timeline()->set_request_id(request_id);
    // The worker's clock: the server's time less its offset, widened by
    // the offset's error bound.
    op.mutable_collect_timeline()->set_since_ns(
        SinceOnOtherClock(since, a.offset_ns, a.offset_error_ns));
    scheduler_.Send(a.id, std::move(op));
  }
  const absl::Time deadline = options_.clock->Now() + timeout;
  absl::MutexLock lock(&trace_mu_);
  PendingTrace& pending = traces_[request_id];
  while (!pending.waiting.empty() &&
         !options_.clock->AwaitWithDeadline(&trace_mu_, &trace_answered_,
                                            deadline)) {
  }
  PendingTrace answered = std::move(pending);
  traces_.erase(request_id);
  return answered;
}

}  // namespace plexus
