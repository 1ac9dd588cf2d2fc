// TaskQueue: the tasks waiting for one device, and which runs next.
//
// Tasks run in the order they came, with one exception that keeps a
// client's latency its own: a task may run before tasks of *other clients*
// queued ahead of it, when its admission start tag is lower
// (Execute.start_tag: the server's fair order, server/scheduling/admission.h).
// So a client under its share does not wait behind a flooding client's
// queued calls, only behind the call running.
//
// Which tasks may move, per task (TaskOrder):
//  - `may_pass`: it may run before other clients' tasks ahead of it. Only a
//    task that cannot hold the device waiting for another device's work:
//    a built-in kernel that is not a collective and whose inputs, when it
//    was queued, were ready or to be made here (TaskRunner::Enqueue). One
//    that waits for a transfer must not: moved ahead on this device, it
//    holds it while its input's producer elsewhere may sit behind a task
//    that waits for one queued behind it here (two hosts, each waiting for
//    the other, for good). In the order it came it is safe: the gang
//    scheduler's order is the same on every device, so the first task in
//    that order can always run.
//  - `passable`: other tasks may run before it. Not a collective or an XLA
//    island: their tasks on several devices or hosts start together, and
//    their peers may already wait for it. A task merely delayed by one that
//    runs to its end holds nothing.
//
// The rules that keep this safe:
//  - one client's tasks run in the order they came (its calls may depend on
//    each other's outputs; clients never depend on each other);
//  - only a task that may pass moves, and only past tasks that are
//    passable;
//  - only the first kMaxLookahead tasks are considered.
//
// Pure data structure: not thread-safe (the device holds it under its lock).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>

namespace plexus {

struct TaskOrder {
  uint64_t client = 0;
  double start_tag = 0;
  bool may_pass = false;
  bool passable = false;
};

class TaskQueue {
 public:
  using Task = std::function<void()>;
  static constexpr int kMaxLookahead = 64;

  void Push(Task task, TaskOrder order) {
    queue_.push_back({std::move(task), order});
  }
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  // Removes and returns the task to run next. Not empty.
  Task Pop();

 private:
  struct Entry {
    Task task;
    TaskOrder order;
  };
  std::deque<Entry> queue_;
};

}  // namespace plexus
