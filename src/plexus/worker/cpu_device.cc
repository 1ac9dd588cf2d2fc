#include "absl/time/clock.h"
#include "plexus/worker/device.h"

namespace plexus {

CpuDevice::CpuDevice(int index, int64_t memory_bytes, int64_t max_queued)
    : index_(index),
      memory_bytes_(memory_bytes),
      max_queued_(max_queued),
      thread_([this] { Loop(); }) {}

CpuDevice::~CpuDevice() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void CpuDevice::Enqueue(Task task, TaskOrder order) {
  absl::MutexLock lock(&mu_);
  auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || static_cast<int64_t>(queue_.size()) < max_queued_;
  };
  mu_.Await(absl::Condition(&has_room));
  queue_.Push(std::move(task), order);
}

int64_t CpuDevice::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size()) + (running_task_ ? 1 : 0);
}

void CpuDevice::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stop_ and drained
      task = queue_.Pop();
      running_task_ = true;
    }
    const absl::Time start = absl::Now();
    task();
    busy_micros_ += absl::ToInt64Microseconds(absl::Now() - start);
    absl::MutexLock lock(&mu_);
    running_task_ = false;
  }
}

}  // namespace plexus
