// The XLA programs of a worker: finding the executable of each island
// (this worker's content-addressed cache, a peer's serialized copy, or a
// compile), compiling ahead of the first call on a compiler thread of
// lower priority, and running one partition of a call's island
// (RunPartition, for the task runner).
//
// Owns the compiler thread and its queue, the list of compiles under way
// (WorkerStats.compiling) and the donation counters. Borrows the XLA
// executor, the object store (scratch memory is charged to the device),
// the peer table (whom to load from), the identity, the timeline and the
// data-plane counters; they outlive it.
//
// Thread-safe. Locks, in the order they may nest: LoadedProgram::xla_mu
// (held while an island's executable is resolved, so the compiler thread
// and the first call resolve it once between them), then compile_mu_,
// compiling_mu_ or the peer table's; compile_mu_ and compiling_mu_ are
// never held together.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/worker/call_context.h"
#include "plexus/worker/loaded_program.h"
#include "plexus/worker/peer_table.h"
#include "plexus/worker/worker_identity.h"

namespace plexus {

// A task's lists by input and by output (TaskRunner::ExecuteTask), held in
// place for the usual call's few.
using InputDevices = absl::InlinedVector<const DeviceBuffer*, 4>;
using InputStorage = absl::InlinedVector<std::shared_ptr<const Storage>, 4>;
using Donations = absl::InlinedVector<bool, 4>;
using WrittenOver = absl::InlinedVector<int, 4>;

class XlaPrograms {
 public:
  static constexpr absl::Duration kFetchExecutableTimeout = absl::Seconds(2);
  static constexpr absl::Duration kAwaitPeerCompile = absl::Seconds(30);
  static constexpr int kCompileNice = 5;

  XlaPrograms(xla::XlaExecutor& xla, ObjectStore& store, PeerTable& peers,
              const WorkerIdentity& me, Timeline& timeline,
              transport::DataPlaneCounters& counters, Clock* clock,
              int num_devices);
  ~XlaPrograms();  // StopCompiler()

  // Ahead-of-time compiles: an XLA program loaded before its first call
  // compiles its islands on this worker on the compiler thread, off the
  // device threads; a call that comes first waits for it. Its own
  // islands, or, `stand_by` (the server's LoadProgram.stand_by: this host
  // may take a lost host's place), every island that fits its devices.
  // `program` must be complete: the compiler thread reads it from here on.
  void CompileAhead(std::shared_ptr<LoadedProgram> program, bool stand_by);
  // Ends the compiler thread (what is queued is dropped) and the waits for
  // peers' compiles.
  void StopCompiler();

  // The executable of `program` for the island on `devices`: cached, else
  // loaded from a peer (LoadFromPeers), else compiled.
  absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>> ExecutableFor(
      LoadedProgram& program, const std::vector<int>& devices);

  // The donated inputs of an XLA task that it may give to the run: each
  // the server allowed (InputBinding.donate), a device value of the
  // aliased output's shape, and held by nothing else here
  // (ObjectStore::TakeForDonation: its store entry then says it was
  // donated; `keep` and `bound` are the task's own references). Sets
  // donate[i], and written_over[o] = i for output o, whose charge is input
  // i's; counts the donations declined.
  void TakeDonations(const CallContext& call, int task_index,
                     const builtin::KernelContext& ctx,
                     const InputDevices& input_devices,
                     const std::vector<std::shared_ptr<const Storage>>& keep,
                     const InputStorage& bound, Donations* donate,
                     WrittenOver* written_over);

  // Runs partition `task_index` of an XLA call (xla_partition.cc): joins
  // the island's other tasks and returns once the executable's run is
  // queued (call.island->WhenEnded tells when it has run). Inputs are
  // `ctx.inputs`, read from `input_devices[i]` where that is set (a device
  // buffer, which need not be ready); the outputs it makes go into the
  // null entries of `outputs` (device memory, ready when the run has
  // completed; the others were made by the caller). `donate[i]`: input i
  // was taken for donation (TakeDonations), and the run may write over it.
  // The executable is the call's (CallContext::executable) where it was
  // resolved before, else ExecutableFor's; its scratch memory is charged
  // to the device, drawn first on `*reserved_ahead` (may be null).
  // `input_storage[i]`: the block input i's tensor points into, whose
  // views (Storage::views) keep the runtime's wrapping of host memory
  // from run to run.
  absl::Status RunPartition(const std::shared_ptr<CallContext>& call,
                            int task_index, const builtin::KernelContext& ctx,
                            const InputDevices& input_devices,
                            const InputStorage& input_storage,
                            const Donations& donate,
                            std::vector<std::shared_ptr<Storage>>* outputs,
                            int64_t* reserved_ahead);
  // The executable of `program` for the island on `devices` if it is
  // resolved already and its lock is free now (a compile holds it); else
  // null. Never waits (TaskRunner::TryRunInline, on the reader).
  std::shared_ptr<const xla::PjrtExecutable> ResolvedExecutable(
      LoadedProgram& program, const std::vector<int>& devices);

  // WorkerStats: the compiles under way, and the donations.
  void AddCompiling(proto::WorkerStats* stats);
  int64_t donations() const { return donations_.load(); }
  int64_t donations_declined() const { return donations_declined_.load(); }

 private:
  // The executable of (`module`, `island`'s options) loaded from the
  // serialized bytes of a worker the program names for an island of that
  // content (a live worker, for a spare), checked to be that content's and
  // to run on the island's devices; null where none does (the caller
  // compiles). Waits, at most kAwaitPeerCompile, for live peers that do not
  // have it yet (compiling it): a host standing by when a program is
  // registered loads it once a worker of its island has compiled it.
  // Returns null at once when the compiler stops.
  std::shared_ptr<const xla::PjrtExecutable> LoadFromPeers(
      const LoadedProgram& program, const std::string& module,
      const proto::XlaIsland& island);
  // What one round of LoadFromPeers got from one peer.
  struct PeerAnswer {
    enum Kind { kNone, kLater, kLoaded, kUnloadable } kind = kNone;
    std::shared_ptr<const xla::PjrtExecutable> executable;  // kLoaded
  };
  // Asks `peer` for the executable once (LoadFromPeers' round): kLater
  // where it may still come (not there yet, being compiled, not reached),
  // kNone where it will not or was of other content.
  PeerAnswer AskPeer(int64_t peer, uint64_t fingerprint,
                     const std::string& module, const proto::XlaIsland& island,
                     const std::vector<int>& devices, const std::string& where,
                     bool first_ask);
  // Waits `backoff`, or less when the compiler stops; false once stopped.
  bool PauseForPeers(absl::Duration backoff);
  // FETCH_EXECUTABLE from `peer`'s data plane, in at most
  // kFetchExecutableTimeout; given up once the peer is declared down.
  absl::StatusOr<std::shared_ptr<Storage>> FetchExecutable(
      int64_t peer, uint64_t fingerprint);
  // The island's run (IslandExecution::RunFn) of `exe` for the call,
  // queued behind what its devices run already.
  absl::StatusOr<IslandExecution::Outputs> QueueRun(
      const std::shared_ptr<CallContext>& call,
      const std::shared_ptr<const xla::PjrtExecutable>& exe,
      const IslandExecution::Inputs& in, IslandExecution::DoneFn done);
  // Counts the donations a queued run took, and those it declined.
  void CountDonations(const InputDevices& input_devices,
                      const Donations& donate);
  // Runs at kCompileNice above the worker's nice value.
  void CompilerLoop();
  // Lists a compile of `program`'s island on `devices` in
  // WorkerStats.compiling until the returned token is given to EndCompile.
  int64_t BeginCompile(const LoadedProgram& program,
                       const std::vector<int>& devices);
  void EndCompile(int64_t token);

  xla::XlaExecutor& xla_;
  ObjectStore& store_;
  PeerTable& peers_;
  const WorkerIdentity& me_;
  Timeline& timeline_;
  transport::DataPlaneCounters& counters_;
  Clock* const clock_;
  const int num_devices_;

  absl::Mutex compile_mu_;
  absl::CondVar compile_wake_;  // compile_stop_ set (LoadFromPeers' pauses)
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

  // Donated inputs written over by their run, and those that could not be
  // (WorkerStats.donations, donations_declined).
  std::atomic<int64_t> donations_{0};
  std::atomic<int64_t> donations_declined_{0};
};

}  // namespace plexus
