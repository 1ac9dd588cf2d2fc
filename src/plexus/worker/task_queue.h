// TaskQueue: the tasks waiting for one device, and which runs next.
//
// Tasks run in the order they came, with one exception that keeps a
// client's latency its own: a task that is *reorderable* — it neither waits
// for nor is waited on by tasks of other calls on other devices (a built-in
// kernel that is not a collective) — may run before tasks of *other
// clients* queued ahead of it, when its admission start tag is lower
// (Execute.start_tag: the server's fair order, server/scheduling/admission.h).
// So a client under its share does not wait behind a flooding client's queued
// calls, only behind the call running.
//
// The rules that keep this safe:
//  - one client's tasks run in the order they came (its calls may depend on
//    each other's outputs; clients never depend on each other);
//  - nothing passes a task that is not reorderable (collectives, XLA
//    islands: their tasks on several devices or hosts start together, and
//    its peers may already wait for it), so those run in the order the gang
//    scheduler gave on every device and host;
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
  bool reorderable = false;
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
