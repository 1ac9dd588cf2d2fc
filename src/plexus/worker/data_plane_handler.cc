#include "plexus/worker/data_plane_handler.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace plexus {

WorkerDataPlane::WorkerDataPlane(const WorkerIdentity& me, ObjectStore& store,
                                 const PeerTable& peers, xla::XlaExecutor& xla,
                                 const CudaIpc& cuda_ipc,
                                 transport::RelayLinks& relays,
                                 bool to_device_memory, OpsSink ops)
    : me_(me),
      store_(store),
      peers_(peers),
      xla_(xla),
      cuda_ipc_(cuda_ipc),
      relays_(relays),
      to_device_memory_(to_device_memory),
      ops_(std::move(ops)) {}

absl::Status WorkerDataPlane::OpenRelay(const transport::DataPlanePeer& peer,
                                        int fd) {
  return relays_.Open(peer.id, fd);
}

void WorkerDataPlane::RelayEnded(const transport::DataPlanePeer& peer, int fd) {
  relays_.Ended(peer.id, fd);
}

absl::Status WorkerDataPlane::ApplyOps(const transport::DataPlanePeer& peer,
                                       uint64_t generation,
                                       std::string& message) {
  if (!ops_.apply) return DataPlaneHandler::ApplyOps(peer, generation, message);
  return ops_.apply(generation, message);
}

absl::Status WorkerDataPlane::OpsConnectionOpened(
    const transport::DataPlanePeer&, uint64_t generation, int fd) {
  if (ops_.opened) ops_.opened(generation, fd);
  return absl::OkStatus();
}

void WorkerDataPlane::OpsEnded(const transport::DataPlanePeer&,
                               uint64_t generation, const absl::Status& why) {
  if (ops_.ended) ops_.ended(generation, why);
}

absl::Status WorkerDataPlane::AdmitGeneration(uint64_t generation) {
  std::optional<int64_t> fenced = peers_.FencedWorker(generation);
  if (!fenced.has_value()) return absl::OkStatus();
  pushes_fenced_++;
  return absl::FailedPreconditionError(absl::StrCat(
      "a push from worker ", *fenced, " of generation ", generation,
      ", which the server declared down: fenced (it rejoins as "
      "a fresh host)"));
}

absl::StatusOr<Credential> WorkerDataPlane::CredentialFor(
    const transport::DataPlanePeer& peer) {
  switch (peer.role) {
    case CredentialRole::kClient:
      return me_.secret.Derive(CredentialRole::kClient, peer.id);
    case CredentialRole::kWorker:
      if (peer.id != 0) break;
      return me_.secret.Derive(CredentialRole::kWorker);
    case CredentialRole::kServer:
      if (peer.id != 0 || !ops_.apply) break;
      return me_.secret.Derive(CredentialRole::kServer);
    default:
      break;
  }
  return absl::PermissionDeniedError(
      "only client sessions, workers and the server open data-plane "
      "connections");
}

absl::Status WorkerDataPlane::Authorize(transport::DataPlaneRequest request,
                                        const transport::ShardKey& key,
                                        const transport::DataPlanePeer& peer) {
  if (absl::Status s = transport::CheckOpsPeer(request, peer); !s.ok()) {
    return s;
  }
  if (peer.role == CredentialRole::kServer) return absl::OkStatus();
  if (request == transport::DataPlaneRequest::kRelay) {
    if (peer.role == CredentialRole::kClient) return absl::OkStatus();
    return absl::PermissionDeniedError(
        "a relay connection is a client's; this connection is a worker's");
  }
  if (request == transport::DataPlaneRequest::kPush ||
      request == transport::DataPlaneRequest::kPushError ||
      request == transport::DataPlaneRequest::kPushIpc ||
      request == transport::DataPlaneRequest::kFetchExecutable) {
    if (peer.role == CredentialRole::kWorker) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(request == transport::DataPlaneRequest::kFetchExecutable
                         ? "executables are fetched by workers"
                         : "a push comes from a worker",
                     "; this connection is client ", peer.id, "'s"));
  }
  // An id names its owner; only the owner's connection opens it.
  const uint64_t owner = ClientOfBuffer(key.buffer_id);
  if (peer.role == CredentialRole::kClient && peer.id == owner) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(KeyString(BufferKey{key.buffer_id, key.shard}),
                   " belongs to client ", owner, ", and this connection is ",
                   peer.role == CredentialRole::kWorker
                       ? std::string("a worker's")
                       : absl::StrCat("client ", peer.id, "'s")));
}

absl::Status WorkerDataPlane::AdmitIncoming(const transport::ShardKey& key,
                                            size_t bytes, bool from_client) {
  return store_.AdmitIncoming({key.buffer_id, key.shard},
                              static_cast<int64_t>(bytes), from_client);
}

absl::StatusOr<std::shared_ptr<Storage>> WorkerDataPlane::AllocateIncoming(
    const transport::ShardKey& key, size_t bytes, bool from_client) {
  return Storage::AllocateForWrite(bytes);
}

absl::Status WorkerDataPlane::Deliver(const transport::ShardKey& key,
                                      std::shared_ptr<Storage> data,
                                      bool from_client) {
  const BufferKey at{key.buffer_id, key.shard};
  if (to_device_memory_) {
    absl::StatusOr<std::shared_ptr<Storage>> placed =
        [&]() -> absl::StatusOr<std::shared_ptr<Storage>> {
      absl::StatusOr<Placement> place = PlacementOf(at);
      if (!place.ok()) return place.status();
      absl::StatusOr<std::shared_ptr<xla::PjrtBuffer>> buffer =
          place->runtime->Upload(
              place->device, place->spec, data->data(),
              absl::StrCat(KeyString(at),
                           from_client ? " put by its client" : " pushed"));
      if (!buffer.ok()) return buffer.status();
      return Storage::OnDevice(*std::move(buffer));
    }();
    if (placed.ok()) {
      store_.FulfilIncoming(at, *std::move(placed));
      return absl::OkStatus();
    }
    if (!upload_failure_said_.exchange(true)) {
      SPDLOG_WARN(
          "{} stays in host memory, copied into device memory by each "
          "program that reads it (said once): {}",
          KeyString(at), placed.status().ToString());
    }
  }
  store_.FulfilIncoming(at, std::move(data));
  return absl::OkStatus();
}

absl::StatusOr<WorkerDataPlane::Placement> WorkerDataPlane::PlacementOf(
    const BufferKey& at) {
  absl::StatusOr<std::pair<TensorSpec, int>> declared = store_.Describe(at);
  if (!declared.ok()) return declared.status();
  absl::StatusOr<const xla::PjrtRuntime*> runtime = xla_.Runtime();
  if (!runtime.ok()) return runtime.status();
  return Placement{declared->first, declared->second, *runtime};
}

bool WorkerDataPlane::OpensCudaIpc() { return cuda_ipc_.available().ok(); }

absl::Status WorkerDataPlane::ReceiveIpc(const transport::ShardKey& key,
                                         const transport::IpcShard& shard) {
  const BufferKey at{key.buffer_id, key.shard};
  if (!OpensCudaIpc()) {
    return absl::FailedPreconditionError("this worker opens no CUDA IPC");
  }
  if (absl::Status s = store_.AdmitIncoming(
          at, static_cast<int64_t>(shard.bytes), /*from_client=*/false);
      !s.ok()) {
    return s;
  }
  auto copied = [&]() -> absl::StatusOr<std::shared_ptr<Storage>> {
    absl::StatusOr<Placement> place = PlacementOf(at);
    if (!place.ok()) return place.status();
    absl::StatusOr<std::shared_ptr<xla::PjrtBuffer>> buffer =
        place->runtime->CreateUninitialized(
            place->device, place->spec,
            absl::StrCat(KeyString(at), " by CUDA IPC"));
    if (!buffer.ok()) return buffer.status();
    // Ready once its allocation is (work queued before it on the device
    // may still use that memory).
    absl::StatusOr<GpuAddress> dst = (*buffer)->gpu_address();
    if (!dst.ok()) return dst.status();
    if (absl::Status s = cuda_ipc_.CopyIn(shard, *dst); !s.ok()) return s;
    return Storage::OnDevice(*std::move(buffer));
  }();
  if (!copied.ok()) {
    store_.AbandonIncoming(at);
    return copied.status();
  }
  store_.FulfilIncoming(at, *std::move(copied));
  return absl::OkStatus();
}

void WorkerDataPlane::DeliverError(const transport::ShardKey& key,
                                   const absl::Status& error) {
  store_.Fail({key.buffer_id, key.shard}, error);
}

absl::StatusOr<std::shared_ptr<const Storage>> WorkerDataPlane::AwaitReady(
    const transport::ShardKey& key) {
  return AwaitReadyTelling(key, nullptr);
}

namespace {

// A value in device memory may still be being computed: a client's wait
// or fetch is answered once it is, with its error if it failed.
absl::StatusOr<std::shared_ptr<const Storage>> Computed(
    absl::StatusOr<std::shared_ptr<const Storage>> ready) {
  if (ready.ok() && *ready != nullptr) {
    if (const DeviceBuffer* device = (*ready)->device_buffer()) {
      if (absl::Status s = device->Await(); !s.ok()) return s;
    }
  }
  return ready;
}

ObjectStore::Watch StoreWatch(
    const transport::DataPlaneHandler::ReadyWatch& w) {
  return {w.id, w.deadline};
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Storage>>
WorkerDataPlane::AwaitReadyTelling(const transport::ShardKey& key,
                                   const ReadyHook& on_ready) {
  return Computed(store_.AwaitReady({key.buffer_id, key.shard}, on_ready));
}

std::optional<absl::StatusOr<std::shared_ptr<const Storage>>>
WorkerDataPlane::WatchReady(const transport::ShardKey& key,
                            const ReadyHook& on_ready,
                            std::function<void()> poke, ReadyWatch* watch) {
  ObjectStore::Watch kept;
  auto now = store_.WatchReady({key.buffer_id, key.shard}, on_ready,
                               std::move(poke), &kept);
  if (!now.has_value()) {
    *watch = {kept.id, kept.deadline};
    return std::nullopt;
  }
  return Computed(*std::move(now));
}

void WorkerDataPlane::EndWatch(const transport::ShardKey& key,
                               const ReadyWatch& watch) {
  store_.EndWatch({key.buffer_id, key.shard}, StoreWatch(watch));
}

absl::StatusOr<std::shared_ptr<const Storage>> WorkerDataPlane::AwaitWatched(
    const transport::ShardKey& key, const ReadyWatch& watch) {
  return Computed(
      store_.AwaitWatched({key.buffer_id, key.shard}, StoreWatch(watch)));
}

absl::StatusOr<std::shared_ptr<const Storage>>
WorkerDataPlane::SerializedExecutable(uint64_t fingerprint) {
  absl::StatusOr<xla::XlaExecutor::Serialized> serialized =
      xla_.Serialize(fingerprint);
  if (!serialized.ok()) return serialized.status();
  proto::XlaSerializedExecutable msg;
  msg.set_module(std::move(serialized->module));
  msg.set_compile_options(std::move(serialized->compile_options));
  msg.set_executable(std::move(serialized->executable));
  absl::StatusOr<std::shared_ptr<Storage>> bytes =
      Storage::AllocateForWrite(msg.ByteSizeLong());
  if (!bytes.ok()) return bytes.status();
  if (!msg.SerializeToArray((*bytes)->data(),
                            static_cast<int>((*bytes)->size()))) {
    return absl::InternalError("cannot encode a serialized executable");
  }
  return std::shared_ptr<const Storage>(*std::move(bytes));
}

}  // namespace plexus
