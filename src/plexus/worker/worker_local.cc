// The worker without its server session (WorkerImpl::StartLocal): its
// identity, devices, object store, XLA executor, collectives on GPUs,
// CUDA IPC, the parts over them, and the data plane.
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {

absl::Status WorkerImpl::StartLocal() {
  if (options_.num_devices <= 0) {
    return absl::InvalidArgumentError("--devices must be at least 1");
  }
  if (absl::Status s = SetUpIdentity(); !s.ok()) return s;
  xla::PjrtOptions pjrt;
  pjrt.plugin_path = options_.pjrt_plugin;
  pjrt.cpu_device_count = options_.num_devices;  // PJRT device i = ours
  pjrt.gpus = options_.gpus;
  xla_ = std::make_unique<xla::XlaExecutor>(pjrt);
  absl::StatusOr<std::vector<DeviceSpec>> specs = DeviceSpecs();
  if (!specs.ok()) return specs.status();
  if (nccl_ == nullptr && options_.nccl_offers_without_gpu) {
    nccl_ = std::make_unique<OffersWithoutGpu>();
    SPDLOG_INFO("NCCL: offers only, no GPU (nccl_offers_without_gpu)");
  }
  SetUpCudaIpc();
  MakeStoreAndDevices(*specs);
  MakeParts();
  return StartDataPlane();
}

absl::Status WorkerImpl::SetUpIdentity() {
  // Without a server (tests, fuzzing), a secret of its own.
  absl::StatusOr<ClusterSecret> secret =
      ClusterSecret::GivenOrGenerate(options_.secret);
  if (!secret.ok()) return secret.status();
  me_.secret = *secret;
  me_.machine_id = LocalMachineId();
  if (!options_.shared_memory) {
    absl::StrAppend(&me_.machine_id, "/pid", getpid());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerImpl::DeviceSpec>> WorkerImpl::DeviceSpecs() {
  if (!options_.devices_from_plugin) {
    return std::vector<DeviceSpec>(options_.num_devices,
                                   {"cpu", options_.device_memory});
  }
  absl::StatusOr<const xla::PjrtRuntime*> runtime = xla_->Runtime();
  if (!runtime.ok()) return runtime.status();
  std::vector<DeviceSpec> specs;
  for (int d = 0; d < (*runtime)->num_devices(); ++d) {
    absl::StatusOr<int64_t> limit = (*runtime)->device_memory_limit(d);
    int64_t memory = options_.device_memory;
    if (limit.ok() && !(options_.device_memory_given && memory < *limit)) {
      memory = *limit;
    }
    specs.push_back({(*runtime)->device_kind(d), memory});
    SPDLOG_INFO("device {}: {} ({}), {} MiB", d, specs.back().kind,
                (*runtime)->platform(), memory >> 20);
  }
  if (specs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PJRT plugin '", options_.pjrt_plugin, "' shows no devices"));
  }
  if ((*runtime)->platform() == "cuda") SetUpNccl(**runtime);
  return specs;
}

void WorkerImpl::SetUpNccl(const xla::PjrtRuntime& runtime) {
  // all_reduce between GPU islands may then run on the GPUs.
  absl::StatusOr<std::unique_ptr<NcclRuntime>> nccl =
      NcclRuntime::Load(cuda::CudaApi::LibraryDirsBeside(options_.pjrt_plugin));
  if (nccl.ok()) {
    nccl_ = *std::move(nccl);
    SPDLOG_INFO("NCCL: all_reduce between GPU islands may run on GPUs");
  } else {
    SPDLOG_INFO("NCCL: not used ({}); all_reduce sums on the host",
                nccl.status().ToString());
  }
}

void WorkerImpl::SetUpCudaIpc() {
  // CUDA IPC with the workers of this host: where the devices are the
  // plugin's CUDA GPUs (the plugin is loaded by now).
  if (options_.devices_from_plugin) {
    cuda_ipc_ =
        CudaIpc::Create(options_.cuda_ipc, (*xla_->Runtime())->platform(),
                        options_.pjrt_plugin);
  } else {
    cuda_ipc_ = CudaIpc::Off(absl::FailedPreconditionError(
        "the worker's devices are not a PJRT plugin's GPUs (--gpus)"));
  }
  if (cuda_ipc_->available().ok()) {
    SPDLOG_INFO("CUDA IPC with workers of this host: on");
  } else {
    SPDLOG_INFO("CUDA IPC with workers of this host: off ({})",
                std::string(cuda_ipc_->available().message()));
  }
}

void WorkerImpl::MakeStoreAndDevices(const std::vector<DeviceSpec>& specs) {
  ObjectStore::Options store_options;
  for (const DeviceSpec& spec : specs) {
    store_options.device_memory.push_back(spec.memory);
  }
  // A client's fetch or wait may name an output whose call still waits at
  // the server's admission (behind its own backlog, or a busier tenant's):
  // the worker learns of it only when the call is admitted. So a key not
  // yet declared is waited for long; the wait also ends when it is
  // declared or failed, the client leaves, or the worker stops.
  store_options.unknown_key_timeout = kUnknownKeyTimeout;
  store_options.clock = options_.clock;
  store_ = std::make_unique<ObjectStore>(store_options);
  for (size_t d = 0; d < specs.size(); ++d) {
    devices_.push_back(std::make_unique<CpuDevice>(
        static_cast<int>(d), specs[d].memory,
        /*max_queued=*/65536, specs[d].kind, options_.clock));
  }
}

void WorkerImpl::MakeParts() {
  peers_ = std::make_unique<PeerTable>(me_, &counters_, cuda_ipc_.get(),
                                       &timeline_, &reports_);
  xla_programs_ =
      std::make_unique<XlaPrograms>(*xla_, *store_, *peers_, me_, timeline_,
                                    counters_, options_.clock, num_devices());
  tasks_ = std::make_unique<TaskRunner>(*store_, devices_, *xla_programs_,
                                        *peers_, reports_, timeline_, me_,
                                        nccl_.get(), options_.clock);
  applier_ = std::make_unique<OpApplier>(
      *store_, *peers_, *tasks_, *xla_programs_, reports_, session_, timeline_,
      nccl_.get(), num_devices(), relays_);
  // A GPU's values are placed in its memory as they arrive (the CPU
  // plugin's device memory is host memory: nothing to place).
  bool to_device_memory = false;
  if (options_.devices_from_plugin) {
    absl::StatusOr<const xla::PjrtRuntime*> runtime = xla_->Runtime();
    to_device_memory = runtime.ok() && (*runtime)->platform() != "cpu";
  }
  data_plane_ = std::make_unique<WorkerDataPlane>(
      me_, *store_, *peers_, *xla_, *cuda_ipc_, relays_, to_device_memory,
      WorkerDataPlane::OpsSink{
          .apply =
              [this](uint64_t generation, const std::string& bytes) {
                return session_.ApplyFramed(generation, bytes);
              },
          .ended =
              [this](uint64_t generation, const absl::Status& why) {
                session_.FramedOpsEnded(generation, why);
              },
          .opened =
              [this](uint64_t generation, int fd) {
                session_.FramedConnectionOpened(generation, fd);
              }});
}

absl::Status WorkerImpl::StartDataPlane() {
  transport::DataPlaneServerOptions dp;
  dp.tcp_host = options_.data_host;
  std::random_device rd;
  dp.unix_name = absl::StrCat("plexus-worker-", getpid(), "-", rd());
  dp.timeline = &timeline_;
  auto server =
      transport::DataPlaneServer::Start(dp, data_plane_.get(), &counters_);
  if (!server.ok()) return server.status();
  data_server_ = std::move(*server);
  return absl::OkStatus();
}

}  // namespace plexus
