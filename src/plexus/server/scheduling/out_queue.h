// OutQueue: the outbound side of one control stream. Producers append ops
// (under the scheduler's order); a writer drains everything queued into a
// single message per write, so many calls travel as one batch. The writer
// is a thread of the queue's own, or (pool mode) one of a WriterPool's
// threads, which write many queues. Bounded: producers wait in
// WaitForRoom() while it is full, which pushes back on the client when a
// worker falls behind. Thread-safe.
//
// The writer uses the stream until Stop(): the RPC handler that owns the
// stream calls Stop() before it returns, even when others (a client session
// waiting for room) still hold the queue. After Stop(), `write` is never
// called again; Push is ignored and WaitForRoom returns at once.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "plexus/common/thread_name.h"
#include "plexus/server/scheduling/writer_pool.h"

namespace plexus {

template <typename Op>
class OutQueue : public WriterPool::Drainable,
                 public std::enable_shared_from_this<OutQueue<Op>> {
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
  // Pool mode: `pool`'s threads write it. Must be owned by a shared_ptr
  // (std::make_shared): the pool holds it while it is scheduled.
  // `writable_now`, if given, says whether a write cannot block now (its
  // socket has room): a queue of at most kInlineOps ops is then
  // WritableNow (WriterPool::InlineScope).
  OutQueue(WriteFn write, WriterPool* pool, size_t capacity = kDefaultCapacity,
           std::function<bool()> writable_now = {})
      : write_(std::move(write)),
        capacity_(capacity),
        pool_(pool),
        writable_now_(std::move(writable_now)) {}
  static constexpr size_t kInlineOps = 16;
  ~OutQueue() override { Stop(); }

  void Push(Op op) {
    bool schedule;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      queue_.push_back(std::move(op));
      schedule = ScheduleLocked();
    }
    if (schedule) pool_->Schedule(this->shared_from_this());
  }
  // All of `ops`, in order, under one lock (one wake-up of the writer);
  // `ops` is left empty.
  void PushAll(std::vector<Op>& ops) {
    bool schedule = false;
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        if (queue_.empty()) {
          // The usual case (the writer took the last): no op is moved.
          queue_.swap(ops);
        } else {
          queue_.insert(queue_.end(), std::make_move_iterator(ops.begin()),
                        std::make_move_iterator(ops.end()));
        }
        schedule = ScheduleLocked();
      }
    }
    ops.clear();
    if (schedule) pool_->Schedule(this->shared_from_this());
  }
  // Waits while the queue holds `capacity` ops or more.
  void WaitForRoom() {
    if (pool_ != nullptr) WriterPool::FlushInline();
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
  // failed to) and exited (pool mode: the pool no longer holds it to
  // write). Idempotent.
  void Stop() {
    Close();
    if (pool_ != nullptr) {
      absl::MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !scheduled_;
      };
      mu_.Await(absl::Condition(&idle));
      return;
    }
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  // Pool mode: what is queued, a batch per write, while more comes, up to
  // kWritesPerTurn writes; then the pool's other queues have their turn
  // (WriterPool::Drainable).
  static constexpr int kWritesPerTurn = 4;
  bool DrainOnce() override {
    for (int turn = 0;; ++turn) {
      {
        absl::MutexLock lock(&mu_);
        if (queue_.empty()) {
          scheduled_ = false;
          return false;
        }
        if (turn == kWritesPerTurn) return true;  // still scheduled
        pool_batch_.swap(queue_);
      }
      const bool ok = write_(pool_batch_);
      pool_batch_.clear();
      if (!ok) {
        absl::MutexLock lock(&mu_);
        closed_ = true;
        queue_.clear();
        scheduled_ = false;
        return false;
      }
    }
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  bool WritableNow() override {
    if (!writable_now_) return false;
    {
      absl::MutexLock lock(&mu_);
      if (closed_ || queue_.size() > kInlineOps) return false;
    }
    return writable_now_();
  }

 private:
  // Pool mode: whether the caller must schedule the queue (it has ops and
  // was not scheduled).
  bool ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pool_ == nullptr || scheduled_) return false;
    scheduled_ = true;
    return true;
  }

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
  WriterPool* const pool_ = nullptr;  // pool mode, else a thread of its own
  const std::function<bool()> writable_now_;
  mutable absl::Mutex mu_;
  std::vector<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Pool mode: the pool holds it (pending or being drained).
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Op> pool_batch_;  // the batch being written (one drainer)
  absl::Mutex join_mu_;         // one Stop() joins; others wait for it
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace plexus
