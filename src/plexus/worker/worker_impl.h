// Internal: the Worker implementation. See worker.h.
#pragma once

#include <pthread.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/collective.h"
#include "plexus/worker/cuda_ipc.h"
#include "plexus/worker/device.h"
#include "plexus/worker/peer_sender.h"
#include "plexus/worker/worker.h"

namespace plexus {

// The data-plane address a worker registers: `bound` ("HOST:PORT", as the
// TCP data plane bound it) with `advertise_host` for its host; with none,
// `bound` itself, unless it binds every interface (0.0.0.0, [::]): then the
// local address that reaches `server`, else the host name.
std::string AdvertisedDataAddress(const std::string& bound,
                                  const std::string& advertise_host,
                                  const std::string& server);

// Names the calling thread (`top -H`, /proc/PID/task/*/comm, debuggers);
// at most 15 characters.
inline void SetThreadName(const char* name) {
  pthread_setname_np(pthread_self(), name);
}

// A program as loaded on this worker: a built-in kernel, or an XLA module.
struct LoadedProgram {
  uint64_t id = 0;  // LoadProgram.program_id
  std::string name;
  const builtin::Kernel* kernel = nullptr;
  Attrs attrs;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;

  std::unique_ptr<proto::XlaProgram> xla;  // set for kernel "xla"
  // The executables of `xla` by island (device indices), resolved through
  // the worker's content-addressed cache on the first call of each.
  absl::Mutex xla_mu;
  absl::flat_hash_map<std::vector<int>,
                      std::shared_ptr<const xla::PjrtExecutable>>
      executables ABSL_GUARDED_BY(xla_mu);
};

class WorkerImpl : public Worker, public transport::DataPlaneHandler {
 public:
  explicit WorkerImpl(const WorkerOptions& options);
  ~WorkerImpl() override;

  // StartLocal, then ConnectToServer (registers and applies the first ops).
  absl::Status Init();
  // The worker without its server session (worker_local.cc): object store,
  // devices, XLA executor and data plane. What Init does before it
  // connects; on its own, a harness (fuzz/worker_ops_fuzz.cc) feeds
  // ApplyOps directly.
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
  int64_t worker_id() const override { return worker_id_.load(); }
  uint64_t generation() const override { return generation_.load(); }
  // The TCP data plane as bound (tests connect to it).
  std::string data_address() const { return data_server_->tcp_address(); }
  // Pushes refused because their generation was declared down.
  int64_t pushes_fenced() const { return pushes_fenced_.load(); }

  // transport::DataPlaneHandler (data_plane_handler.cc)
  // A connection proves a client's credential or the worker credential,
  // each derived from the cluster secret. A client's request (put, fetch,
  // wait) is allowed on a connection of the client its buffer id names; a
  // push, on a worker's.
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
  absl::Status Deliver(const transport::ShardKey& key,
                       std::shared_ptr<Storage> data,
                       bool from_client) override;
  void DeliverError(const transport::ShardKey& key,
                    const absl::Status& error) override;
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const transport::ShardKey& key) override;
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

 private:
  // --- control stream (worker.cc)
  absl::Status ConnectToServer();
  void ReaderLoop();
  // Sends what the worker has to report (calls done, transfers it could
  // not deliver) as it comes; never heartbeats.
  void WriterLoop();
  // Sends a heartbeat every heartbeat_interval_ on its own thread, which
  // waits on nothing but its own lock and the stream (HeartbeatLoop below).
  void HeartbeatLoop();
  // Tells the heartbeat thread to stop (the session is over).
  void StopHeartbeats();
  // One message on the control stream: the writer and the heartbeat thread
  // share it, one write at a time. False once the stream is closed.
  bool WriteToServer(const proto::WorkerToServer& msg);
  // A peer sender could not deliver `key` to `dst_worker`: the writer tells
  // the server, which fails the key there.
  void ReportTransferFailure(int64_t dst_worker, const transport::ShardKey& key,
                             const absl::Status& reason);
  // Ops are consumed (moved from): the reader owns each message.
  void Apply(proto::WorkerOp& op);
  void ApplyExecute(proto::Execute& exec);
  void ApplyTransfer(const proto::Transfer& transfer);
  void ApplyPeerDown(const proto::PeerDown& down);
  // The spec of a shard the server declares on `device`, or why this
  // worker cannot hold it (no such device, a spec that does not parse):
  // the shard then fails instead of waiting for data in a wrong size.
  absl::StatusOr<TensorSpec> HeldSpec(const BufferKey& key,
                                      const proto::TensorSpec& spec,
                                      int device) const;
  // A heartbeat's figures. Never waits: counters are atomics, and what sits
  // under a lock another thread may hold (the store's, mu_) is read only if
  // that lock is free at once, else the last beat's figures go again. Only
  // the heartbeat thread calls it.
  proto::WorkerStats CollectStats();
  // The last task of a call on this worker ended (done or failed): the
  // writer reports it to the server's admission (CallsDone), and the
  // client's usage grows.
  // A reported copy (Expect.report) arrived: told in the next CallsDone.
  void CopyArrived(uint64_t buffer_id);
  void CallFinished(const proto::Execute& exec, bool failed,
                    int64_t busy_micros, int64_t queued_micros);
  // The sender to a peer, made on first use: valid until ~WorkerImpl; null
  // for an unknown peer, and once the worker is being destroyed.
  PeerSender* SenderTo(int64_t worker_id);

  // --- execution (task_runner.cc)
  struct CallContext;
  // `queued`: when it entered its device's queue.
  void RunTask(const std::shared_ptr<CallContext>& call, int task_index,
               absl::Time queued);
  // The end of a task's work (at once, or when its XLA run has ended): its
  // inputs are let go and, for the call's last task here, the call is
  // reported done.
  // A shard task's event, from `started` to `ended` (real clock readings).
  void RecordTask(const CallContext& call, int task_index, absl::Time started,
                  absl::Time ended, bool failed);
  void FinishTask(const std::shared_ptr<CallContext>& call, int task_index,
                  std::vector<std::shared_ptr<const Storage>> keep,
                  int64_t scratch_bytes, int64_t busy_micros);
  // Blocks until every XLA run queued so far has ended and been finished
  // (the destructor, once no device queues more).
  void AwaitXlaRuns();
  // Runs partition `task_index` of an XLA call (xla_task.cc): joins the
  // island's other tasks and returns once the executable's run is queued
  // (call.island->WhenEnded tells when it has run). Inputs are
  // `ctx.inputs`, read from `input_devices[i]` where that is set (a device
  // buffer, which need not be ready); the outputs it makes go into the null
  // entries of `outputs` (device memory, ready when the run has completed;
  // the others were made by the caller). `donate[i]`: input i was taken
  // for donation (TakeDonations), and the run may write over it.
  absl::Status RunXlaPartition(
      const std::shared_ptr<CallContext>& call, int task_index,
      const builtin::KernelContext& ctx,
      const std::vector<const DeviceBuffer*>& input_devices,
      const std::vector<bool>& donate,
      std::vector<std::shared_ptr<Storage>>* outputs);
  // The donated inputs of an XLA task that it may give to the run
  // (task_runner.cc): each the server allowed (InputBinding.donate), a
  // device value of the aliased output's shape, and held by nothing else
  // here (ObjectStore::TakeForDonation: its store entry then says it was
  // donated; `keep` and `bound` are the task's own references). Sets
  // donate[i], and written_over[o] = i for output o, whose charge is input
  // i's; counts the donations declined.
  void TakeDonations(const CallContext& call, int task_index,
                     const builtin::KernelContext& ctx,
                     const std::vector<const DeviceBuffer*>& input_devices,
                     const std::vector<std::shared_ptr<const Storage>>& keep,
                     const std::vector<std::shared_ptr<const Storage>>& bound,
                     std::vector<bool>* donate, std::vector<int>* written_over);
  // The executable of `program` for the island on `devices`: cached, else
  // loaded from a peer (LoadFromPeers), else compiled.
  absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>> XlaExecutableFor(
      LoadedProgram& program, const std::vector<int>& devices);
  // The executable of (`module`, `island`'s options) loaded from the
  // serialized bytes of a worker the program names for an island of that
  // content (a live worker, for a spare), checked to be that content's and
  // to run on the island's devices; null where none does (the caller
  // compiles). Waits, at most kAwaitPeerCompile, for live peers that do not
  // have it yet (compiling it): a host standing by when a program is
  // registered loads it once a worker of its island has compiled it.
  // Returns null at once when the worker stops.
  std::shared_ptr<const xla::PjrtExecutable> LoadFromPeers(
      const LoadedProgram& program, const std::string& module,
      const proto::XlaIsland& island);
  // FETCH_EXECUTABLE from `peer`'s data plane, in at most
  // kFetchExecutableTimeout; given up once the peer is declared down.
  absl::StatusOr<std::shared_ptr<Storage>> FetchExecutable(
      int64_t peer, uint64_t fingerprint);
  static constexpr absl::Duration kFetchExecutableTimeout = absl::Seconds(2);
  static constexpr absl::Duration kAwaitPeerCompile = absl::Seconds(30);
  // Ahead-of-time compiles (xla_task.cc): an XLA program loaded before its
  // first call compiles its islands on this worker on the compiler thread,
  // off the device threads; a call that comes first waits for it. Its own
  // islands, or, `stand_by` (the server's LoadProgram.stand_by: this host
  // may take a lost host's place), every island that fits its devices.
  void CompileAhead(std::shared_ptr<LoadedProgram> program, bool stand_by);
  // Runs at kCompileNice above the worker's nice value.
  void CompilerLoop();
  static constexpr int kCompileNice = 5;
  void StopCompiler();
  // Lists a compile of `program`'s island on `devices` in
  // WorkerStats.compiling until the returned token is given to EndCompile.
  int64_t BeginCompile(const LoadedProgram& program,
                       const std::vector<int>& devices);
  void EndCompile(int64_t token);
  // Argument `binding` of a task on `device`, from its pieces: in host
  // memory, or, where `in_device` is given and the argument is one whole
  // shard in device memory, that shard as it is (*in_device set; the
  // tensor's data is its host address, which may be null).
  absl::StatusOr<builtin::ConstTensor> BindInput(
      const proto::InputBinding& binding, int device,
      std::vector<std::shared_ptr<const Storage>>* keep,
      int64_t* reserved_bytes, const DeviceBuffer** in_device = nullptr);

  const WorkerOptions options_;
  // What this worker did (timeline/timeline.h); the server collects it
  // (CollectTimeline, answered on the reader thread).
  Timeline timeline_;
  // The heartbeats' clock probes: the last round trip completed (the
  // server's ClockEcho, read at t4), which the next heartbeat carries.
  absl::Mutex probe_mu_;
  proto::ClockProbe last_probe_ ABSL_GUARDED_BY(probe_mu_);
  void ApplyClockEcho(const proto::ClockEcho& echo);
  void SendTimeline(const proto::CollectTimeline& request);
  ClusterSecret secret_;  // options_.secret, or one of its own (StartLocal)
  std::string machine_id_;
  std::atomic<int64_t> worker_id_{-1};
  // This registration's, from the server's first message (0 without one).
  std::atomic<uint64_t> generation_{0};
  // The server's, or options_.heartbeat_interval; set before the writer
  // starts.
  absl::Duration heartbeat_interval_ = absl::Milliseconds(100);

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
  std::unique_ptr<transport::DataPlaneServer> data_server_;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::WorkerToServer, proto::ServerToWorker>>
      stream_;
  std::thread reader_;
  std::thread writer_;
  std::thread heartbeat_;

  // One Write (or the WritesDone) at a time on stream_; after WritesDone
  // nothing more is written. Held only around those calls.
  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  // The heartbeat thread's own lock: no other work ever holds it.
  absl::Mutex beat_mu_;
  absl::CondVar beat_wake_;
  bool beat_stop_ ABSL_GUARDED_BY(beat_mu_) = false;
  // The last figures read under a lock (heartbeat thread only): sent again
  // when that lock is busy at a beat.
  ObjectStoreStats last_store_stats_;
  std::vector<proto::ClientUsage> last_usage_;
  std::string xla_platform_;  // XlaExecutor::Describe() once it says one

  // Peers the server declared down, and why: a collective with one that
  // arrives later fails at once (an Expect from one fails in the store:
  // FailFromSource). Ops can come after the PeerDown, since admission holds
  // calls at the server until there is room. A host that comes back
  // rejoins under a new id, so an id once down stays down. Reader thread
  // only.
  absl::flat_hash_map<int64_t, absl::Status> down_peers_;

  // Programs are loaded, looked up and unloaded by the reader thread only;
  // calls and compile jobs hold their own references.
  absl::flat_hash_map<uint64_t, std::shared_ptr<LoadedProgram>> programs_;
  std::atomic<int64_t> programs_loaded_{0};  // programs_.size(), for stats

  absl::Mutex peers_mu_;
  absl::flat_hash_map<int64_t, proto::PeerInfo> peers_
      ABSL_GUARDED_BY(peers_mu_);
  // Senders live until the worker is destroyed, so SenderTo's raw pointers
  // stay valid in every callback (see ~WorkerImpl).
  absl::flat_hash_map<int64_t, std::unique_ptr<PeerSender>> senders_
      ABSL_GUARDED_BY(peers_mu_);
  bool senders_stopped_ ABSL_GUARDED_BY(peers_mu_) = false;
  // Generations the server declared down, and whose they were: their
  // pushes are refused.
  absl::flat_hash_map<uint64_t, int64_t> fenced_ ABSL_GUARDED_BY(peers_mu_);
  // Peers the server declared down (the reader's down_peers_, for the
  // threads that fetch executables).
  absl::flat_hash_set<int64_t> peers_down_ ABSL_GUARDED_BY(peers_mu_);

  absl::Mutex compile_mu_;
  std::deque<std::pair<std::shared_ptr<LoadedProgram>, std::vector<int>>>
      compile_queue_ ABSL_GUARDED_BY(compile_mu_);
  bool compile_stop_ ABSL_GUARDED_BY(compile_mu_) = false;
  std::thread compiler_;  // started by the first CompileAhead (reader thread)
  // The XLA compiles under way, on the compiler thread or a device thread,
  // by token (WorkerStats.compiling: the calls of their programs wait).
  struct Compiling {
    uint64_t program_id = 0;
    std::string program;
    std::vector<int> devices;
    absl::Time started;
  };
  absl::Mutex compiling_mu_;
  absl::flat_hash_map<int64_t, Compiling> compiling_
      ABSL_GUARDED_BY(compiling_mu_);
  int64_t next_compile_ ABSL_GUARDED_BY(compiling_mu_) = 0;

  // XLA runs queued on the devices and ended (their FinishTask done): the
  // destructor waits for them all.
  std::atomic<int64_t> xla_runs_started_{0};
  absl::Mutex xla_runs_mu_;
  int64_t xla_runs_ended_ ABSL_GUARDED_BY(xla_runs_mu_) = 0;
  // Per device, when its last XLA run ended (unix micros), and the device
  // time of its XLA runs so far (WorkerStats.device_busy_micros).
  std::unique_ptr<std::atomic<int64_t>[]> device_run_ends_;
  std::unique_ptr<std::atomic<int64_t>[]> device_run_busy_;

  std::atomic<int64_t> calls_executed_{0};
  std::atomic<int64_t> calls_failed_{0};
  // Donated inputs written over by their run, and those that could not be
  // (WorkerStats.donations, donations_declined).
  std::atomic<int64_t> donations_{0};
  std::atomic<int64_t> donations_declined_{0};
  std::atomic<int64_t> pushes_fenced_{0};

  absl::Mutex mu_;
  absl::CondVar wake_writer_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;  // the reader saw its end
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;   // WritesDone was called
  std::vector<proto::TransferFailed> failed_transfers_ ABSL_GUARDED_BY(mu_);
  // Calls finished since the writer last reported them, and when the first
  // of them finished. Reported in batches (WriterLoop).
  static constexpr int kReportBatch = 512;
  static constexpr absl::Duration kUnknownKeyTimeout = absl::Minutes(10);
  static constexpr absl::Duration kReportDelay = absl::Milliseconds(1);
  proto::CallsDone calls_done_ ABSL_GUARDED_BY(mu_);
  absl::Time first_done_ ABSL_GUARDED_BY(mu_);
  // Device time and calls per live client (WorkerStats.clients).
  struct Usage {
    int64_t busy_micros = 0;
    int64_t calls = 0;
    int64_t tasks = 0;
    int64_t queued_micros = 0;
  };
  absl::flat_hash_map<uint64_t, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
