#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/protocol.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/tls.h"
#include "plexus/timeline/timeline_proto.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

// The local address this host uses to reach `server` ("host:port"): a UDP
// socket connected there (nothing is sent) shows the source address the
// kernel's routes pick. Empty if it cannot tell.
std::string LocalAddressTowards(const std::string& server) {
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = server.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), server.substr(colon + 1).c_str(), &hints,
                  &found) != 0) {
    return "";
  }
  std::string local;
  for (addrinfo* ai = found; ai != nullptr && local.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage me{};
    socklen_t len = sizeof(me);
    char text[INET6_ADDRSTRLEN] = {0};
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      if (me.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&me)->sin_addr, text,
                  sizeof(text));
        local = text;
      } else if (me.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr,
                  text, sizeof(text));
        local = absl::StrCat("[", text, "]");
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return local;
}

}  // namespace

std::string AdvertisedDataAddress(const std::string& bound,
                                  const std::string& advertise_host,
                                  const std::string& server) {
  const size_t colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon);
  const std::string port = bound.substr(colon + 1);
  std::string advertised = advertise_host;
  if (advertised.empty() && host != "0.0.0.0" && host != "[::]") return bound;
  if (advertised.empty()) advertised = LocalAddressTowards(server);
  if (advertised.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    advertised = name;
  }
  // A bare IPv6 address needs its brackets before a port.
  if (advertised.front() != '[' &&
      std::count(advertised.begin(), advertised.end(), ':') > 1) {
    advertised = absl::StrCat("[", advertised, "]");
  }
  return absl::StrCat(advertised, ":", port);
}

namespace {

// The error an op that fails something carries. Such an op without a code
// (a status that reads as OK) is still a failure, never a success: the
// store cannot hold an OK failure.
absl::Status FailureFromProto(const proto::Status& proto,
                              absl::string_view what) {
  absl::Status status = StatusFromProto(proto);
  if (!status.ok()) return status;
  return absl::UnknownError(absl::StrCat(what, " (no reason given)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    const WorkerOptions& options) {
  // Every catalogued kernel has a body here, and every body a signature:
  // the server and clients compile against the catalogue alone, so a drift
  // would otherwise show only when a call ran.
  if (auto kernels = builtin::KernelRegistry::Builtin(); !kernels.ok()) {
    return kernels.status();
  }
  auto worker = std::make_unique<WorkerImpl>(options);
  absl::Status s = worker->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Worker>(std::move(worker));
}

WorkerImpl::WorkerImpl(const WorkerOptions& options)
    : options_(options),
      timeline_({.capacity = options.timeline_capacity,
                 .clock = options.clock,
                 .skew = options.timeline_skew,
                 .enabled = options.timeline}) {}

WorkerImpl::~WorkerImpl() {
  Shutdown();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  StopCompiler();
  // wakes every waiting task: the devices drain at once (no store: the
  // start failed before it)
  if (store_) store_->Shutdown();
  data_server_.reset();
  // Transfer callbacks (ApplyTransfer, collectives) hold raw PeerSender
  // pointers and still fire on the device threads as the drained tasks fail
  // their outputs. So the senders stop first (what they are given from now
  // on is dropped, and no new one is made), the devices drain, and only then
  // do the senders go.
  absl::flat_hash_map<int64_t, std::unique_ptr<PeerSender>> senders;
  {
    absl::MutexLock lock(&peers_mu_);
    senders_stopped_ = true;
    for (auto& [id, sender] : senders_) sender->MarkDown();
  }
  devices_.clear();
  AwaitXlaRuns();  // their ends read the store and report calls
  {
    absl::MutexLock lock(&peers_mu_);
    senders.swap(senders_);
  }
  senders.clear();  // joins their threads, outside the lock
}

absl::Status WorkerImpl::Init() {
  if (!options_.secret.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cluster secret: set $", kClusterSecretEnv,
                     " or pass --secret-file (the server's)"));
  }
  if (absl::Status s = StartLocal(); !s.ok()) return s;
  return ConnectToServer();
}

absl::Status WorkerImpl::ConnectToServer() {
  // Each registration is a channel of its own: no reconnect back-off
  // inherited from an earlier one (WorkerHost keeps its own).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SessionChannel(options_.server_address, options_.tls_ca);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  if (!channel_->WaitForConnected(
          absl::ToChronoTime(absl::Now() + options_.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach the server at ", options_.server_address));
  }
  stub_ = proto::Controller::NewStub(channel_);
  stream_ = stub_->WorkerSession(&context_);

  proto::WorkerToServer hello;
  auto* reg = hello.mutable_register_();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  reg->set_host_name(options_.host_name.empty() ? host : options_.host_name);
  reg->set_machine_id(machine_id_);
  reg->set_pid(getpid());
  for (const auto& d : devices_) {
    auto* info = reg->add_devices();
    info->set_index(d->index());
    info->set_kind(d->kind());
    info->set_memory_bytes(d->memory_bytes());
  }
  const std::string advertised =
      AdvertisedDataAddress(data_server_->tcp_address(),
                            options_.advertise_host, options_.server_address);
  reg->set_data_address(advertised);
  reg->set_unix_path(data_server_->unix_path());
  const Credential credential = secret_.Derive(CredentialRole::kWorker);
  reg->set_credential(credential.data(), credential.size());
  reg->set_protocol_version(kProtocolVersion);
  reg->set_previous_worker_id(options_.previous_worker_id);
  reg->set_spare(options_.spare);
  reg->set_nccl(nccl_ != nullptr);
  if (!options_.pjrt_plugin.empty()) {
    // What plexus.jit may write for this worker (the plugin is loaded now,
    // not at the first program; a plugin that cannot load says so then).
    absl::StatusOr<std::string> stablehlo =
        xla::PjrtRuntime::PluginStableHloVersion(options_.pjrt_plugin);
    if (stablehlo.ok()) reg->set_stablehlo_version(*stablehlo);
  }
  reg->set_previous_generation(options_.previous_generation);
  if (!stream_->Write(hello)) {
    return absl::UnavailableError("the server closed the session at once");
  }
  proto::ServerToWorker first;
  if (!stream_->Read(&first)) {
    grpc::Status why = stream_->Finish();
    return absl::Status(
        static_cast<absl::StatusCode>(why.error_code()),
        absl::StrCat("the server refused the registration: ",
                     why.error_message().empty() ? "no reason given"
                                                 : why.error_message()));
  }
  if (absl::Status v =
          CheckProtocolVersion("worker", "server", first.protocol_version());
      !v.ok()) {
    context_.TryCancel();
    proto::ServerToWorker rest;
    while (stream_->Read(&rest)) {
    }
    stream_->Finish().IgnoreError();
    return v;
  }
  generation_ = first.generation();
  heartbeat_interval_ =
      options_.heartbeat_interval > absl::ZeroDuration()
          ? options_.heartbeat_interval
          : std::max(absl::Milliseconds(first.heartbeat_interval_ms()),
                     absl::Milliseconds(1));
  SPDLOG_INFO(
      "registered as worker {}, generation {} ({} device(s), data plane {}{} "
      "{}, heartbeat every {})",
      first.worker_id(), first.generation(), devices_.size(), advertised,
      advertised == data_server_->tcp_address()
          ? ""
          : absl::StrCat(" bound at ", data_server_->tcp_address()),
      data_server_->unix_path(), absl::FormatDuration(heartbeat_interval_));
  if (!first.rejoined().empty()) {
    SPDLOG_WARN("rejoined as a fresh host: {}", first.rejoined());
  }
  ApplyOps(first);
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

absl::Status WorkerImpl::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return end_status_;
}

void WorkerImpl::Shutdown() {
  StopHeartbeats();
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  end_status_ = absl::CancelledError("worker shut down");
  context_.TryCancel();
  wake_writer_.SignalAll();
}

void WorkerImpl::StopHeartbeats() {
  absl::MutexLock lock(&beat_mu_);
  beat_stop_ = true;
  beat_wake_.SignalAll();
}

void WorkerImpl::ReaderLoop() {
  SetThreadName("plexus-reader");
  proto::ServerToWorker msg;
  while (stream_->Read(&msg)) ApplyOps(msg);
  StopHeartbeats();
  {
    absl::MutexLock lock(&mu_);
    stream_ended_ = true;
    wake_writer_.SignalAll();
    mu_.Await(absl::Condition(&writer_done_));
  }
  // Both directions are closed: Finish says how the session ended. The
  // server cancels it on purpose when it shuts down (or gave up on this
  // worker); anything else means it vanished.
  const grpc::Status how = stream_->Finish();
  absl::MutexLock lock(&mu_);
  if (!done_) {
    done_ = true;
    if (how.error_code() == grpc::StatusCode::CANCELLED) {
      end_status_ = absl::CancelledError("the server ended the session");
    } else {
      end_status_ = absl::UnavailableError(
          absl::StrCat("the server closed the session: ", how.error_message()));
    }
    SPDLOG_INFO("server session ended ({}); shutting down",
                end_status_.ToString());
  }
}

void WorkerImpl::WriterLoop() {
  SetThreadName("plexus-writer");
  while (true) {
    std::vector<proto::WorkerToServer> out;
    {
      absl::MutexLock lock(&mu_);
      // Finished calls go out in batches: once kReportBatch have gathered,
      // or kReportDelay after the first of them, whichever comes first (the
      // server's admission windows cover that delay).
      auto pending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !calls_done_.tickets().empty() ||
               !calls_done_.copies_done().empty();
      };
      auto report_due = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return calls_done_.tickets_size() >= kReportBatch ||
               (pending() && absl::Now() >= first_done_ + kReportDelay);
      };
      while (!done_ && !stream_ended_ && failed_transfers_.empty() &&
             !report_due()) {
        if (pending()) {
          wake_writer_.WaitWithDeadline(&mu_, first_done_ + kReportDelay);
        } else {
          wake_writer_.Wait(&mu_);
        }
      }
      if (done_ || stream_ended_) break;
      for (proto::TransferFailed& f : failed_transfers_) {
        *out.emplace_back().mutable_transfer_failed() = std::move(f);
      }
      failed_transfers_.clear();
      // Everything that finished while the last write was going out.
      if (pending()) {
        out.emplace_back().mutable_calls_done()->Swap(&calls_done_);
      }
    }
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

bool WorkerImpl::WriteToServer(const proto::WorkerToServer& msg) {
  absl::MutexLock lock(&write_mu_);
  return !writes_done_ && stream_->Write(msg);
}

// Heartbeats are what the server's failure detector reads, so nothing else
// the worker does may hold them up: they have this thread to themselves,
// which waits only on beat_mu_ (no other work takes it) and on write_mu_
// (held only around a write of the stream); their figures come from
// counters or from locks that are free at that instant (CollectStats). A
// compile, a long execution or a busy store does not delay them.
void WorkerImpl::HeartbeatLoop() {
  SetThreadName("plexus-beat");
  absl::Time next = absl::Now() + heartbeat_interval_;
  while (true) {
    {
      absl::MutexLock lock(&beat_mu_);
      while (!beat_stop_ && absl::Now() < next) {
        beat_wake_.WaitWithDeadline(&beat_mu_, next);
      }
      if (beat_stop_) return;
    }
    proto::WorkerToServer beat;
    *beat.mutable_heartbeat() = CollectStats();
    {
      // The probe's send time is read last, as close to the write as it
      // can be (timeline/clock_offset.h).
      absl::MutexLock lock(&probe_mu_);
      *beat.mutable_heartbeat()->mutable_clock() = last_probe_;
    }
    beat.mutable_heartbeat()->mutable_clock()->set_sent_ns(timeline_.NowNs());
    if (!WriteToServer(beat)) return;
    // On the period's grid; after a stall (the process stopped, the
    // machine starved it), one beat at once and the grid from there.
    next += heartbeat_interval_;
    const absl::Time now = absl::Now();
    if (next < now) next = now;
  }
}

void WorkerImpl::CallFinished(const proto::Execute& exec, bool failed,
                              int64_t busy_micros, int64_t queued_micros) {
  absl::MutexLock lock(&mu_);
  Usage& usage = usage_[exec.client_id()];
  usage.busy_micros += busy_micros;
  usage.calls++;
  usage.tasks += exec.tasks_size();
  usage.queued_micros += queued_micros;
  if (exec.ticket() == 0) return;  // not admitted by a server (harnesses)
  if (calls_done_.tickets().empty() && calls_done_.copies_done().empty()) {
    first_done_ = absl::Now();
  }
  calls_done_.add_client_ids(exec.client_id());
  calls_done_.add_tickets(exec.ticket());
  calls_done_.add_busy_micros(busy_micros);
  if (failed) calls_done_.add_failed_tickets(exec.ticket());
  // The writer wakes for the first of a batch (to time it) and when the
  // batch is full; not for each call.
  if (calls_done_.tickets_size() == 1 ||
      calls_done_.tickets_size() == kReportBatch) {
    wake_writer_.SignalAll();
  }
}

void WorkerImpl::ApplyClockEcho(const proto::ClockEcho& echo) {
  const int64_t t4 = timeline_.NowNs();
  absl::MutexLock lock(&probe_mu_);
  last_probe_.set_t1(echo.t1());
  last_probe_.set_t2(echo.t2());
  last_probe_.set_t3(echo.t3());
  last_probe_.set_t4(t4);
}

void WorkerImpl::SendTimeline(const proto::CollectTimeline& request) {
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

void WorkerImpl::CopyArrived(uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  if (calls_done_.tickets().empty() && calls_done_.copies_done().empty()) {
    first_done_ = absl::Now();
  }
  calls_done_.add_copies_done(buffer_id);
  wake_writer_.SignalAll();
}

void WorkerImpl::ReportTransferFailure(int64_t dst_worker,
                                       const transport::ShardKey& key,
                                       const absl::Status& reason) {
  proto::TransferFailed f;
  f.set_dst_worker_id(dst_worker);
  f.set_buffer_id(key.buffer_id);
  f.set_shard(key.shard);
  *f.mutable_status() = StatusToProto(reason);
  absl::MutexLock lock(&mu_);
  failed_transfers_.push_back(std::move(f));
  wake_writer_.SignalAll();
}

proto::WorkerStats WorkerImpl::CollectStats() {
  proto::WorkerStats s;
  if (std::optional<ObjectStoreStats> st = store_->TryStats()) {
    last_store_stats_ = std::move(*st);
  }
  const ObjectStoreStats& st = last_store_stats_;
  s.set_live_buffers(st.live_shards);
  s.set_live_bytes(st.live_bytes);
  for (int64_t b : st.device_bytes) s.add_device_live_bytes(b);
  for (int64_t b : st.device_peak_bytes) s.add_device_peak_bytes(b);
  for (int64_t b : st.device_waiting_bytes) s.add_device_waiting_bytes(b);
  s.set_device_memory_shards(st.device_memory_shards);
  for (size_t d = 0; d < devices_.size(); ++d) {
    // The device thread's own time, and the device time of its XLA runs
    // (which it queues and does not wait for).
    s.add_device_busy_micros(devices_[d]->busy_micros() +
                             device_run_busy_[d].load());
  }
  s.set_calls_executed(calls_executed_.load());
  s.set_calls_failed(calls_failed_.load());
  s.set_programs_loaded(programs_loaded_.load());
  s.set_pushes_fenced(pushes_fenced_.load());
  s.set_bytes_host_to_device(MemoryTraffic::host_to_device().load());
  s.set_transfers_alias(TransferPaths::alias().load());
  s.set_donations(donations_.load());
  s.set_donations_declined(donations_declined_.load());
  s.set_transfers_device_to_device(TransferPaths::device_to_device().load());
  s.set_transfers_host_staged(TransferPaths::host_staged().load());
  s.set_transfers_ipc(TransferPaths::ipc().load());
  s.set_transfers_nccl(NcclPaths::all_reduce().load());
  s.set_bytes_device_to_host(MemoryTraffic::device_to_host().load());
  s.set_xla_compiles(xla_->compiles());
  s.set_xla_cache_hits(xla_->cache_hits());
  s.set_xla_compile_micros(xla_->compile_micros());
  s.set_xla_serialized_loads(xla_->serialized_loads());
  // Set once, when the plugin has loaded (Describe's lock is never held
  // across the load; after that it is not taken at all).
  if (xla_platform_.empty()) xla_platform_ = xla_->Describe();
  s.set_xla_platform(xla_platform_);
  s.set_bytes_sent(counters_.bytes_sent.load());
  s.set_bytes_received(counters_.bytes_received.load());
  s.set_bytes_from_clients(counters_.bytes_from_clients.load());
  s.set_bytes_to_clients(counters_.bytes_to_clients.load());
  if (mu_.TryLock()) {
    last_usage_.clear();
    for (const auto& [client, usage] : usage_) {
      proto::ClientUsage& u = last_usage_.emplace_back();
      u.set_client_id(client);
      u.set_busy_micros(usage.busy_micros);
      u.set_calls(usage.calls);
      u.set_tasks(usage.tasks);
      u.set_queued_micros(usage.queued_micros);
    }
    mu_.Unlock();
  }
  for (const proto::ClientUsage& u : last_usage_) *s.add_clients() = u;
  {
    absl::MutexLock lock(&compiling_mu_);
    const absl::Time now = absl::Now();
    for (const auto& [token, c] : compiling_) {
      proto::CompileInProgress& p = *s.add_compiling();
      p.set_program_id(c.program_id);
      p.set_program(c.program);
      for (int d : c.devices) p.add_devices(d);
      p.set_elapsed_ms(absl::ToInt64Milliseconds(now - c.started));
    }
  }
  return s;
}

void WorkerImpl::ApplyOps(proto::ServerToWorker& msg) {
  // The server names the worker in its first message.
  if (worker_id_.load() < 0) worker_id_ = msg.worker_id();
  for (auto& op : *msg.mutable_ops()) Apply(op);
}

absl::StatusOr<TensorSpec> WorkerImpl::HeldSpec(const BufferKey& key,
                                                const proto::TensorSpec& spec,
                                                int device) const {
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(KeyString(key), " is declared on device ", device,
                     " but this worker has ", devices_.size()));
  }
  auto parsed = FromProto(spec);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        KeyString(key), " is declared as ", parsed.status().message()));
  }
  return parsed;
}

void WorkerImpl::Apply(proto::WorkerOp& op) {
  switch (op.op_case()) {
    case proto::WorkerOp::kLoad: {
      auto prog = std::make_unique<LoadedProgram>();
      const proto::ProgramDef& def = op.load().program();
      prog->id = op.load().program_id();
      prog->name = def.name();
      prog->kernel = builtin::KernelRegistry::Global().Find(def.kernel());
      if (def.kernel() == "xla") {
        prog->xla = std::make_unique<proto::XlaProgram>();
        prog->xla->Swap(op.mutable_load()->mutable_program()->mutable_xla());
      }
      prog->attrs = AttrsFromProto(def.attrs());
      // The server checked these specs when the program was registered; a
      // load that still carries one that does not parse is refused, never
      // trusted: its calls fail, saying the program is not loaded.
      absl::Status specs;
      auto add_specs = [&](const auto& defs, std::vector<ArgSpec>* out,
                           const char* what) {
        for (int i = 0; i < defs.size() && specs.ok(); ++i) {
          auto a = FromProto(defs[i]);
          if (a.ok()) {
            out->push_back(*a);
          } else {
            specs = absl::InvalidArgumentError(
                absl::StrCat(what, " ", i, ": ", a.status().message()));
          }
        }
      };
      add_specs(def.inputs(), &prog->inputs, "argument");
      add_specs(def.outputs(), &prog->outputs, "output");
      if (!specs.ok()) {
        SPDLOG_ERROR("program {} ('{}') not loaded: {}", op.load().program_id(),
                     def.name(), std::string(specs.message()));
        programs_.erase(op.load().program_id());
        programs_loaded_ = static_cast<int64_t>(programs_.size());
        break;
      }
      std::shared_ptr<LoadedProgram> loaded = std::move(prog);
      programs_[op.load().program_id()] = loaded;
      programs_loaded_ = static_cast<int64_t>(programs_.size());
      // Complete now, and never modified again: the compiler thread may
      // read it from here on.
      if (loaded->xla) CompileAhead(std::move(loaded), op.load().stand_by());
      break;
    }
    case proto::WorkerOp::kExecute:
      ApplyExecute(*op.mutable_execute());
      break;
    case proto::WorkerOp::kTransfer:
      ApplyTransfer(op.transfer());
      break;
    case proto::WorkerOp::kExpect: {
      const auto& e = op.expect();
      // A temporary, or a client's shard restored from a surviving copy
      // (recovery), which the client owns as it owns a call's output.
      const BufferKey key{e.buffer_id(), e.shard()};
      auto spec = HeldSpec(key, e.spec(), e.device());
      store_->Declare(key, spec.ok() ? e.device() : -1,
                      spec.ok() ? *spec : TensorSpec{}, /*owned=*/e.owned(),
                      ObjectStore::Arrival::kFromPeer, e.src_worker_id());
      if (!spec.ok()) store_->Fail(key, spec.status());
      if (e.report()) {
        store_->OnReady(key, [this, id = key.buffer_id](auto result) {
          if (result.ok()) CopyArrived(id);
        });
      }
      break;
    }
    case proto::WorkerOp::kDeclare: {
      const auto& d = op.declare();
      const BufferKey key{d.buffer_id(), d.shard()};
      auto spec = HeldSpec(key, d.spec(), d.device());
      store_->Declare(key, spec.ok() ? d.device() : -1,
                      spec.ok() ? *spec : TensorSpec{}, /*owned=*/true,
                      ObjectStore::Arrival::kFromClient);
      if (!spec.ok()) store_->Fail(key, spec.status());
      break;
    }
    case proto::WorkerOp::kRelease:
      for (uint64_t id : op.release().buffer_ids()) store_->Release(id);
      break;
    case proto::WorkerOp::kFail:
      for (uint64_t id : op.fail().buffer_ids()) {
        store_->FailBuffer(
            id, FailureFromProto(op.fail().status(), "call rejected"));
      }
      break;
    case proto::WorkerOp::kPeerDown:
      ApplyPeerDown(op.peer_down());
      break;
    case proto::WorkerOp::kClockEcho:
      ApplyClockEcho(op.clock_echo());
      break;
    case proto::WorkerOp::kCollectTimeline:
      SendTimeline(op.collect_timeline());
      break;
    case proto::WorkerOp::kTransferFailed:
      // The sender could not reach this worker's data plane; the server
      // relays what it would have said in a PUSH_ERROR.
      store_->Fail(
          {op.transfer_failed().buffer_id(), op.transfer_failed().shard()},
          FailureFromProto(op.transfer_failed().status(), "transfer failed"));
      break;
    case proto::WorkerOp::kPeer: {
      absl::MutexLock lock(&peers_mu_);
      peers_[op.peer().worker_id()] = op.peer();
      break;
    }
    case proto::WorkerOp::kClientGone: {
      const uint64_t client = op.client_gone().client_id();
      store_->ReleaseClient(client);
      {
        absl::MutexLock lock(&mu_);
        usage_.erase(client);
      }
      // Its programs go too (their ids carry the client's, as buffer ids
      // do); calls and compiles still running hold their own reference.
      int64_t unloaded = 0;
      for (auto it = programs_.begin(); it != programs_.end();) {
        if (ClientOfBuffer(it->first) == client) {
          programs_.erase(it++);
          unloaded++;
        } else {
          ++it;
        }
      }
      programs_loaded_ = static_cast<int64_t>(programs_.size());
      if (unloaded > 0) {
        SPDLOG_INFO("client {} gone: unloaded {} program(s)", client, unloaded);
      }
      break;
    }
    default:
      SPDLOG_WARN("ignoring unknown op {}", static_cast<int>(op.op_case()));
  }
}

PeerSender* WorkerImpl::SenderTo(int64_t worker_id) {
  absl::MutexLock lock(&peers_mu_);
  if (senders_stopped_) return nullptr;  // the worker is being destroyed
  auto it = senders_.find(worker_id);
  if (it != senders_.end()) return it->second.get();
  auto pit = peers_.find(worker_id);
  if (pit == peers_.end()) return nullptr;
  const proto::PeerInfo& p = pit->second;
  bool same_machine = p.machine_id() == machine_id_;
  transport::DataPlaneIdentity me;
  me.peer = {CredentialRole::kWorker, 0};
  me.credential = secret_.Derive(CredentialRole::kWorker);
  me.generation = generation_.load();  // peers fence it once it is down
  auto sender = std::make_unique<PeerSender>(
      worker_id, p.data_address(), same_machine ? p.unix_path() : "",
      &counters_, me,
      [this, worker_id](const transport::ShardKey& key,
                        const absl::Status& reason) {
        ReportTransferFailure(worker_id, key, reason);
      },
      cuda_ipc_.get(), &timeline_);
  PeerSender* raw = sender.get();
  senders_[worker_id] = std::move(sender);
  return raw;
}

void WorkerImpl::ApplyTransfer(const proto::Transfer& t) {
  BufferKey src{t.buffer_id(), t.shard()};
  transport::ShardKey dst{t.dst_buffer_id(), t.dst_shard()};
  PeerSender* sender = SenderTo(t.dst_worker_id());
  if (sender == nullptr) {
    SPDLOG_WARN("transfer to unknown worker {}", t.dst_worker_id());
    return;
  }
  if (absl::Status known = store_->AddReader(src); !known.ok()) {
    // The source is gone (released): the destination's consumers hear why
    // rather than wait for a shard that will never come.
    sender->Send(dst, absl::NotFoundError(
                          absl::StrCat("transfer to worker ", t.dst_worker_id(),
                                       " failed: ", known.message())));
    return;
  }
  // The timeline's event: from when the shard is ready to its delivery.
  TimelineEvent event;
  if (timeline_.enabled()) {
    event.kind = EventKind::kTransfer;
    event.client_id = ClientOfBuffer(t.buffer_id());
    event.call_id = t.call_id();
    event.buffer_id = t.buffer_id();
    event.shard = t.shard();
    event.peer = t.dst_worker_id();
    event.device = t.dst_device();
  }
  store_->OnReady(src, [this, src, dst, sender, event](auto result) mutable {
    // No device path between workers yet: the sender stages a value in
    // device memory through host memory, on its own thread.
    sender->Send(dst, std::move(result), event);
    store_->RemoveReader(src);
  });
}

void WorkerImpl::ApplyPeerDown(const proto::PeerDown& down) {
  const absl::Status lost = FailureFromProto(
      down.status(), absl::StrCat("worker ", down.worker_id(), " is down"));
  SPDLOG_WARN("worker {} is down: {}", down.worker_id(),
              std::string(lost.message()));
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = senders_.find(down.worker_id());
    if (it != senders_.end()) it->second->MarkDown();
    // Fenced: should the process come back (a SIGSTOP ends, a network
    // heals), what it still pushes in that registration is refused.
    if (down.generation() != 0) {
      fenced_[down.generation()] = down.worker_id();
    }
    peers_down_.insert(down.worker_id());
  }
  store_->FailFromSource(down.worker_id(), lost);
  if (nccl_ != nullptr) nccl_->DropWorker(down.worker_id());
  down_peers_[down.worker_id()] = lost;
}

}  // namespace plexus
