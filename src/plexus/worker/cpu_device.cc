#include "plexus/worker/device.h"

namespace plexus {

CpuDevice::CpuDevice(int index, int64_t memory_bytes, int64_t max_queued,
                     std::string kind, Clock* clock)
    : index_(index),
      memory_bytes_(memory_bytes),
      kind_(std::move(kind)),
      max_queued_(max_queued),
      clock_(clock),
      thread_([this] { Loop(/*collective=*/false); }),
      collective_thread_([this] { Loop(/*collective=*/true); }) {}

CpuDevice::~CpuDevice() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  collective_thread_.join();
}

void CpuDevice::Push(bool collective, Task task, TaskOrder order) {
  absl::MutexLock lock(&mu_);
  auto has_room = [this, collective]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || static_cast<int64_t>(StreamOf(collective).queue.size()) <
                        max_queued_;
  };
  mu_.Await(absl::Condition(&has_room));
  StreamOf(collective).queue.Push(std::move(task), order);
}

void CpuDevice::Enqueue(Task task, TaskOrder order) {
  Push(/*collective=*/false, std::move(task), order);
}

void CpuDevice::EnqueueCollective(Task task, TaskOrder order) {
  // Collectives run in the order they came.
  order.may_pass = false;
  order.passable = false;
  Push(/*collective=*/true, std::move(task), order);
}

bool CpuDevice::RunIfIdle(const Task& task) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || compute_.running_task || !compute_.queue.empty()) {
      return false;
    }
    BeginTurnLocked(/*collective=*/false);
  }
  task();
  absl::MutexLock lock(&mu_);
  EndTurnLocked(/*collective=*/false);
  return true;
}

void CpuDevice::BeginTurnLocked(bool collective) {
  StreamOf(collective).running_task = true;
  // A collective waiting on the network keeps no device busy.
  if (!collective) compute_since_ = clock_->Now();
}

void CpuDevice::EndTurnLocked(bool collective) {
  if (!collective) {
    busy_micros_ += absl::ToInt64Microseconds(clock_->Now() - compute_since_);
    compute_since_ = absl::InfinitePast();
  }
  StreamOf(collective).running_task = false;
}

int64_t CpuDevice::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(compute_.queue.size() +
                              collectives_.queue.size()) +
         (compute_.running_task ? 1 : 0) + (collectives_.running_task ? 1 : 0);
}

int64_t CpuDevice::busy_micros() const {
  absl::MutexLock lock(&mu_);
  if (compute_since_ == absl::InfinitePast()) return busy_micros_;
  return busy_micros_ +
         absl::ToInt64Microseconds(clock_->Now() - compute_since_);
}

void CpuDevice::Loop(bool collective) {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      // Not while a caller runs a task of the stream (RunIfIdle).
      auto ready = [this, collective]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Stream& stream = StreamOf(collective);
        return !stream.running_task && (stop_ || !stream.queue.empty());
      };
      mu_.Await(absl::Condition(&ready));
      Stream& stream = StreamOf(collective);
      if (stream.queue.empty()) return;  // stop_ and drained
      task = stream.queue.Pop();
      BeginTurnLocked(collective);
    }
    task();
    absl::MutexLock lock(&mu_);
    EndTurnLocked(collective);
  }
}

}  // namespace plexus
