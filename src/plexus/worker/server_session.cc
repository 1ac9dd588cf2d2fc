#include "plexus/worker/server_session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/protocol.h"
#include "plexus/common/thread_name.h"
#include "plexus/common/tls.h"
#include "plexus/timeline/timeline_proto.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/worker/frame_arena.h"
#include "plexus/worker/ops_inbox.h"

namespace plexus {
namespace {

// Why `channel` did not connect, as gRPC last saw it (a refused
// connection, a TLS handshake that failed and why, a name that does not
// resolve): a call that does not wait for the connection fails with it.
// Empty if it connected meanwhile.
std::string WhyNotConnected(const std::shared_ptr<grpc::Channel>& channel) {
  std::unique_ptr<proto::Controller::Stub> stub =
      proto::Controller::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(false);
  // Real time: a deadline handed to gRPC.
  ctx.set_deadline(
      absl::ToChronoTime(Clock::Real()->Now() + absl::Milliseconds(500)));
  proto::StatusRequest request;
  request.set_why_after_ms(-1);
  proto::ClusterStatus status;
  const grpc::Status s = stub->GetStatus(&ctx, request, &status);
  return s.ok() ? "" : s.error_message();
}

}  // namespace

ServerSession::ServerSession(const WorkerOptions& options, WorkerIdentity& me,
                             Timeline& timeline, ReportQueue& reports)
    : options_(options), me_(me), timeline_(timeline), reports_(reports) {}

ServerSession::~ServerSession() {
  Shutdown();
  Join();
  absl::MutexLock lock(&report_mu_);
  absl::MutexLock fd(&fd_mu_);
  if (report_fd_ >= 0) ::close(report_fd_);
}

absl::Status ServerSession::Connect(
    proto::WorkerToServer hello, const std::string& bound_address,
    std::function<void(proto::ServerToWorker&)> apply,
    std::function<proto::WorkerStats()> stats) {
  apply_ = std::move(apply);
  stats_ = std::move(stats);
  proto::ServerToWorker first;
  if (absl::Status s = Register(hello, &first); !s.ok()) return s;
  me_.generation = first.generation();
  resumed_ = first.resumed();
  heartbeat_interval_ =
      options_.heartbeat_interval > absl::ZeroDuration()
          ? options_.heartbeat_interval
          : std::max(absl::Milliseconds(first.heartbeat_interval_ms()),
                     absl::Milliseconds(1));
  const proto::RegisterWorker& reg = hello.register_();
  SPDLOG_INFO(
      "registered as worker {}, generation {} ({} device(s), data plane {}{} "
      "{}, heartbeat every {})",
      first.worker_id(), first.generation(), reg.devices_size(),
      reg.data_address(),
      reg.data_address() == bound_address
          ? ""
          : absl::StrCat(" bound at ", bound_address),
      reg.unix_path(), absl::FormatDuration(heartbeat_interval_));
  if (!first.rejoined().empty()) {
    SPDLOG_WARN("rejoined as a fresh host: {}", first.rejoined());
  }
  apply_(first);
  NoteOpsMoved(first);
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

absl::Status ServerSession::Reconnect(proto::WorkerToServer hello,
                                      const std::string& bound_address) {
  Join();
  {
    absl::MutexLock lock(&mu_);
    done_ = false;
    end_status_ = absl::OkStatus();
    writer_done_ = false;
    framed_generation_ = 0;
    framed_closed_ = 0;
    framed_end_ = absl::OkStatus();
  }
  {
    absl::MutexLock lock(&write_mu_);
    writes_done_ = false;
  }
  {
    absl::MutexLock lock(&beat_mu_);
    beat_stop_ = false;
    // Request ids are the server session's: a new one counts from 1.
    stats_asked_ = 0;
    stats_answered_ = 0;
  }
  reports_.Reopen();
  stream_.reset();
  return Connect(std::move(hello), bound_address, std::move(apply_),
                 std::move(stats_));
}

absl::Status ServerSession::Register(proto::WorkerToServer& hello,
                                     proto::ServerToWorker* first) {
  // Each registration is a channel of its own: no reconnect back-off
  // inherited from an earlier one (WorkerHost keeps its own).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SessionChannel(options_.server_address, options_.tls_ca);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  // gRPC waits in real time (it cannot run on an injected clock): the
  // timeout goes as a span, which gRPC starts on its own clock.
  if (!channel_->WaitForConnected(gpr_time_from_millis(
          absl::ToInt64Milliseconds(options_.connect_timeout), GPR_TIMESPAN))) {
    const std::string why = WhyNotConnected(channel_);
    return absl::UnavailableError(absl::StrCat("cannot reach the server at ",
                                               options_.server_address,
                                               why.empty() ? "" : ": ", why));
  }
  stub_ = proto::Controller::NewStub(channel_);
  {
    absl::MutexLock lock(&mu_);
    context_ = std::make_unique<grpc::ClientContext>();
  }
  stream_ = stub_->WorkerSession(context_.get());
  proto::RegisterWorker* reg = hello.mutable_register_();
  const Credential credential = me_.secret.Derive(CredentialRole::kWorker);
  reg->set_credential(credential.data(), credential.size());
  reg->set_protocol_version(kProtocolVersion);
  if (!stream_->Write(hello)) {
    return absl::UnavailableError("the server closed the session at once");
  }
  if (!stream_->Read(first)) {
    grpc::Status why = stream_->Finish();
    return absl::Status(
        static_cast<absl::StatusCode>(why.error_code()),
        absl::StrCat("the server refused the registration: ",
                     why.error_message().empty() ? "no reason given"
                                                 : why.error_message()));
  }
  if (absl::Status v =
          CheckProtocolVersion("worker", "server", first->protocol_version());
      !v.ok()) {
    context_->TryCancel();
    proto::ServerToWorker rest;
    while (stream_->Read(&rest)) {
    }
    stream_->Finish().IgnoreError();
    return v;
  }
  return absl::OkStatus();
}

absl::Status ServerSession::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return end_status_;
}

void ServerSession::Shutdown() {
  StopHeartbeats();
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    session_end_.SignalAll();  // FramedOpsEnded's wait is over
    if (done_) return;
    EndLocked(absl::CancelledError("worker shut down"));
    if (context_ != nullptr) context_->TryCancel();
  }
  reports_.Close();  // the writer stops
}

void ServerSession::Join() {
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  // A frame being applied finishes first (the session's end refuses the
  // next).
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return framed_applying_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

void ServerSession::EndLocked(absl::Status why) {
  done_ = true;
  end_status_ = std::move(why);
  if (me_.generation != 0) {
    ended_generations_.push_back(me_.generation);
    // A frame of an older one is refused as well (ApplyFramed); a few
    // sessions back is all a late connection can be.
    if (ended_generations_.size() > 16) {
      ended_generations_.erase(ended_generations_.begin());
    }
  }
  framed_generation_ = 0;
  session_end_.SignalAll();
  // A report blocked on the ops connection wakes (its send fails); the
  // descriptor is closed when replaced or with the session object.
  absl::MutexLock fd(&fd_mu_);
  if (report_fd_ >= 0) ::shutdown(report_fd_, SHUT_RDWR);
}

void ServerSession::NoteOpsMoved(const proto::ServerToWorker& msg) {
  if (!msg.ops_on_data_plane()) return;
  absl::MutexLock lock(&mu_);
  if (done_) return;
  framed_generation_ = me_.generation;
  SPDLOG_INFO("the server's ops now come on the data plane (generation {})",
              me_.generation);
}

absl::Status ServerSession::ApplyFramed(uint64_t generation,
                                        const std::string& bytes) {
  {
    absl::MutexLock lock(&mu_);
    // The stream's last message may still be on its way: its reader
    // applies it first.
    auto decided = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shut_down_ || framed_generation_ == generation ||
             std::find(ended_generations_.begin(), ended_generations_.end(),
                       generation) != ended_generations_.end();
    };
    mu_.Await(absl::Condition(&decided));
    if (done_ || framed_generation_ != generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ops of registration generation ", generation, " refused: ",
          shut_down_ ? "the worker is shutting down" : "that session ended"));
    }
    ++framed_applying_;
  }
  absl::Status status;
  // Parsed onto an arena of its own: its calls' Execute ops are kept with
  // a share of it, not copied out (frame_arena.h).
  std::shared_ptr<google::protobuf::Arena> arena =
      FrameArena::ForFrame(bytes.size());
  auto* msg = google::protobuf::Arena::CreateMessage<proto::ServerToWorker>(
      arena.get());
  if (msg->ParseFromString(bytes)) {
    FrameArena::Applying applying(arena);
    apply_(*msg);
    framed_messages_.fetch_add(1, std::memory_order_relaxed);
  } else {
    status = absl::DataLossError(
        absl::StrCat("an OPS frame of ", bytes.size(),
                     " bytes is not a ServerToWorker message"));
  }
  absl::MutexLock lock(&mu_);
  --framed_applying_;
  return status;
}

void ServerSession::FramedOpsEnded(uint64_t generation,
                                   const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  // Every frame it carried was applied: the stream's end may go on.
  framed_closed_ = generation;
  session_end_.SignalAll();
  auto ended = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shut_down_ || framed_generation_ != generation ||
           std::find(ended_generations_.begin(), ended_generations_.end(),
                     generation) != ended_generations_.end();
  };
  // The server ends the stream as it closes this connection (it ended the
  // session, or it is gone): the stream says how. Only a stream that stays
  // up past the grace is ended here.
  const absl::Time deadline = options_.clock->Now() + kFramedEndGrace;
  while (!ended()) {
    if (options_.clock->AwaitWithDeadline(&mu_, &session_end_, deadline)) {
      break;
    }
  }
  if (ended()) return;
  framed_end_ = absl::UnavailableError(
      absl::StrCat("the server's ops connection closed (", why.ToString(),
                   ") and its stream stayed up for ",
                   absl::FormatDuration(kFramedEndGrace)));
  SPDLOG_WARN("{}; ending the session", std::string(framed_end_.message()));
  if (context_ != nullptr) context_->TryCancel();
}

void ServerSession::StopHeartbeats() {
  absl::MutexLock lock(&beat_mu_);
  beat_stop_ = true;
  beat_wake_.SignalAll();
}

void ServerSession::ReaderLoop() {
  SetThreadName("plexus-reader");
  // Read here, applied in order on a thread of their own (ops_inbox.h
  // says why: an op that waits must not stop this thread's reads).
  OpsInbox inbox;
  std::thread applier([this, &inbox] {
    SetThreadName("plexus-apply");
    proto::ServerToWorker msg;
    while (inbox.Pop(&msg)) {
      apply_(msg);
      NoteOpsMoved(msg);
    }
  });
  proto::ServerToWorker msg;
  while (stream_->Read(&msg)) inbox.Push(std::move(msg));
  inbox.Close();
  applier.join();  // every message read is applied before the end
  {
    // The ops the server wrote as frames before it ended the session are
    // applied first, as the stream's own would have been: it shuts the
    // connection as it ends the session, so its end follows them (a
    // worker stopped past its deadline applies them as it wakes, and its
    // late pushes are fenced). Bounded, for a server that did not.
    absl::MutexLock lock(&mu_);
    const uint64_t framed = framed_generation_;
    const absl::Time deadline = options_.clock->Now() + kFramedDrain;
    while (framed != 0 && !done_ && !shut_down_ && framed_closed_ != framed) {
      if (options_.clock->AwaitWithDeadline(&mu_, &session_end_, deadline)) {
        break;
      }
    }
  }
  StopHeartbeats();
  reports_.Close();  // the writer stops
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&writer_done_));
  }
  // Both directions are closed: Finish says how the session ended. The
  // server cancels it on purpose when it shuts down (or gave up on this
  // worker); anything else means it vanished.
  const grpc::Status how = stream_->Finish();
  absl::MutexLock lock(&mu_);
  if (!done_) {
    if (!framed_end_.ok()) {
      EndLocked(framed_end_);
    } else if (how.error_code() == grpc::StatusCode::CANCELLED) {
      EndLocked(absl::CancelledError("the server ended the session"));
    } else {
      EndLocked(absl::UnavailableError(absl::StrCat(
          "the server closed the session: ", how.error_message())));
    }
    SPDLOG_INFO("server session ended ({}); shutting down",
                end_status_.ToString());
  }
}

void ServerSession::WriterLoop() {
  SetThreadName("plexus-writer");
  while (true) {
    std::vector<proto::WorkerToServer> out;
    if (!reports_.AwaitReports(&out)) break;
    bool written = true;
    for (const proto::WorkerToServer& m : out) {
      if (!(written = WriteToServer(m))) break;
    }
    if (!written) break;
  }
  {
    absl::MutexLock lock(&write_mu_);
    writes_done_ = true;
    stream_->WritesDone();
  }
  absl::MutexLock lock(&mu_);
  writer_done_ = true;
}

void ServerSession::FramedConnectionOpened(uint64_t generation, int fd) {
  const int mine = ::dup(fd);
  if (mine < 0) {
    SPDLOG_WARN("reports stay on the stream: dup of the ops connection: {}",
                std::strerror(errno));
    return;
  }
  absl::MutexLock lock(&report_mu_);
  absl::MutexLock descriptor(&fd_mu_);
  if (report_fd_ >= 0) ::close(report_fd_);
  report_fd_ = mine;
  report_generation_ = generation;
}

bool ServerSession::WriteReport(const proto::WorkerToServer& msg) {
  uint64_t framed;
  {
    absl::MutexLock lock(&mu_);
    framed = done_ ? 0 : framed_generation_;
  }
  if (framed == 0) return false;
  absl::MutexLock lock(&report_mu_);
  int fd;
  {
    absl::MutexLock l(&fd_mu_);
    fd = report_fd_;
  }
  if (fd < 0 || report_generation_ != framed) return false;
  msg.SerializeToString(&report_bytes_);
  absl::Status sent = transport::internal::FrameSocket::SendMessageOn(
      fd, transport::internal::FrameType::kReports, report_bytes_, framed);
  if (!sent.ok()) {
    SPDLOG_WARN(
        "a report could not go on the ops connection ({}); the "
        "stream takes it",
        sent.ToString());
    absl::MutexLock l(&fd_mu_);
    ::close(report_fd_);
    report_fd_ = -1;
    return false;
  }
  framed_reports_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool ServerSession::WriteToServer(const proto::WorkerToServer& msg) {
  if (WriteReport(msg)) return true;
  absl::MutexLock lock(&write_mu_);
  // No stream: a worker not registered (yet, or any more) has no server
  // to answer (an op applied outside a session: the fuzz harness's).
  return !writes_done_ && stream_ != nullptr && stream_->Write(msg);
}

void ServerSession::HeartbeatLoop() {
  SetThreadName("plexus-beat");
  Clock* const clock = options_.clock;
  absl::Time next = clock->Now() + heartbeat_interval_;
  while (true) {
    uint64_t answers;
    {
      absl::MutexLock lock(&beat_mu_);
      while (!beat_stop_ && stats_asked_ == stats_answered_ &&
             !clock->AwaitWithDeadline(&beat_mu_, &beat_wake_, next)) {
      }
      if (beat_stop_) return;
      answers = stats_answered_ = stats_asked_;
    }
    proto::WorkerToServer beat;
    *beat.mutable_heartbeat() = stats_();
    beat.mutable_heartbeat()->set_answers(answers);
    {
      // The probe's send time is read last, as close to the write as it
      // can be (timeline/clock_offset.h).
      absl::MutexLock lock(&probe_mu_);
      *beat.mutable_heartbeat()->mutable_clock() = last_probe_;
    }
    beat.mutable_heartbeat()->mutable_clock()->set_sent_ns(timeline_.NowNs());
    if (!WriteToServer(beat)) return;
    // On the period's grid (a beat the server asked for leaves it as it
    // is); after a stall (the process stopped, the machine starved it),
    // one beat at once and the grid from there.
    const absl::Time now = clock->Now();
    if (now < next) continue;
    next += heartbeat_interval_;
    if (next < now) next = now;
  }
}

void ServerSession::SendStats(const proto::SendStats& request) {
  absl::MutexLock lock(&beat_mu_);
  stats_asked_ = request.request_id();
  beat_wake_.Signal();
}

void ServerSession::ApplyClockEcho(const proto::ClockEcho& echo) {
  const int64_t t4 = timeline_.NowNs();
  absl::MutexLock lock(&probe_mu_);
  last_probe_.set_t1(echo.t1());
  last_probe_.set_t2(echo.t2());
  last_probe_.set_t3(echo.t3());
  last_probe_.set_t4(t4);
}

void ServerSession::SendTimeline(const proto::CollectTimeline& request) {
  // On the reader thread: a trace is rare, and its events are copied out
  // of the ring at once (recording goes on meanwhile).
  std::vector<proto::TimelineRing> chunks =
      RingChunks(timeline_, request.since_ns());
  for (size_t i = 0; i < chunks.size(); ++i) {
    proto::WorkerToServer msg;
    proto::TimelineChunk* chunk = msg.mutable_timeline();
    chunk->set_request_id(request.request_id());
    *chunk->mutable_ring() = std::move(chunks[i]);
    chunk->set_last(i + 1 == chunks.size());
    if (!WriteToServer(msg)) return;
  }
}

}  // namespace plexus
