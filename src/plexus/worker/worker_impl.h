// Internal: the Worker implementation (see worker.h), a coordinator over
// the worker's parts, each behind its own header:
//
//   ServerSession    the control stream: registration, reader, writer,
//                    heartbeats (server_session.h)
//   OpApplier        the server's ops, in order; the program table
//                    (op_applier.h)
//   TaskRunner       calls' shard tasks on the devices (task_runner.h)
//   XlaPrograms      XLA executables and their runs (xla_programs.h)
//   WorkerDataPlane  what peers and clients ask of the data plane
//                    (data_plane_handler.h)
//   PeerTable        peers, their senders, those declared down
//                    (peer_table.h)
//   ReportQueue      what the writer sends besides heartbeats
//                    (report_queue.h)
//
// It owns them and what they share (the identity, the object store, the
// devices, the XLA executor, the GPUs' collectives, CUDA IPC, the data
// plane and the timeline), builds them in StartLocal (worker_local.cc),
// passing each the references it needs, and tears them down in the order
// their threads require (~WorkerImpl). It adds no lock of its own: the
// parts' locks are each their own; where one part calls another under a
// lock, its header says so.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/advertised_address.h"
#include "plexus/worker/cuda_ipc.h"
#include "plexus/worker/data_plane_handler.h"
#include "plexus/worker/device.h"
#include "plexus/worker/nccl_collective.h"
#include "plexus/worker/op_applier.h"
#include "plexus/worker/peer_table.h"
#include "plexus/worker/report_queue.h"
#include "plexus/worker/server_session.h"
#include "plexus/worker/task_runner.h"
#include "plexus/worker/worker.h"
#include "plexus/worker/worker_identity.h"
#include "plexus/worker/xla_programs.h"

namespace plexus {

class WorkerImpl : public Worker {
 public:
  explicit WorkerImpl(const WorkerOptions& options);
  ~WorkerImpl() override;

  // StartLocal, then the server session (registers and applies the first
  // ops).
  absl::Status Init();
  // The worker without its server session (worker_local.cc): object store,
  // devices, XLA executor, data plane and the parts over them. What Init
  // does before it connects; on its own, a harness
  // (fuzz/worker_ops_fuzz.cc) feeds ApplyOps directly.
  absl::Status StartLocal();
  // Applies one message of the server's op stream, in order (the first
  // message also names this worker). The reader thread's only entry point:
  // one caller at a time.
  void ApplyOps(proto::ServerToWorker& msg);
  // This worker's devices, by index (fixed once StartLocal returned).
  int num_devices() const { return static_cast<int>(devices_.size()); }
  const Device& device(int index) const { return *devices_[index]; }
  // Tasks queued or running on this worker's devices.
  int64_t pending_tasks() const {
    int64_t n = 0;
    for (const auto& d : devices_) n += d->pending();
    return n;
  }
  absl::Status Wait() override;
  void Shutdown() override;
  absl::StatusOr<bool> Resume(absl::Duration drain) override;
  int64_t worker_id() const override { return me_.worker_id.load(); }
  uint64_t generation() const override { return me_.generation.load(); }
  // The TCP data plane as bound (tests connect to it).
  std::string data_address() const { return data_server_->tcp_address(); }
  // What the data plane asks of this worker (tests call it directly).
  WorkerDataPlane& data_plane() { return *data_plane_; }
  // What the writer sends the server besides heartbeats (tests read it).
  ReportQueue& reports() { return reports_; }
  // The server's ops taken as frames, and the calls-done reports sent
  // back as frames (ServerSession).
  int64_t framed_messages() const { return session_.framed_messages(); }
  int64_t framed_reports() const { return session_.framed_reports(); }
  // Pushes refused because their generation was declared down.
  int64_t pushes_fenced() const { return data_plane_->pushes_fenced(); }
  // Tasks run on the reader as they came (TaskRunner::TryRunInline).
  int64_t tasks_inline() const { return tasks_->tasks_inline(); }

  // The object store's deadline for a key not yet declared: a client's
  // fetch or wait may name an output whose call still waits at the
  // server's admission.
  static constexpr absl::Duration kUnknownKeyTimeout = absl::Minutes(10);

 private:
  // StartLocal's steps (worker_local.cc).
  struct DeviceSpec {
    std::string kind;
    int64_t memory;
  };
  absl::Status SetUpIdentity();
  // The devices: the plugin's, or num_devices of device_memory each; with
  // the plugin's CUDA GPUs, NCCL where it loads.
  absl::StatusOr<std::vector<DeviceSpec>> DeviceSpecs();
  void SetUpNccl(const xla::PjrtRuntime& runtime);
  void SetUpCudaIpc();
  void MakeStoreAndDevices(const std::vector<DeviceSpec>& specs);
  void MakeParts();
  absl::Status StartDataPlane();

  // The registration the session sends (worker.cc).
  proto::WorkerToServer Registration() const;
  // A heartbeat's figures (worker_stats.cc). Never waits: counters are
  // atomics, and what sits under a lock another thread may hold (the
  // store's, the report queue's) is read only if that lock is free at
  // once, else the last beat's figures go again. Only the heartbeat
  // thread calls it.
  proto::WorkerStats CollectStats();
  // The tasks' input waits under way (ObjectStore::AwaitInput), the
  // oldest kMaxAwaitedInputs of them, into `stats`.
  void AddAwaitedInputs(proto::WorkerStats* stats);
  static constexpr int kMaxAwaitedInputs = 32;

  const WorkerOptions options_;
  // Set by Resume before it registers again; ApplyOps reads it on the
  // first message.
  std::atomic<bool> resuming_{false};
  std::atomic<bool> stalled_once_{false};  // stall_first_execute, spent
  // What this worker did (timeline/timeline.h); the server collects it
  // (CollectTimeline, answered on the reader thread).
  Timeline timeline_;
  WorkerIdentity me_;
  ReportQueue reports_;
  ServerSession session_;

  std::unique_ptr<ObjectStore> store_;
  std::unique_ptr<xla::XlaExecutor> xla_;
  // Set by StartLocal before the data plane starts; never null after.
  std::unique_ptr<CudaIpc> cuda_ipc_;
  // NCCL's GPUs (NcclRuntime), where the worker's devices are a CUDA
  // plugin's and CUDA and NCCL load, or OffersWithoutGpu where the options
  // say; else null: all_reduce sums on the host.
  std::unique_ptr<CollectiveGpus> nccl_;
  std::vector<std::unique_ptr<Device>> devices_;
  transport::DataPlaneCounters counters_;
  // The clients' relay links (the data plane opens them, the applier's
  // relayed calls answer on them); outlive the parts below.
  transport::RelayLinks relays_{&counters_, &timeline_};

  // The parts, made by StartLocal (null before, or where it failed early).
  std::unique_ptr<PeerTable> peers_;
  std::unique_ptr<XlaPrograms> xla_programs_;
  std::unique_ptr<TaskRunner> tasks_;
  std::unique_ptr<OpApplier> applier_;
  std::unique_ptr<WorkerDataPlane> data_plane_;
  std::unique_ptr<transport::DataPlaneServer> data_server_;

  // The last figures read under a lock (heartbeat thread only): sent again
  // when that lock is busy at a beat.
  ObjectStoreStats last_store_stats_;
  std::vector<proto::ClientUsage> last_usage_;
  std::string xla_platform_;  // XlaExecutor::Describe() once it says one
  std::vector<AwaitedInput> awaited_;  // AddAwaitedInputs' (reused) list
};

}  // namespace plexus
