// The worker's execution of calls: a call's Execute op becomes its shard
// tasks on this worker's devices (Submit, in the order of the server's op
// stream), and each task, on its device's thread, binds its inputs, makes
// its outputs and runs its program: a built-in kernel, a collective with
// the call's peers, or its partition of an XLA island (XlaPrograms). When
// a call's last task here ends, the server hears of it (ReportQueue).
//
//   Submit (reader) ──▶ queued on a device ──▶ RunTask (device thread)
//     ──▶ outputs fulfilled or failed in the store ──▶ FinishTask
//         (an XLA partition: once its island's run has ended)
//
// A quick task runs on the reader itself (TryRunInline), saving the device
// thread's wake-up (a round trip's last hop but one, and a switch of the
// worker's CPU per call): the call's only task here, donating no input,
// of a program that is not a collective and whose last task on that device
// ran within
// kInlineTask (an XLA task's launch, and its run on the device), with its
// inputs ready and its memory reserved now without
// waiting (ObjectStore::TryReserve), on a device with nothing queued or
// running (Device::RunIfIdle). Nothing there can wait, so the reader is
// held at most about as long as the program's last task held its device.
//
// Owns the call and task counters (WorkerStats) and each device's XLA run
// times. Borrows the store, the devices, the XLA programs, the peer table,
// the report queue, the timeline, the identity and the GPUs' collectives
// (may be null); they outlive it.
//
// Thread-safety: Submit on the reader thread only; RunTask on device
// threads, or on the reader (TryRunInline); the rest from any thread. One lock
// of its own (xla_runs_mu_), a leaf.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/worker/call_context.h"
#include "plexus/worker/collective.h"
#include "plexus/worker/device.h"
#include "plexus/worker/loaded_program.h"
#include "plexus/worker/nccl_collective.h"
#include "plexus/worker/peer_table.h"
#include "plexus/worker/report_queue.h"
#include "plexus/worker/worker_identity.h"
#include "plexus/worker/xla_programs.h"

namespace plexus {

class TaskRunner {
 public:
  // The longest a program's last task may have held its device for its
  // next call to run on the reader (TryRunInline). A tiny program takes
  // 5-10 µs on a busy worker but 60-110 µs on one idle for a while (cold
  // caches: a blocking loop with the client's work between calls, on the
  // 2-core VM), and should run inline there too; the reader is held no
  // longer than a network hop.
  static constexpr absl::Duration kInlineTask = absl::Microseconds(200);

  TaskRunner(ObjectStore& store,
             const std::vector<std::unique_ptr<Device>>& devices,
             XlaPrograms& xla, PeerTable& peers, ReportQueue& reports,
             Timeline& timeline, const WorkerIdentity& me, CollectiveGpus* nccl,
             Clock* clock);

  // Queues the tasks of `exec` (consumed) on their devices, running
  // `program` (null: not loaded here; its tasks fail). Its outputs are
  // declared and its inputs pinned now, in stream order, so the fetches
  // and releases that follow see them; a task that cannot run (an input
  // gone, a device this worker lacks, a collective with a peer that is
  // down) fails its outputs when it comes to run.
  void Submit(proto::Execute& exec, std::shared_ptr<LoadedProgram> program);
  // Blocks until every XLA run queued so far has ended and been finished
  // (the destructor of the worker, once no device queues more).
  void AwaitXlaRuns();

  // WorkerStats.
  int64_t calls_executed() const { return calls_executed_.load(); }
  int64_t calls_failed() const { return calls_failed_.load(); }
  // Tasks run on the reader (TryRunInline).
  int64_t tasks_inline() const { return tasks_inline_.load(); }
  // The device time of device `d`'s XLA runs so far (its thread queues
  // them and does not wait for them).
  int64_t xla_busy_micros(int d) const { return device_run_busy_[d].load(); }

 private:
  // What one task holds while it runs (RunTask and its steps).
  struct TaskState {
    // What its inputs (and outputs aliasing them) point into.
    std::vector<std::shared_ptr<const Storage>> keep;
    std::vector<std::shared_ptr<Storage>> outputs;  // null: XLA makes it
    std::vector<bool> aliased;  // outputs[o] is an input's buffer
    int64_t scratch_bytes = 0;  // reserved to assemble inputs
    int64_t output_bytes = 0;   // reserved for outputs
    std::unique_ptr<ShardCollectives> shard_collectives;
    // It handed its input to the collective as stored (EnableNccl).
    bool contributed_stored = false;
    bool joined_island = false;  // RunPartition took it
    // Reserved on the device before the task ran (TryRunInline), not used
    // yet: its charges draw on it first, and the rest is let go after.
    int64_t reserved_ahead = 0;
  };

  // --- Submit's steps (task_submit.cc)
  // The call's collective with its peers, if its program is one: made
  // here, or why it cannot take place here (every task fails with it).
  absl::Status SetUpCollective(CallContext& call);
  absl::Status CheckCollective(const CallContext& call,
                               const std::vector<CallCollective::Peer>& peers,
                               int my_rank) const;
  void MakeCollective(CallContext& call,
                      std::vector<CallCollective::Peer> peers, int my_rank);
  // Declares each task's outputs and pins its inputs; sets input_errors.
  void DeclareAndPin(CallContext& call, const absl::Status& collective_error);
  // The local spec of each of the call's outputs (an empty spec where the
  // program names none, or cannot split it): the program's own list
  // (LoadedProgram::OutputsOn) where the op names its outputs, else one
  // made into `made`.
  static absl::Span<const TensorSpec> DeclaredSpecs(
      const CallContext& call, std::vector<TensorSpec>& made);
  void Enqueue(const std::shared_ptr<CallContext>& call);

  // --- a quick task on the reader (task_inline.cc)
  // Runs the call's task now, on this thread, if it may (the rules above);
  // false if it did not run.
  bool TryRunInline(const std::shared_ptr<CallContext>& call);
  // The most memory the call's task may charge to its device: its outputs,
  // its inputs (should they be assembled) and its XLA scratch.
  int64_t MostBytes(const CallContext& call) const;

  // --- a task (task_runner.cc)
  // `queued`: when it entered its device's queue. `reserved_ahead`: bytes
  // reserved for it on its device before (TryRunInline).
  void RunTask(const std::shared_ptr<CallContext>& call, int task_index,
               absl::Time queued, int64_t reserved_ahead = 0);
  // Why the task cannot run at all (found when queued; its client left; a
  // program not loaded or of other outputs), else OK.
  absl::Status CheckRunnable(const CallContext& call, int task_index,
                             bool dropped) const;
  // Binds the inputs, makes the outputs and runs the program; `dropped`:
  // its client has left.
  absl::Status ExecuteTask(const std::shared_ptr<CallContext>& call,
                           int task_index, bool dropped, TaskState& state);
  // all_reduce on the values as they are stored: the collective sums them
  // on the GPUs or on the host, and gives the output's Storage.
  absl::Status AllReduceStored(CallContext& call, int task_index,
                               const builtin::KernelContext& ctx,
                               const InputStorage& input_storage,
                               TaskState& state);
  // The outputs of the task, in `state` and `ctx`: charged to the device
  // and allocated, an input's buffer (aliased), or left null for XLA.
  // `all_aliased`: every output is an input's buffer.
  absl::Status MakeOutputs(const CallContext& call, int task_index,
                           const WrittenOver& written_over,
                           const InputStorage& input_storage,
                           builtin::KernelContext* ctx, TaskState& state,
                           bool* all_aliased);
  // The task ran (`status`): its outputs go into the store, or fail there.
  void PublishOutputs(CallContext& call, int task_index,
                      const absl::Status& status, bool dropped,
                      TaskState& state);
  // A partition of an XLA island: what it reads stays pinned, and the
  // call is reported, once the island's run has ended. `launched_quickly`:
  // its device thread's part took at most kInlineTask (the run's own time
  // must too, for the program's next call to run on the reader).
  void FinishWhenIslandEnds(const std::shared_ptr<CallContext>& call,
                            int task_index, TaskState state, absl::Time started,
                            bool failed, bool launched_quickly);
  // A shard task's event, from `started` to `ended` (clock readings).
  void RecordTask(const CallContext& call, int task_index, absl::Time started,
                  absl::Time ended, bool failed);
  // The end of a task's work (at once, or when its XLA run has ended): its
  // inputs are let go and, for the call's last task here, the call is
  // reported done.
  void FinishTask(const std::shared_ptr<CallContext>& call, int task_index,
                  std::vector<std::shared_ptr<const Storage>> keep,
                  int64_t scratch_bytes, int64_t busy_micros);

  ObjectStore& store_;
  const std::vector<std::unique_ptr<Device>>& devices_;
  XlaPrograms& xla_;
  PeerTable& peers_;
  ReportQueue& reports_;
  Timeline& timeline_;
  const WorkerIdentity& me_;
  CollectiveGpus* const nccl_;
  Clock* const clock_;

  std::atomic<int64_t> calls_executed_{0};
  std::atomic<int64_t> calls_failed_{0};
  std::atomic<int64_t> tasks_inline_{0};
  // XLA runs queued on the devices and ended (their FinishTask done).
  std::atomic<int64_t> xla_runs_started_{0};
  absl::Mutex xla_runs_mu_;
  int64_t xla_runs_ended_ ABSL_GUARDED_BY(xla_runs_mu_) = 0;
  // Per device, when its last XLA run ended (unix micros), and the device
  // time of its XLA runs so far.
  std::unique_ptr<std::atomic<int64_t>[]> device_run_ends_;
  std::unique_ptr<std::atomic<int64_t>[]> device_run_busy_;
};

}  // namespace plexus
