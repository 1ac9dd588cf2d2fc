#include "plexus/sim/sim_cluster.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/protocol.h"
#include "plexus/common/shard_layouts.h"
#include "plexus/common/tls.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/sim/sim_data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/worker/report_queue.h"

namespace plexus::sim {

// One simulated host: a WorkerSession stream driven by gRPC's callback API.
// Its reads and writes complete on gRPC's threads; the cluster's timer
// thread calls Beat, CompleteDue and Flush. One write at a time is in
// flight; the rest queue behind it (out_).
class SimHost final : public grpc::ClientBidiReactor<proto::WorkerToServer,
                                                     proto::ServerToWorker> {
 public:
  SimHost(SimCluster& cluster, int index, bool spare, std::string name)
      : cluster_(cluster),
        index_(index),
        spare_(spare),
        name_(std::move(name)) {}

  // Opens the stream and sends the registration.
  void Begin(proto::Controller::Stub& stub, proto::WorkerToServer hello);
  void Cancel() { context_.TryCancel(); }
  // As a host whose process died: its stream and its ops connection end
  // at once (the server drains the connection's reports before it ends
  // the session, and would wait its drain bound for one left open).
  void Kill();

  void Beat();  // a heartbeat now, and the next one scheduled
  // A heartbeat now answering `request_id` (SendStats; 0: none), off the
  // period.
  void SendBeat(uint64_t request_id);
  void CompleteDue();  // delayed completions whose time has come
  void Flush();        // the gathered CallsDone, as one report

  // --- the server's ops on the data plane (SimOptions::ops_on_frames)
  // One OPS frame's ops (a proto::ServerToWorker), on the connection's
  // thread.
  absl::Status ApplyFramed(std::string& bytes);
  // The ops connection opened: calls done go back on it (a dup of `fd`).
  absl::Status ReportOn(int fd);
  // It ended: reports go on the stream again, and the host ends, as a
  // worker whose server closed its ops connection.
  void OpsEnded(const absl::Status& why);

  const std::string& name() const { return name_; }
  bool spare() const { return spare_; }
  int64_t worker_id() const { return worker_id_.load(); }
  bool serving() const { return registered_.load() && !ended_.load(); }
  // Marks the host dropped; false if it already was.
  bool MarkDropped() { return !dropped_.exchange(true); }
  bool ended() const { return ended_.load(); }

  int64_t executes() const { return executes_.load(); }
  int64_t calls_reported() const { return calls_reported_.load(); }
  int64_t reports() const { return reports_.load(); }
  int64_t heartbeats() const { return heartbeats_.load(); }
  int64_t ops() const { return ops_.load(); }
  int64_t ops_framed() const { return ops_framed_.load(); }
  int64_t reports_framed() const { return reports_framed_.load(); }

  // grpc::ClientBidiReactor
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // A call (or a reported copy) whose report is due at `at`.
  struct Pending {
    absl::Time at;
    uint64_t ticket = 0;  // 0: not admitted (no report) or a copy
    uint64_t copy = 0;    // an Expect's key to report arrived
    int64_t busy_micros = 0;
    std::vector<ShardKey> keys;  // ready once done
  };

  void ApplyFirst();  // the server's first message: id, interval
  // A message's ops, in order (from the stream or an OPS frame).
  void ApplyAll(proto::ServerToWorker& msg);
  void Apply(proto::WorkerOp& op);
  void Arrived(Pending p);  // an Execute or a reported Expect arrived
  void Done(Pending& p);    // its delay is over
  void Release(const proto::Release& release);
  void AnswerTimeline(const proto::CollectTimeline& request);
  // Queues `msg` behind the write in flight, or writes it now; as a
  // REPORTS frame where the ops connection is open (as a real worker's
  // messages, protocol version 3).
  void Send(proto::WorkerToServer msg);
  // `msg` as a REPORTS frame on the ops connection; false if there is none
  // (or the write failed: then there is none from now on).
  bool SendFramed(const proto::WorkerToServer& msg);
  // Takes what `pending_done_` gathered into one CallsDone message.
  bool TakeReportLocked(proto::WorkerToServer* msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SimCluster& cluster_;
  const int index_;
  const bool spare_;
  const std::string name_;
  grpc::ClientContext context_;
  proto::ServerToWorker in_;       // the read in flight
  proto::WorkerToServer writing_;  // the write in flight
  bool first_read_ = true;         // only the read callbacks touch it
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  int64_t delay_micros_ = 0;

  std::atomic<int64_t> worker_id_{-1};
  std::atomic<bool> registered_{false};
  std::atomic<bool> ended_{false};
  std::atomic<bool> dropped_{false};
  std::atomic<int64_t> executes_{0};
  // Where its devices are in the slices' maps (an own-shards Execute names
  // one: common/shard_layouts.h).
  ShardLayouts layouts_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> calls_reported_{0};
  std::atomic<int64_t> reports_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<int64_t> ops_{0};
  std::atomic<int64_t> ops_framed_{0};
  std::atomic<int64_t> reports_framed_{0};
  std::atomic<int64_t> busy_micros_{0};
  std::atomic<uint64_t> generation_{0};  // of its registration

  // The ops connection's socket (a dup), for REPORTS: one write at a time.
  absl::Mutex report_mu_;
  transport::internal::UniqueFd report_fd_ ABSL_GUARDED_BY(report_mu_);
  std::string report_bytes_ ABSL_GUARDED_BY(report_mu_);

  absl::Mutex mu_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<proto::WorkerToServer> out_ ABSL_GUARDED_BY(mu_);
  // Calls done and not yet reported (the batch), and when its first was.
  proto::CallsDone pending_done_ ABSL_GUARDED_BY(mu_);
  bool flush_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  // Delayed completions, in arrival order (the delay is the same for all).
  std::deque<Pending> delayed_ ABSL_GUARDED_BY(mu_);
  // The shards this host holds, by buffer (Release forgets them).
  absl::flat_hash_map<uint64_t, absl::InlinedVector<int32_t, 1>> held_
      ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- SimHost

void SimHost::Begin(proto::Controller::Stub& stub,
                    proto::WorkerToServer hello) {
  delay_micros_ = absl::ToInt64Microseconds(cluster_.options_.delay);
  stub.async()->WorkerSession(&context_, this);
  StartRead(&in_);
  Send(std::move(hello));
  StartCall();
}

void SimHost::Send(proto::WorkerToServer msg) {
  if (SendFramed(msg)) return;
  {
    absl::MutexLock lock(&mu_);
    if (writes_closed_) return;
    if (write_in_flight_) {
      out_.push_back(std::move(msg));
      return;
    }
    write_in_flight_ = true;
  }
  // Only the holder of the in-flight write touches writing_; StartWrite is
  // called with no lock held (its callback may run at once).
  writing_ = std::move(msg);
  StartWrite(&writing_);
}

bool SimHost::SendFramed(const proto::WorkerToServer& msg) {
  absl::MutexLock lock(&report_mu_);
  if (!report_fd_.valid()) return false;
  msg.SerializeToString(&report_bytes_);
  const absl::Status sent = transport::internal::FrameSocket::SendMessageOn(
      report_fd_.get(), transport::internal::FrameType::kReports, report_bytes_,
      generation_.load());
  if (!sent.ok()) {
    SPDLOG_WARN(
        "{}: a report could not go on the ops connection ({}); the "
        "stream takes it",
        name_, sent.ToString());
    report_fd_.Reset();
    return false;
  }
  if (msg.has_calls_done()) reports_framed_++;
  return true;
}

absl::Status SimHost::ApplyFramed(std::string& bytes) {
  // One thread applies a host's frames at a time (the ops poller's, or the
  // connection's first): its message is reused, never shared.
  thread_local proto::ServerToWorker msg;
  if (!msg.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(name_, ": an OPS frame of ",
                                            bytes.size(),
                                            " bytes is not a ServerToWorker"));
  }
  ApplyAll(msg);
  ops_framed_ += msg.ops_size();
  return absl::OkStatus();
}

absl::Status SimHost::ReportOn(int fd) {
  transport::internal::UniqueFd mine(::dup(fd));
  if (!mine.valid()) {
    return transport::internal::IoError("dup of the ops connection", errno);
  }
  absl::MutexLock lock(&report_mu_);
  report_fd_ = std::move(mine);
  return absl::OkStatus();
}

void SimHost::Kill() {
  {
    absl::MutexLock lock(&report_mu_);
    // Every descriptor of the socket sees it: the server's end reads EOF.
    if (report_fd_.valid()) ::shutdown(report_fd_.get(), SHUT_RDWR);
  }
  Cancel();
}

void SimHost::OpsEnded(const absl::Status& why) {
  {
    absl::MutexLock lock(&report_mu_);
    report_fd_.Reset();
  }
  if (!ended_.load()) {
    SPDLOG_INFO("{}: its ops connection ended ({}); ending its session", name_,
                why.ToString());
  }
  Cancel();
}

void SimHost::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      writes_closed_ = true;
      out_.clear();
    }
    if (writes_closed_ || out_.empty()) {
      write_in_flight_ = false;
      return;
    }
    writing_ = std::move(out_.front());
    out_.pop_front();
  }
  StartWrite(&writing_);
}

void SimHost::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is ending: OnDone follows
  if (first_read_) {
    first_read_ = false;
    ApplyFirst();
    if (ended_.load()) return;
  }
  ApplyAll(in_);
  in_.Clear();
  StartRead(&in_);
}

void SimHost::ApplyFirst() {
  if (absl::Status v =
          CheckProtocolVersion("worker", "server", in_.protocol_version());
      !v.ok()) {
    SPDLOG_ERROR("{}: {}", name_, v.ToString());
    context_.TryCancel();
    return;
  }
  worker_id_ = in_.worker_id();
  generation_ = in_.generation();
  cluster_.NoteGeneration(in_.generation(), this);
  heartbeat_interval_ =
      cluster_.options_.heartbeat_interval > absl::ZeroDuration()
          ? cluster_.options_.heartbeat_interval
          : std::max(absl::Milliseconds(in_.heartbeat_interval_ms()),
                     absl::Milliseconds(1));
  registered_ = true;
  // The first beat a fraction of the interval in, by index: the hosts'
  // beats spread over the interval instead of arriving together.
  const absl::Duration offset = heartbeat_interval_ * ((index_ % 64) / 64.0);
  cluster_.Schedule({absl::Now() + heartbeat_interval_ / 2 + offset,
                     SimCluster::Due::kHeartbeat, this});
  cluster_.HostRegistered();
}

void SimHost::OnDone(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    writes_closed_ = true;
    out_.clear();
    delayed_.clear();
  }
  const bool was_registered = registered_.load();
  ended_ = true;
  cluster_.HostEnded(
      absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                   absl::StrCat(name_, ": ", status.error_message())),
      was_registered);
}

void SimHost::ApplyAll(proto::ServerToWorker& msg) {
  for (proto::WorkerOp& op : *msg.mutable_ops()) Apply(op);
  ops_ += msg.ops_size();
}

void SimHost::Apply(proto::WorkerOp& op) {
  switch (op.op_case()) {
    case proto::WorkerOp::kExecute: {
      proto::Execute& exec = *op.mutable_execute();
      executes_++;
      Pending p;
      p.ticket = exec.ticket();
      absl::Status expanded;
      {
        absl::MutexLock lock(&mu_);
        expanded = layouts_.Expand(&exec);
      }
      if (!expanded.ok()) {
        // As a real worker: its outputs fail, naming why; it is reported
        // done (ReportQueue's ticket) so nothing waits for it.
        SPDLOG_ERROR("{}: {}", name_, std::string(expanded.message()));
        for (uint64_t out : exec.output_ids()) {
          cluster_.data_plane_->MarkFailed(out, expanded);
        }
        Arrived(std::move(p));
        break;
      }
      p.busy_micros = delay_micros_ * exec.tasks_size();
      for (const proto::ShardTask& task : exec.tasks()) {
        for (uint64_t out : exec.output_ids()) {
          p.keys.push_back({out, task.shard()});
        }
      }
      Arrived(std::move(p));
      break;
    }
    case proto::WorkerOp::kExpect: {
      const proto::Expect& expect = op.expect();
      Pending p;
      if (expect.report()) p.copy = expect.buffer_id();
      p.keys.push_back({expect.buffer_id(), expect.shard()});
      Arrived(std::move(p));
      break;
    }
    case proto::WorkerOp::kRelease:
      Release(op.release());
      break;
    case proto::WorkerOp::kFail:
      for (uint64_t id : op.fail().buffer_ids()) {
        cluster_.data_plane_->MarkFailed(
            id, absl::Status(
                    static_cast<absl::StatusCode>(op.fail().status().code()),
                    op.fail().status().message()));
      }
      break;
    case proto::WorkerOp::kCollectTimeline:
      AnswerTimeline(op.collect_timeline());
      break;
    case proto::WorkerOp::kSendStats:
      SendBeat(op.send_stats().request_id());
      break;
    case proto::WorkerOp::kShardLayout: {
      absl::MutexLock lock(&mu_);
      layouts_.Add(op.shard_layout());
      break;
    }
    case proto::WorkerOp::kClientGone: {
      absl::MutexLock lock(&mu_);
      layouts_.ForgetClient(op.client_gone().client_id());
      break;
    }
    default:
      // LoadProgram, Transfer, Declare, PeerInfo, PeerDown, ClockEcho, a
      // relayed TransferFailed: nothing to simulate.
      break;
  }
}

void SimHost::Arrived(Pending p) {
  if (delay_micros_ == 0) {
    Done(p);
    return;
  }
  p.at = absl::Now() + cluster_.options_.delay;
  const absl::Time at = p.at;
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = delayed_.empty();
    delayed_.push_back(std::move(p));
  }
  if (first) cluster_.Schedule({at, SimCluster::Due::kComplete, this});
}

void SimHost::CompleteDue() {
  const absl::Time now = absl::Now();
  std::vector<Pending> due;
  absl::Time next = absl::InfinitePast();
  {
    absl::MutexLock lock(&mu_);
    while (!delayed_.empty() && delayed_.front().at <= now) {
      due.push_back(std::move(delayed_.front()));
      delayed_.pop_front();
    }
    if (!delayed_.empty()) next = delayed_.front().at;
  }
  for (Pending& p : due) Done(p);
  if (next != absl::InfinitePast()) {
    cluster_.Schedule({next, SimCluster::Due::kComplete, this});
  }
}

void SimHost::Done(Pending& p) {
  // Ready before it is reported, as a real worker's outputs are.
  cluster_.data_plane_->MarkReady(p.keys);
  bool schedule = false;
  proto::WorkerToServer full;
  bool send_now = false;
  {
    absl::MutexLock lock(&mu_);
    for (const ShardKey& k : p.keys) held_[k.buffer_id].push_back(k.shard);
    if (p.ticket == 0 && p.copy == 0) return;  // nothing to report
    if (p.ticket != 0) {
      pending_done_.add_tickets(p.ticket);
      pending_done_.add_busy_micros(p.busy_micros);
    } else {
      pending_done_.add_copies_done(p.copy);
    }
    busy_micros_ += p.busy_micros;
    if (pending_done_.tickets_size() >= ReportQueue::kReportBatch) {
      send_now = TakeReportLocked(&full);
    } else if (!flush_scheduled_) {
      flush_scheduled_ = schedule = true;
    }
  }
  if (send_now) Send(std::move(full));
  if (schedule) {
    cluster_.Schedule({absl::Now() + ReportQueue::kReportDelay,
                       SimCluster::Due::kFlush, this});
  }
}

bool SimHost::TakeReportLocked(proto::WorkerToServer* msg) {
  if (pending_done_.tickets().empty() && pending_done_.copies_done().empty()) {
    return false;
  }
  calls_reported_ += pending_done_.tickets_size();
  reports_++;
  msg->mutable_calls_done()->Swap(&pending_done_);
  return true;
}

void SimHost::Flush() {
  proto::WorkerToServer msg;
  bool send;
  {
    absl::MutexLock lock(&mu_);
    flush_scheduled_ = false;
    send = TakeReportLocked(&msg);
  }
  if (send) Send(std::move(msg));
}

void SimHost::Release(const proto::Release& release) {
  std::vector<ShardKey> gone;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : release.buffer_ids()) {
      auto it = held_.find(id);
      if (it == held_.end()) continue;
      for (int32_t shard : it->second) gone.push_back({id, shard});
      held_.erase(it);
    }
  }
  if (!gone.empty()) cluster_.data_plane_->Forget(gone);
}

void SimHost::AnswerTimeline(const proto::CollectTimeline& request) {
  proto::WorkerToServer msg;
  proto::TimelineChunk* chunk = msg.mutable_timeline();
  chunk->set_request_id(request.request_id());
  chunk->set_last(true);
  proto::TimelineRing* ring = chunk->mutable_ring();
  ring->set_process(absl::StrCat("worker ", worker_id_.load()));
  ring->set_worker_id(worker_id_.load());
  ring->set_host_name(name_);
  ring->set_num_devices(cluster_.options_.devices_per_host);
  ring->set_offset_error_ns(-1);
  ring->set_pid(getpid());
  Send(std::move(msg));
}

void SimHost::Beat() {
  if (ended_.load()) return;
  SendBeat(0);  // (the server keeps the highest request answered)
  cluster_.Schedule(
      {absl::Now() + heartbeat_interval_, SimCluster::Due::kHeartbeat, this});
}

void SimHost::SendBeat(uint64_t request_id) {
  if (ended_.load()) return;
  proto::WorkerToServer msg;
  proto::WorkerStats* stats = msg.mutable_heartbeat();
  const int devices = cluster_.options_.devices_per_host;
  int64_t pending;
  int64_t live;
  {
    absl::MutexLock lock(&mu_);
    pending = static_cast<int64_t>(delayed_.size());
    live = static_cast<int64_t>(held_.size());
  }
  stats->set_live_buffers(live);
  stats->set_calls_executed(executes_.load());
  for (int d = 0; d < devices; ++d) {
    stats->add_device_live_bytes(0);
    stats->add_device_peak_bytes(0);
    stats->add_device_busy_micros(busy_micros_.load() / devices);
    stats->add_device_waiting_bytes(0);
    stats->add_device_tasks_pending(d == 0 ? pending : 0);
  }
  stats->set_answers(request_id);
  stats->mutable_clock()->set_sent_ns(absl::GetCurrentTimeNanos());
  heartbeats_++;
  Send(std::move(msg));
}

// ---------------------------------------------------------------- SimCluster

SimCluster::SimCluster(SimOptions options)
    : options_(std::move(options)), machine_id_(LocalMachineId()) {}

absl::StatusOr<std::unique_ptr<SimCluster>> SimCluster::Start(
    SimOptions options) {
  if (options.hosts < 1 || options.spares < 0 || options.devices_per_host < 1 ||
      options.hosts_per_channel < 1 || options.registering_at_once < 1) {
    return absl::InvalidArgumentError(
        "a simulated cluster needs at least 1 host of at least 1 device, "
        "no negative spares, and at least 1 host per channel and per "
        "registration wave");
  }
  std::unique_ptr<SimCluster> cluster(new SimCluster(std::move(options)));
  if (absl::Status s = cluster->StartHosts(); !s.ok()) return s;
  return cluster;
}

absl::Status SimCluster::StartHosts() {
  const int total = options_.hosts + options_.spares;
  data_plane_ = std::make_unique<SimDataPlane>(
      options_.secret,
      options_.ops_on_frames ? OpsSink() : SimDataPlane::OpsSink{});
  if (options_.ops_on_frames) {
    absl::StatusOr<std::unique_ptr<transport::FramePoller>> poller =
        transport::FramePoller::Start(transport::PolledFrames::kOps,
                                      "plexus-sim-ops", "the server");
    if (!poller.ok()) return poller.status();
    ops_poller_ = *std::move(poller);
  }
  transport::DataPlaneServerOptions dp;
  dp.unix_name = absl::StrCat("plexus-sim-", getpid());
  // The server's ops connection per host; a client waiting on a future of
  // every host opens one connection each.
  dp.max_connections = 3 * total + 64;
  absl::StatusOr<std::unique_ptr<transport::DataPlaneServer>> server =
      transport::DataPlaneServer::Start(dp, data_plane_.get(), &data_counters_);
  if (!server.ok()) return server.status();
  data_server_ = *std::move(server);
  timer_ = std::thread([this] { TimerLoop(); });

  for (int c = 0; c * options_.hosts_per_channel < total; ++c) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        SessionChannel(options_.server_address, /*ca_file=*/"");
    if (!channel.ok()) return channel.status();
    stubs_.push_back(proto::Controller::NewStub(*channel));
  }
  for (int i = 0; i < total; ++i) {
    const bool spare = i >= options_.hosts;
    hosts_.push_back(std::make_unique<SimHost>(
        *this, i, spare, absl::StrCat(options_.host_prefix, i)));
  }
  {
    absl::MutexLock lock(&mu_);
    started_at_ = absl::Now();
  }
  StartMore();
  return absl::OkStatus();
}

proto::WorkerToServer SimCluster::Registration(const SimHost& host) const {
  proto::WorkerToServer hello;
  proto::RegisterWorker* reg = hello.mutable_register_();
  reg->set_host_name(host.name());
  reg->set_machine_id(machine_id_);
  reg->set_pid(getpid());
  for (int d = 0; d < options_.devices_per_host; ++d) {
    proto::DeviceInfo* info = reg->add_devices();
    info->set_index(d);
    info->set_kind("cpu");
    info->set_memory_bytes(options_.memory_bytes);
  }
  reg->set_data_address(data_server_->tcp_address());
  reg->set_unix_path(data_server_->unix_path());
  reg->set_spare(host.spare());
  reg->set_ops_on_data_plane(options_.ops_on_frames);
  const Credential credential = options_.secret.Derive(CredentialRole::kWorker);
  reg->set_credential(credential.data(), credential.size());
  reg->set_protocol_version(kProtocolVersion);
  return hello;
}

void SimCluster::StartMore() {
  std::vector<int> start;
  {
    absl::MutexLock lock(&mu_);
    while (!stopping_ && next_to_start_ < static_cast<int>(hosts_.size()) &&
           registering_ < options_.registering_at_once) {
      start.push_back(next_to_start_++);
      registering_++;
    }
  }
  for (int i : start) {
    SimHost& host = *hosts_[i];
    host.Begin(*stubs_[i / options_.hosts_per_channel], Registration(host));
  }
}

void SimCluster::HostRegistered() {
  {
    absl::MutexLock lock(&mu_);
    registered_++;
    registering_--;
    if (registered_ == static_cast<int64_t>(hosts_.size())) {
      all_registered_at_ = absl::Now();
    }
  }
  StartMore();
}

void SimCluster::HostEnded(const absl::Status& why, bool registered) {
  {
    absl::MutexLock lock(&mu_);
    ended_++;
    if (!registered) {
      registering_--;
      if (first_refusal_.ok() && !stopping_) {
        first_refusal_ = why.ok() ? absl::UnavailableError(absl::StrCat(
                                        why.message(), " (ended at once)"))
                                  : why;
      }
    }
  }
  if (!registered) StartMore();
}

SimCluster::~SimCluster() { Shutdown(); }

absl::Status SimCluster::AwaitRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registered_ == static_cast<int64_t>(hosts_.size()) ||
           !first_refusal_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        registered_, " of ", hosts_.size(),
        " simulated hosts registered within ", absl::FormatDuration(timeout)));
  }
  return first_refusal_;
}

absl::Duration SimCluster::registration_time() const {
  absl::MutexLock lock(&mu_);
  return all_registered_at_ - started_at_;
}

absl::StatusOr<std::pair<std::string, int64_t>> SimCluster::DropHost() {
  for (auto& host : hosts_) {
    if (host->spare() || !host->serving() || !host->MarkDropped()) continue;
    SPDLOG_INFO("dropping simulated host {} (worker {})", host->name(),
                host->worker_id());
    host->Kill();
    return std::make_pair(host->name(), host->worker_id());
  }
  return absl::NotFoundError("no simulated host left to drop");
}

void SimCluster::Shutdown(absl::Duration grace) {
  int started;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    started = next_to_start_;
    timer_wake_.Signal();
  }
  if (timer_.joinable()) timer_.join();
  if (data_plane_) data_plane_->Shutdown();
  for (int i = 0; i < started; ++i) hosts_[i]->Cancel();
  bool all_ended;
  {
    absl::MutexLock lock(&mu_);
    auto ended = [this, started]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ >= started;
    };
    all_ended = mu_.AwaitWithTimeout(absl::Condition(&ended), grace);
  }
  data_server_.reset();
  ops_poller_.reset();  // no host's op is applied after
  if (!all_ended) {
    // A reactor gRPC may still call back into must outlive it.
    SPDLOG_WARN("some simulated hosts' streams did not end within {}",
                absl::FormatDuration(grace));
    for (auto& host : hosts_) host.release();
  }
}

SimCounters SimCluster::counters() const {
  SimCounters c;
  {
    absl::MutexLock lock(&mu_);
    c.registered = registered_;
    c.ended = ended_;
  }
  for (const auto& host : hosts_) {
    if (host == nullptr) continue;
    c.executes += host->executes();
    c.calls_reported += host->calls_reported();
    c.reports += host->reports();
    c.heartbeats += host->heartbeats();
    c.ops += host->ops();
    c.ops_framed += host->ops_framed();
    c.reports_framed += host->reports_framed();
  }
  if (data_plane_) c.keys_held = data_plane_->keys_held();
  c.ops_connections = ops_connections_.load();
  c.ops_connections_polled = ops_connections_polled_.load();
  return c;
}

SimDataPlane::OpsSink SimCluster::OpsSink() {
  SimDataPlane::OpsSink sink;
  sink.opened = [this](uint64_t generation, int fd) -> absl::Status {
    SimHost* host = HostOf(generation);
    if (host == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "no simulated host registered under generation ", generation));
    }
    return host->ReportOn(fd);
  };
  sink.apply = [this](uint64_t generation, std::string& bytes) {
    SimHost* host = HostOf(generation);
    if (host == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "no simulated host registered under generation ", generation));
    }
    return host->ApplyFramed(bytes);
  };
  // Every host's later frames on the poller's one thread: a thread per
  // connection woke once per host per write of the server's, and the
  // server paid each wake-up in its sends (try_to_wake_up), a cost a real
  // worker's on another machine does not put on it.
  sink.take = [this](uint64_t generation, int fd) {
    ops_connections_++;
    SimHost* host = HostOf(generation);
    if (host == nullptr || ops_poller_ == nullptr) return false;
    transport::internal::UniqueFd mine(::dup(fd));
    if (!mine.valid()) return false;
    const absl::Status added = ops_poller_->Add(
        static_cast<int64_t>(generation), mine.Release(),
        [host](std::string& bytes) { return host->ApplyFramed(bytes); },
        [host](const absl::Status& why) { host->OpsEnded(why); }, generation);
    if (!added.ok()) {
      SPDLOG_WARN("{}: its ops stay on the connection's thread: {}",
                  host->name(), added.ToString());
      return false;
    }
    ops_connections_polled_++;
    return true;
  };
  sink.ended = [this](uint64_t generation, const absl::Status& why) {
    SimHost* host;
    {
      absl::MutexLock lock(&mu_);
      auto it = by_generation_.find(generation);
      host = it == by_generation_.end() ? nullptr : it->second;
    }
    if (host != nullptr) host->OpsEnded(why);
  };
  return sink;
}

void SimCluster::NoteGeneration(uint64_t generation, SimHost* host) {
  absl::MutexLock lock(&mu_);
  by_generation_[generation] = host;
}

SimHost* SimCluster::HostOf(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto known = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || by_generation_.contains(generation);
  };
  mu_.AwaitWithTimeout(absl::Condition(&known), kGenerationWait);
  auto it = by_generation_.find(generation);
  return stopping_ || it == by_generation_.end() ? nullptr : it->second;
}

void SimCluster::Schedule(Timed t) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  heap_.push_back(t);
  std::push_heap(heap_.begin(), heap_.end(), std::greater<Timed>());
  if (heap_.front().at == t.at && heap_.front().host == t.host) {
    timer_wake_.Signal();
  }
}

void SimCluster::TimerLoop() {
  mu_.Lock();
  while (!stopping_) {
    if (heap_.empty()) {
      timer_wake_.Wait(&mu_);
      continue;
    }
    const absl::Time at = heap_.front().at;
    if (at > absl::Now()) {
      timer_wake_.WaitWithDeadline(&mu_, at);
      continue;
    }
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<Timed>());
    const Timed due = heap_.back();
    heap_.pop_back();
    mu_.Unlock();
    switch (due.what) {
      case Due::kHeartbeat:
        due.host->Beat();
        break;
      case Due::kComplete:
        due.host->CompleteDue();
        break;
      case Due::kFlush:
        due.host->Flush();
        break;
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace plexus::sim
