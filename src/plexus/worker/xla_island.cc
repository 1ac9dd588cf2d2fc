#include "plexus/worker/xla_island.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus {

absl::StatusOr<std::vector<std::shared_ptr<const DeviceBuffer>>>
IslandExecution::Arrive(int p, std::vector<xla::XlaArgument> inputs,
                        const RunFn& run) {
  absl::MutexLock lock(&mu_);
  inputs_[p] = std::move(inputs);
  ArriveLocked(&run);
  mu_.Await(absl::Condition(&done_));
  if (!status_.ok()) return status_;
  return std::move(outputs_[p]);
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
    // Every partition's inputs stay alive while their tasks wait here;
    // run reads them outside the lock, so it gets them out of the guarded
    // field (no arrival writes them again).
    const Inputs inputs = std::move(inputs_);
    mu_.Unlock();
    absl::StatusOr<Outputs> outputs =
        (*run)(inputs, [this](absl::Status end) { End(std::move(end)); });
    mu_.Lock();
    if (outputs.ok() && outputs->size() != static_cast<size_t>(partitions_)) {
      // Queued all the same: its end comes (and is the island's).
      status_ = absl::InternalError(absl::StrCat(
          "the island ran ", outputs->size(), " partitions of ", partitions_));
      done_ = true;
      return;
    }
    status_ = outputs.status();
    if (outputs.ok()) {
      outputs_ = std::move(*outputs);
      done_ = true;
      return;  // it ends when the run does
    }
  }
  done_ = true;
  // Nothing was queued: the island has ended.
  ended_ = true;
  end_status_ = status_;
}

void IslandExecution::End(absl::Status status) {
  std::vector<DoneFn> fns;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_status_ = status;
    fns.swap(when_ended_);
  }
  // The last of them may free the island: nothing of it is read after.
  for (DoneFn& fn : fns) fn(status);
}

void IslandExecution::WhenEnded(DoneFn fn) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!ended_) {
      when_ended_.push_back(std::move(fn));
      return;
    }
    status = end_status_;
  }
  fn(status);
}

}  // namespace plexus
