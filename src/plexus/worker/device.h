// A device of a worker: where shard tasks run, in the order they arrive
// (except that a client's task that may pass other clients' queued ones
// does: worker/task_queue.h).
// The interface is what a CUDA device will implement too (its queue would
// feed a stream); CpuDevice runs tasks on one thread of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "plexus/common/clock.h"
#include "plexus/worker/task_queue.h"

namespace plexus {

class Device {
 public:
  using Task = std::function<void()>;
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual std::string kind() const = 0;
  virtual int64_t memory_bytes() const = 0;
  // Runs `task` after the tasks enqueued before it, as TaskQueue orders
  // them. Blocks while more than `max_queued` tasks wait (back-pressure on
  // the control stream).
  virtual void Enqueue(Task task, TaskOrder order) = 0;
  // Runs a collective's task (a built-in all_reduce, which waits on its
  // peers and the network rather than computing) after the collectives
  // enqueued before it but beside the tasks of Enqueue: the device's
  // communication stream (on a GPU, NCCL's stream next to the compute
  // one). So a gradient's transfer overlaps the backward that follows it;
  // what reads the collective's output waits for it in the object store.
  // Default: Enqueue (one stream).
  virtual void EnqueueCollective(Task task, TaskOrder order) {
    Enqueue(std::move(task), order);
  }
  // Runs `task` now, on the calling thread, if nothing is queued or
  // running on the compute stream: the device counts it as its running
  // task meanwhile, and a task enqueued meanwhile waits for it. Else false,
  // and nothing runs. Default: false (every task goes through Enqueue).
  virtual bool RunIfIdle(const Task& task) { return false; }
  // Tasks queued or running.
  virtual int64_t pending() const = 0;
  // Time spent running tasks since the device started (utilisation =
  // its growth over wall time).
  virtual int64_t busy_micros() const = 0;
};

// A device served by host threads: one thread draining a FIFO, and one
// draining its collectives' FIFO (the communication stream). A CPU; or a
// PJRT plugin's device (a GPU), whose programs the thread queues on the
// device and does not wait for (`kind` as the plugin names it).
// Thread-safe.
class CpuDevice : public Device {
 public:
  // `clock` (not owned) times the tasks (busy_micros).
  CpuDevice(int index, int64_t memory_bytes, int64_t max_queued = 65536,
            std::string kind = "cpu", Clock* clock = Clock::Real());
  ~CpuDevice() override;  // finishes queued tasks, then joins
  int index() const override { return index_; }
  std::string kind() const override { return kind_; }
  int64_t memory_bytes() const override { return memory_bytes_; }
  void Enqueue(Task task, TaskOrder order) override;
  void EnqueueCollective(Task task, TaskOrder order) override;
  bool RunIfIdle(const Task& task) override;
  int64_t pending() const override;
  // Compute only: a collective waiting on the network keeps no device busy.
  // The task running now counts up to now, so a long one shows as busy
  // while it runs (the live page, plexus top), not only once it ends.
  int64_t busy_micros() const override;

 private:
  struct Stream {
    TaskQueue queue;
    bool running_task = false;  // on its thread, or (RunIfIdle) a caller's
  };
  Stream& StreamOf(bool collective) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return collective ? collectives_ : compute_;
  }
  void Push(bool collective, Task task, TaskOrder order);
  // A stream's task starts (on its thread, or a caller's: RunIfIdle) and
  // ends: the stream is running it, and a compute task's time counts as
  // the device's busy time.
  void BeginTurnLocked(bool collective) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndTurnLocked(bool collective) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop(bool collective);

  const int index_;
  const int64_t memory_bytes_;
  const std::string kind_;
  const int64_t max_queued_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  Stream compute_ ABSL_GUARDED_BY(mu_);
  Stream collectives_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t busy_micros_ ABSL_GUARDED_BY(mu_) = 0;  // of finished tasks
  // When the running compute task started (InfinitePast: none runs).
  absl::Time compute_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
  std::thread collective_thread_;
};

}  // namespace plexus
