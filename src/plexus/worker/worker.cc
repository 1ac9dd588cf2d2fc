#include <unistd.h>

#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    const WorkerOptions& options) {
  auto worker = std::make_unique<WorkerImpl>(options);
  absl::Status s = worker->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Worker>(std::move(worker));
}

WorkerImpl::WorkerImpl(const WorkerOptions& options) : options_(options) {}

WorkerImpl::~WorkerImpl() {
  Shutdown();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  StopCompiler();
  store_->Shutdown();
  data_server_.reset();
  {
    absl::MutexLock lock(&peers_mu_);
    senders_.clear();
  }
  devices_.clear();
}

absl::Status WorkerImpl::Init() {
  if (options_.num_devices <= 0) {
    return absl::InvalidArgumentError("--devices must be at least 1");
  }
  machine_id_ = LocalMachineId();
  if (!options_.shared_memory) {
    absl::StrAppend(&machine_id_, "/pid", getpid());
  }
  ObjectStore::Options store_options;
  store_options.device_memory.assign(options_.num_devices,
                                     options_.device_memory);
  store_ = std::make_unique<ObjectStore>(store_options);
  xla::PjrtOptions pjrt;
  pjrt.plugin_path = options_.pjrt_plugin;
  pjrt.cpu_device_count = options_.num_devices;  // PJRT device i = ours
  xla_ = std::make_unique<xla::XlaExecutor>(pjrt);
  for (int d = 0; d < options_.num_devices; ++d) {
    devices_.push_back(std::make_unique<CpuDevice>(d, options_.device_memory));
  }

  transport::DataPlaneServerOptions dp;
  dp.tcp_host = options_.data_host;
  std::random_device rd;
  dp.unix_name = absl::StrCat("plexus-worker-", getpid(), "-", rd());
  auto server = transport::DataPlaneServer::Start(dp, this, &counters_);
  if (!server.ok()) return server.status();
  data_server_ = std::move(*server);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  channel_ = grpc::CreateCustomChannel(
      options_.server_address, grpc::InsecureChannelCredentials(), args);
  if (!channel_->WaitForConnected(
          absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
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
  reg->set_data_address(data_server_->tcp_address());
  reg->set_unix_path(data_server_->unix_path());
  if (!stream_->Write(hello)) {
    return absl::UnavailableError("the server closed the session at once");
  }
  proto::ServerToWorker first;
  if (!stream_->Read(&first)) {
    return absl::UnavailableError("the server refused the registration");
  }
  worker_id_ = first.worker_id();
  SPDLOG_INFO("registered as worker {} ({} device(s), data plane {} {})",
              worker_id_.load(), devices_.size(), data_server_->tcp_address(),
              data_server_->unix_path());
  for (auto& op : *first.mutable_ops()) Apply(op);
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
  return absl::OkStatus();
}

absl::Status WorkerImpl::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return end_status_;
}

void WorkerImpl::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  end_status_ = absl::CancelledError("worker shut down");
  context_.TryCancel();
  wake_writer_.SignalAll();
}

void WorkerImpl::ReaderLoop() {
  proto::ServerToWorker msg;
  while (stream_->Read(&msg)) {
    for (auto& op : *msg.mutable_ops()) Apply(op);
  }
  absl::MutexLock lock(&mu_);
  if (!done_) {
    done_ = true;
    end_status_ = absl::UnavailableError("the server closed the session");
    SPDLOG_INFO("server session ended; shutting down");
  }
  wake_writer_.SignalAll();
}

void WorkerImpl::WriterLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      wake_writer_.WaitWithTimeout(&mu_, options_.heartbeat_interval);
      if (done_) break;
    }
    proto::WorkerToServer beat;
    *beat.mutable_heartbeat() = CollectStats();
    if (!stream_->Write(beat)) break;
  }
  stream_->WritesDone();
}

proto::WorkerStats WorkerImpl::CollectStats() {
  proto::WorkerStats s;
  ObjectStoreStats st = store_->Stats();
  s.set_live_buffers(st.live_shards);
  s.set_live_bytes(st.live_bytes);
  for (int64_t b : st.device_bytes) s.add_device_live_bytes(b);
  for (int64_t b : st.device_peak_bytes) s.add_device_peak_bytes(b);
  for (const auto& d : devices_) s.add_device_busy_micros(d->busy_micros());
  s.set_calls_executed(calls_executed_.load());
  s.set_calls_failed(calls_failed_.load());
  s.set_programs_loaded(programs_loaded_.load());
  s.set_xla_compiles(xla_->compiles());
  s.set_xla_cache_hits(xla_->cache_hits());
  s.set_xla_compile_micros(xla_->compile_micros());
  s.set_xla_platform(xla_->Describe());
  s.set_bytes_sent(counters_.bytes_sent.load());
  s.set_bytes_received(counters_.bytes_received.load());
  s.set_bytes_from_clients(counters_.bytes_from_clients.load());
  s.set_bytes_to_clients(counters_.bytes_to_clients.load());
  return s;
}

void WorkerImpl::Apply(proto::WorkerOp& op) {
  switch (op.op_case()) {
    case proto::WorkerOp::kLoad: {
      auto prog = std::make_unique<LoadedProgram>();
      const proto::ProgramDef& def = op.load().program();
      prog->name = def.name();
      prog->kernel = builtin::KernelRegistry::Global().Find(def.kernel());
      if (def.kernel() == "xla") {
        prog->xla = std::make_unique<proto::XlaProgram>();
        prog->xla->Swap(op.mutable_load()->mutable_program()->mutable_xla());
      }
      prog->attrs = AttrsFromProto(def.attrs());
      for (const auto& a : def.inputs()) prog->inputs.push_back(*FromProto(a));
      for (const auto& a : def.outputs()) {
        prog->outputs.push_back(*FromProto(a));
      }
      std::shared_ptr<LoadedProgram> loaded = std::move(prog);
      programs_[op.load().program_id()] = loaded;
      programs_loaded_ = static_cast<int64_t>(programs_.size());
      // Complete now, and never modified again: the compiler thread may
      // read it from here on.
      if (loaded->xla) CompileAhead(std::move(loaded));
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
      auto spec = FromProto(e.spec());
      store_->Declare({e.buffer_id(), 0}, e.device(),
                      spec.ok() ? *spec : TensorSpec{}, /*owned=*/false,
                      e.src_worker_id());
      break;
    }
    case proto::WorkerOp::kDeclare: {
      const auto& d = op.declare();
      auto spec = FromProto(d.spec());
      store_->Declare({d.buffer_id(), d.shard()}, d.device(),
                      spec.ok() ? *spec : TensorSpec{}, /*owned=*/true);
      break;
    }
    case proto::WorkerOp::kRelease:
      for (uint64_t id : op.release().buffer_ids()) store_->Release(id);
      break;
    case proto::WorkerOp::kFail:
      for (uint64_t id : op.fail().buffer_ids()) {
        store_->FailBuffer(id, absl::InvalidArgumentError(op.fail().message()));
      }
      break;
    case proto::WorkerOp::kPeerDown:
      ApplyPeerDown(op.peer_down());
      break;
    case proto::WorkerOp::kPeer: {
      absl::MutexLock lock(&peers_mu_);
      peers_[op.peer().worker_id()] = op.peer();
      break;
    }
    case proto::WorkerOp::kClientGone: {
      const uint64_t client = op.client_gone().client_id();
      store_->ReleaseClient(client);
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
  auto it = senders_.find(worker_id);
  if (it != senders_.end()) return it->second.get();
  auto pit = peers_.find(worker_id);
  if (pit == peers_.end()) return nullptr;
  const proto::PeerInfo& p = pit->second;
  bool same_machine = p.machine_id() == machine_id_;
  auto sender = std::make_unique<PeerSender>(worker_id, p.data_address(),
                                             same_machine ? p.unix_path() : "",
                                             &counters_);
  PeerSender* raw = sender.get();
  senders_[worker_id] = std::move(sender);
  return raw;
}

void WorkerImpl::ApplyTransfer(const proto::Transfer& t) {
  BufferKey src{t.buffer_id(), t.shard()};
  transport::ShardKey dst{t.dst_buffer_id(), 0};
  PeerSender* sender = SenderTo(t.dst_worker_id());
  if (sender == nullptr) {
    SPDLOG_WARN("transfer to unknown worker {}", t.dst_worker_id());
    return;
  }
  store_->AddReader(src);
  store_->OnReady(src, [this, src, dst, sender](auto result) {
    sender->Send(dst, std::move(result));
    store_->RemoveReader(src);
  });
}

void WorkerImpl::ApplyPeerDown(const proto::PeerDown& down) {
  SPDLOG_WARN("worker {} is down: {}", down.worker_id(), down.message());
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = senders_.find(down.worker_id());
    if (it != senders_.end()) it->second->MarkDown();
  }
  store_->FailFromSource(down.worker_id(),
                         absl::UnavailableError(down.message()));
}

// --- data plane handler ---------------------------------------------------

absl::StatusOr<std::shared_ptr<Storage>> WorkerImpl::AllocateIncoming(
    const transport::ShardKey& key, size_t bytes, bool from_client) {
  return Storage::AllocateForWrite(bytes);
}

absl::Status WorkerImpl::Deliver(const transport::ShardKey& key,
                                 std::shared_ptr<Storage> data,
                                 bool from_client) {
  BufferKey k{key.buffer_id, key.shard};
  auto desc = store_->Describe(k);
  if (desc.ok() &&
      desc->first.byte_size() != static_cast<int64_t>(data->size())) {
    absl::Status mismatch = absl::InvalidArgumentError(
        absl::StrCat(KeyString(k), " is declared as ", desc->first.ToString(),
                     " (", desc->first.byte_size(), " bytes) but ",
                     data->size(), " bytes arrived"));
    // Whoever waits for this shard learns why, rather than waiting forever.
    store_->Fail(k, mismatch);
    return mismatch;
  }
  store_->Fulfil(k, std::move(data), desc.ok() ? desc->second : -1,
                 /*reserved=*/false);
  return absl::OkStatus();
}

void WorkerImpl::DeliverError(const transport::ShardKey& key,
                              const std::string& message) {
  store_->Fail({key.buffer_id, key.shard}, absl::AbortedError(message));
}

absl::StatusOr<std::shared_ptr<const Storage>> WorkerImpl::AwaitReady(
    const transport::ShardKey& key) {
  return store_->AwaitReady({key.buffer_id, key.shard});
}

}  // namespace plexus
