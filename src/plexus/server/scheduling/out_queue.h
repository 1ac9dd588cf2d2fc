// OutQueue: the outbound side of one control stream. Producers append ops
// (under the scheduler's order); one writer thread drains everything queued
// into a single message per write, so many calls travel as one batch.
// Bounded: producers wait in WaitForRoom() while it is full, which pushes
// back on the client when a worker falls behind. Thread-safe.
//
// The writer uses the stream until Stop(): the RPC handler that owns the
// stream calls Stop() before it returns, even when others (a client session
// waiting for room) still hold the queue. After Stop(), `write` is never
// called again; Push is ignored and WaitForRoom returns at once.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "plexus/common/thread_name.h"

namespace plexus {

template <typename Op>
class OutQueue {
 public:
  // `write` sends one batch; returning false closes the queue.
  using WriteFn = std::function<bool(std::vector<Op>&)>;

  static constexpr size_t kDefaultCapacity = 1 << 16;
  // `name` names the writer thread (SetThreadName: at most 15 chars).
  explicit OutQueue(WriteFn write, size_t capacity = kDefaultCapacity,
                    const char* name = "plexus-out")
      : write_(std::move(write)), capacity_(capacity) {
    thread_ = std::thread([this, name] {
      SetThreadName(name);
      Loop();
    });
  }
  ~OutQueue() { Stop(); }

  void Push(Op op) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    queue_.push_back(std::move(op));
  }
  // All of `ops`, in order, under one lock (one wake-up of the writer);
  // `ops` is left empty.
  void PushAll(std::vector<Op>& ops) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        queue_.insert(queue_.end(), std::make_move_iterator(ops.begin()),
                      std::make_move_iterator(ops.end()));
      }
    }
    ops.clear();
  }
  // Waits while the queue holds `capacity` ops or more.
  void WaitForRoom() {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || queue_.size() < capacity_;
    };
    mu_.Await(absl::Condition(&room));
  }
  // Stops the writer after what is queued has been written.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Close(), then waits until the writer has written what was queued (or
  // failed to) and exited. Idempotent.
  void Stop() {
    Close();
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  void Loop() {
    std::vector<Op> batch;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        // Swapped, not moved op by op: the queue keeps the written batch's
        // room for the next ops.
        batch.swap(queue_);
      }
      if (!write_(batch)) {
        absl::MutexLock lock(&mu_);
        closed_ = true;
        queue_.clear();
        return;
      }
      batch.clear();
    }
  }

  const WriteFn write_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;  // one Stop() joins; others wait for it
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace plexus
