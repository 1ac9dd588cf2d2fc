#include "plexus/worker/xla_island.h"

#include <utility>

namespace plexus {

absl::Status IslandExecution::Arrive(
    int p, std::vector<builtin::ConstTensor> inputs,
    std::vector<builtin::MutableTensor> outputs, const RunFn& run) {
  absl::MutexLock lock(&mu_);
  inputs_[p] = std::move(inputs);
  outputs_[p] = std::move(outputs);
  ArriveLocked(&run);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

void IslandExecution::Fail(int p, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) {
    failure_ = status.ok() ? absl::InternalError(
                                 "an XLA partition left its "
                                 "island without running")
                           : status;
  }
  ArriveLocked(nullptr);
}

void IslandExecution::ArriveLocked(const RunFn* run) {
  if (++arrived_ < partitions_) return;
  if (!failure_.ok()) {
    status_ = failure_;
  } else {
    // Every partition's tensors stay alive while their tasks wait here;
    // run reads them outside the lock, so it gets them out of the guarded
    // fields (no arrival writes them again).
    const Inputs inputs = std::move(inputs_);
    const Outputs outputs = std::move(outputs_);
    mu_.Unlock();
    absl::Status s = (*run)(inputs, outputs);
    mu_.Lock();
    status_ = s;
  }
  done_ = true;
}

}  // namespace plexus
