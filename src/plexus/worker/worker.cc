// The worker as a coordinator over its parts (worker_impl.h): made,
// connected and torn down here.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/credentials.h"
#include "plexus/common/logging.h"
#include "plexus/common/status_proto.h"
#include "plexus/common/tls.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {

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
                 .enabled = options.timeline}),
      reports_(options.clock),
      session_(options_, me_, timeline_, reports_) {}

WorkerImpl::~WorkerImpl() {
  session_.Shutdown();
  session_.Join();
  if (xla_programs_) xla_programs_->StopCompiler();
  // wakes every waiting task: the devices drain at once (no store: the
  // start failed before it)
  if (store_) store_->Shutdown();
  data_server_.reset();
  // Transfer callbacks (OpApplier's transfers, collectives) hold raw
  // PeerSender pointers and still fire on the device threads as the
  // drained tasks fail their outputs. So the senders stop first (what they
  // are given from now on is dropped, and no new one is made), the devices
  // drain, and only then do the senders go.
  if (peers_) peers_->StopSenders();
  devices_.clear();
  if (tasks_) tasks_->AwaitXlaRuns();  // their ends read the store and report
  if (peers_) peers_->DestroySenders();
  // The parts, each before those it borrows.
  applier_.reset();
  data_plane_.reset();
  tasks_.reset();
  xla_programs_.reset();
  peers_.reset();
}

absl::Status WorkerImpl::Init() {
  if (!options_.secret.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cluster secret: set $", kClusterSecretEnv,
                     " or pass --secret-file (the server's)"));
  }
  if (absl::Status s = StartLocal(); !s.ok()) return s;
  return session_.Connect(
      Registration(), data_server_->tcp_address(),
      [this](proto::ServerToWorker& msg) { ApplyOps(msg); },
      [this] { return CollectStats(); });
}

proto::WorkerToServer WorkerImpl::Registration() const {
  proto::WorkerToServer hello;
  auto* reg = hello.mutable_register_();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  reg->set_host_name(options_.host_name.empty() ? host : options_.host_name);
  reg->set_machine_id(me_.machine_id);
  reg->set_pid(getpid());
  for (const auto& d : devices_) {
    auto* info = reg->add_devices();
    info->set_index(d->index());
    info->set_kind(d->kind());
    info->set_memory_bytes(d->memory_bytes());
  }
  reg->set_data_address(AdvertisedDataAddress(data_server_->tcp_address(),
                                              options_.advertise_host,
                                              options_.server_address));
  reg->set_unix_path(data_server_->unix_path());
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
  // The server's ops as frames on the data plane, unless the control
  // path is encrypted (the data plane is not: docs/security.md).
  const char* ca_env = std::getenv(kTlsCaEnv);
  reg->set_ops_on_data_plane(options_.tls_ca.empty() &&
                             (ca_env == nullptr || *ca_env == '\0'));
  return hello;
}

absl::Status WorkerImpl::Wait() { return session_.Wait(); }

absl::StatusOr<bool> WorkerImpl::Resume(absl::Duration drain) {
  // What the last server sent that cannot finish without it: a shard still
  // pending waits for a peer, a put or a call that may never come.
  store_->FailPending(ServerWentAwayError());
  // The devices finish what they run: a kernel cannot be interrupted, and
  // what it makes is kept.
  const absl::Time until = Clock::Real()->Now() + drain;
  while (pending_tasks() > 0 && Clock::Real()->Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));  // bounded: the drain
  }
  if (pending_tasks() > 0) {
    return absl::DeadlineExceededError(
        absl::StrCat(pending_tasks(), " task(s) still run after ",
                     absl::FormatDuration(drain), ": not resuming mid-kernel"));
  }
  proto::WorkerToServer hello = Registration();
  proto::RegisterWorker* reg = hello.mutable_register_();
  reg->set_previous_worker_id(me_.worker_id.load());
  reg->set_previous_generation(me_.generation.load());
  reg->set_kept_state(true);
  for (const ObjectStore::KeptShard& k : store_->KeepReady()) {
    proto::HeldShard* h = reg->add_inventory();
    h->set_buffer_id(k.key.buffer_id);
    h->set_shard(k.key.shard);
    h->set_device(k.device);
    h->set_bytes(k.bytes);
  }
  const int held = reg->inventory_size();
  // The server names this worker in its first message: the same id if it
  // takes it back, another if not (ApplyOps). Until then it keeps the id
  // the last server's ops name it by: a task of theirs still running reads
  // it (an island it is one of compiles here, not waited for from itself
  // for kAwaitPeerCompile; a collective finds its rank).
  resuming_ = true;  // ApplyOps takes the new id, drops what was kept if
                     // not taken back
  if (absl::Status s =
          session_.Reconnect(std::move(hello), data_server_->tcp_address());
      !s.ok()) {
    return s;
  }
  if (session_.resumed()) {
    SPDLOG_INFO("taken back as the host it was, with {} shard(s) kept", held);
    return true;
  }
  SPDLOG_INFO(
      "registered as a fresh host (the server does not know the last "
      "one's); the {} shard(s) kept are dropped",
      held);
  return false;
}

void WorkerImpl::Shutdown() { session_.Shutdown(); }

void WorkerImpl::ApplyOps(proto::ServerToWorker& msg) {
  // The server names the worker in its first message, and again in the
  // first after a resume (Resume; before the reader starts): a server that
  // did not take the worker back has it as a fresh host, under another
  // id, and what it kept goes (the next server's clients may be given the
  // last one's ids) before any op of the new session applies.
  const bool first_after_resume = resuming_.exchange(false);
  if (me_.worker_id.load() < 0 || first_after_resume) {
    me_.worker_id = msg.worker_id();
  }
  if (first_after_resume && !msg.resumed()) {
    store_->DropAll();
    applier_->UnloadAll();
  }
  // The first message: pushes of an earlier server's temporaries end now.
  if (msg.temp_floor() != 0) store_->SetTemporaryFloor(msg.temp_floor());
  if (options_.stall_first_execute > absl::ZeroDuration() &&
      std::any_of(msg.ops().begin(), msg.ops().end(),
                  [](const proto::WorkerOp& op) { return op.has_execute(); }) &&
      !stalled_once_.exchange(true)) {
    SPDLOG_WARN("TEST ONLY: applying an EXECUTE {} late",
                absl::FormatDuration(options_.stall_first_execute));
    options_.clock->SleepFor(options_.stall_first_execute);
  }
  for (auto& op : *msg.mutable_ops()) applier_->Apply(op);
}

}  // namespace plexus
