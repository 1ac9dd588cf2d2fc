// IslandExecution: one call of an XLA program on this worker. The call's
// shard tasks (one per device of the island, each on its own device
// thread) arrive with their bound inputs; the last to arrive queues the
// SPMD executable's run over all partitions while the others sleep, and
// every task returns the shared status, or its own partition's outputs
// (device buffers, ready once the run has completed). A task that fails
// before it has data arrives with its error, so an island never waits for
// a task that will not come.
//
//   arriving ──(last arrival: run queued)──▶ queued ──(run ends)──▶ ended
//       └──(a partition failed, or the run could not be queued)──▶ ended
//
// What must wait for the run's end (inputs let go, the call reported done)
// is registered with WhenEnded. Thread-safe.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/executors/xla/pjrt_runtime.h"
#include "plexus/store/device_buffer.h"

namespace plexus {

class IslandExecution {
 public:
  using Inputs = std::vector<std::vector<xla::XlaArgument>>;
  // [partition][output]
  using Outputs = std::vector<std::vector<std::shared_ptr<const DeviceBuffer>>>;
  using DoneFn = std::function<void(absl::Status)>;
  // Queues the island's run and returns its outputs, one list per
  // partition. After returning them it calls `done` exactly once, when the
  // run has ended, with the run's status; never after an error.
  using RunFn =
      std::function<absl::StatusOr<Outputs>(const Inputs&, DoneFn done)>;

  explicit IslandExecution(int partitions)
      : partitions_(partitions), inputs_(partitions) {}

  // Partition `p` is ready. Blocks until the island's run is queued (not
  // until it has run); returns the island's status, or partition p's
  // outputs. `run` is called by the last arrival only, and must return an
  // output list per partition. The island must outlive the run's end.
  absl::StatusOr<std::vector<std::shared_ptr<const DeviceBuffer>>> Arrive(
      int p, std::vector<xla::XlaArgument> inputs, const RunFn& run);
  // Partition `p` cannot take part: the island fails with `status`.
  void Fail(int p, const absl::Status& status);
  // Runs `fn` with the island's end status once it has ended: at once, on
  // this thread, if it has; else on the thread that ends it (the XLA
  // runtime's completion thread). Exactly once.
  void WhenEnded(DoneFn fn);

 private:
  // Counts an arrival; the last runs (or fails) and wakes the rest.
  void ArriveLocked(const RunFn* run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run ended (or never will run): the continuations go.
  void End(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  const int partitions_;
  absl::Mutex mu_;
  Inputs inputs_ ABSL_GUARDED_BY(mu_);
  Outputs outputs_ ABSL_GUARDED_BY(mu_);  // once run; each taken by its task
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // queued or failed
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  std::vector<DoneFn> when_ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
