// IslandExecution: one call of an XLA program on this worker. The call's
// shard tasks (one per device of the island, each on its own device
// thread) arrive with their bound inputs; the last to arrive runs the SPMD
// executable once over all partitions while the others sleep, and every
// task returns the shared status, or its own partition's outputs (device
// buffers). A task that fails before it has data arrives with its error,
// so an island never waits for a task that will not come. Thread-safe.
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
  using RunFn = std::function<absl::StatusOr<Outputs>(const Inputs&)>;

  explicit IslandExecution(int partitions)
      : partitions_(partitions), inputs_(partitions) {}

  // Partition `p` is ready. Blocks until the island has run; returns its
  // status, or partition p's outputs. `run` is called by the last arrival
  // only, and must return an output list per partition.
  absl::StatusOr<std::vector<std::shared_ptr<const DeviceBuffer>>> Arrive(
      int p, std::vector<xla::XlaArgument> inputs, const RunFn& run);
  // Partition `p` cannot take part: the island fails with `status`.
  void Fail(int p, const absl::Status& status);

 private:
  // Counts an arrival; the last runs (or fails) and wakes the rest.
  void ArriveLocked(const RunFn* run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int partitions_;
  absl::Mutex mu_;
  Inputs inputs_ ABSL_GUARDED_BY(mu_);
  Outputs outputs_ ABSL_GUARDED_BY(mu_);  // once run; each taken by its task
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
