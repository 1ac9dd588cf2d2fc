// What the worker answers on its data plane (transport::DataPlaneHandler):
// who may connect and ask for what, incoming shards (pushes, puts, CUDA
// IPC, pushed errors), fetches and waits, and serialized executables for
// peers.
//
// A connection proves a client's credential, the worker credential or
// the server's, each derived from the cluster secret. A client's request
// (put, fetch, wait) is allowed on a connection of the client its buffer
// id names; a push, on a worker's; the server's ops (OPS), on the
// server's, which may ask for nothing else.
//
// Owns the count of fenced pushes. Borrows the identity, the object store,
// the peer table (fenced generations), the XLA executor, the CUDA IPC and
// the relay links; they outlive it.
//
// Thread-safe (the data plane's threads call it); no lock of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "plexus/executors/xla/xla_executor.h"
#include "plexus/store/object_store.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/relay_links.h"
#include "plexus/worker/cuda_ipc.h"
#include "plexus/worker/peer_table.h"
#include "plexus/worker/worker_identity.h"

namespace plexus {

class WorkerDataPlane : public transport::DataPlaneHandler {
 public:
  // Where the server's OPS frames go (ServerSession::ApplyFramed and
  // FramedOpsEnded); unset: this worker takes none.
  struct OpsSink {
    std::function<absl::Status(uint64_t generation, const std::string& bytes)>
        apply;
    std::function<void(uint64_t generation, const absl::Status& why)> ended;
    // The connection's socket at its first OPS frame (its reports go back
    // on it: ServerSession::FramedConnectionOpened).
    std::function<void(uint64_t generation, int fd)> opened;
  };
  // `to_device_memory`: the worker's devices are a PJRT plugin's GPUs, so
  // a value that arrives in host memory (a client's put, a peer's push
  // through host memory) is placed in its device's memory before it is
  // stored (PjrtRuntime::Upload), once, as jax.device_put places it; where
  // that fails (the device is out of memory) it is stored in host memory,
  // said once in the log, and each program reading it copies it in.
  // `relays`: where clients' RELAY connections go (OpenRelay).
  WorkerDataPlane(const WorkerIdentity& me, ObjectStore& store,
                  const PeerTable& peers, xla::XlaExecutor& xla,
                  const CudaIpc& cuda_ipc, transport::RelayLinks& relays,
                  bool to_device_memory = false, OpsSink ops = {});

  absl::StatusOr<Credential> CredentialFor(
      const transport::DataPlanePeer& peer) override;
  absl::Status Authorize(transport::DataPlaneRequest request,
                         const transport::ShardKey& key,
                         const transport::DataPlanePeer& peer) override;
  // Refuses the pushes of a registration the server declared down
  // (PeerDown.generation), counted in WorkerStats.pushes_fenced.
  absl::Status AdmitGeneration(uint64_t generation) override;
  absl::Status AdmitIncoming(const transport::ShardKey& key, size_t bytes,
                             bool from_client) override;
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(
      const transport::ShardKey& key, size_t bytes, bool from_client) override;
  // Stores the shard: in its device's memory where the constructor says
  // so (see there), else as it came.
  absl::Status Deliver(const transport::ShardKey& key,
                       std::shared_ptr<Storage> data,
                       bool from_client) override;
  void DeliverError(const transport::ShardKey& key,
                    const absl::Status& error) override;
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const transport::ShardKey& key) override;
  // The store's wait with the data plane's hook (ObjectStore::AwaitReady):
  // a client's fetch of a value a task on this worker makes is answered by
  // the thread that readies it.
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReadyTelling(
      const transport::ShardKey& key, const ReadyHook& on_ready) override;
  // The store's watch (ObjectStore::WatchReady), and its end; a ready
  // value in device memory is awaited as AwaitReadyTelling awaits it.
  std::optional<absl::StatusOr<std::shared_ptr<const Storage>>> WatchReady(
      const transport::ShardKey& key, const ReadyHook& on_ready,
      std::function<void()> poke, ReadyWatch* watch) override;
  void EndWatch(const transport::ShardKey& key,
                const ReadyWatch& watch) override;
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitWatched(
      const transport::ShardKey& key, const ReadyWatch& watch) override;
  // Where the worker's devices are CUDA GPUs and the CUDA libraries load
  // (CudaIpc::available).
  bool OpensCudaIpc() override;
  // Admits the shard, makes a buffer of its declared spec on its device
  // (PjrtRuntime::CreateUninitialized), copies the peer's value into it
  // (CudaIpc::CopyIn) and stores it there, charged as any device value;
  // any failure after admitting returns the charge (AbandonIncoming).
  absl::Status ReceiveIpc(const transport::ShardKey& key,
                          const transport::IpcShard& shard) override;
  // A proto::XlaSerializedExecutable of this worker's cache, for a peer
  // (a spare); never waits for a compile under way.
  absl::StatusOr<std::shared_ptr<const Storage>> SerializedExecutable(
      uint64_t fingerprint) override;

  // The server's ops, to the sink (ServerSession).
  absl::Status ApplyOps(const transport::DataPlanePeer& peer,
                        uint64_t generation, std::string& message) override;
  void OpsEnded(const transport::DataPlanePeer& peer, uint64_t generation,
                const absl::Status& why) override;
  absl::Status OpsConnectionOpened(const transport::DataPlanePeer& peer,
                                   uint64_t generation, int fd) override;

  // A client's relay connection, to `relays` (RelayLinks::Open, Ended).
  absl::Status OpenRelay(const transport::DataPlanePeer& peer, int fd) override;
  void RelayEnded(const transport::DataPlanePeer& peer, int fd) override;
  // Pushes refused because their generation was declared down.
  int64_t pushes_fenced() const { return pushes_fenced_.load(); }

 private:
  // Where a declared shard goes: its spec, its device, and the runtime of
  // that device (the worker's PJRT plugin).
  struct Placement {
    TensorSpec spec;
    int device;
    const xla::PjrtRuntime* runtime;
  };
  absl::StatusOr<Placement> PlacementOf(const BufferKey& at);

  const WorkerIdentity& me_;
  ObjectStore& store_;
  const PeerTable& peers_;
  xla::XlaExecutor& xla_;
  const CudaIpc& cuda_ipc_;
  transport::RelayLinks& relays_;
  const bool to_device_memory_;
  const OpsSink ops_;
  std::atomic<int64_t> pushes_fenced_{0};
  std::atomic<bool> upload_failure_said_{false};
};

}  // namespace plexus
