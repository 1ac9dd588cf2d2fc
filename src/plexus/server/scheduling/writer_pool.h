// WriterPool: a few threads that write many outbound queues (OutQueue in
// pool mode), each queue by one thread at a time, in its order.
//
// Why: a queue with a thread of its own costs a thread per worker stream
// (thousands at 2,048 hosts) and a thread wake-up per host for every call
// that spans the hosts. Pooled, a burst of H queues wakes about
// H / queues_per_thread idle threads (at most all of them); each writes
// the queues it takes one after another.
//
// A queue is scheduled (Schedule) when ops arrive while it is not
// scheduled; a pool thread drains it (Drainable::DrainOnce: one batch,
// one write) and puts it back at the tail while it has more, so one busy
// queue does not hold a thread from the others. A write that blocks (a
// worker that stopped reading fills gRPC's window) holds one thread until
// the stream ends: the others go on (while every thread is so held,
// nothing else is written until one stream ends; the server ends a silent
// worker's stream at its heartbeat deadline). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace plexus {

class WriterPool {
 public:
  // What the pool writes: OutQueue in pool mode.
  class Drainable {
   public:
    virtual ~Drainable() = default;
    // Writes one batch. True: more is queued (the pool runs it again);
    // false: the queue is no longer scheduled (empty, closed or failed).
    virtual bool DrainOnce() = 0;
    // Whether a DrainOnce now would not block (what is queued is small and
    // its socket has room): the thread that scheduled it may then write
    // it itself (InlineScope). By default never.
    virtual bool WritableNow() { return false; }
  };

  // While one lives on a thread, the first queue that thread schedules on
  // the pool is not handed to a pool thread: when the scope ends (after
  // its owner let go of its locks: construct it before them), the thread
  // writes that queue itself if the write cannot block (WritableNow), one
  // thread hand-off fewer between a client's call and its first host;
  // else, or for what is left after one DrainOnce, the pool takes it.
  // Every other queue goes to the pool as usual. Scopes nest: the
  // innermost takes the queue.
  class InlineScope {
   public:
    explicit InlineScope(WriterPool* pool);
    ~InlineScope();
    InlineScope(const InlineScope&) = delete;
    InlineScope& operator=(const InlineScope&) = delete;

   private:
    friend class WriterPool;
    WriterPool* const pool_;
    InlineScope* const outer_;
    std::shared_ptr<Drainable> deferred_;
  };

  struct Options {
    int threads = 4;
    // Queues waiting per awake thread before another thread is woken.
    int queues_per_thread = 4;
    const char* name = "plexus-writer";  // the threads' name (15 chars)
  };

  explicit WriterPool(Options options);
  WriterPool() : WriterPool(Options{}) {}
  // Drains what is scheduled, then joins the threads. Queues still
  // scheduled must be stopped (OutQueue::Stop) before.
  ~WriterPool();

  // `queue` has ops and was not scheduled; the pool holds it until a
  // DrainOnce returns false (or this thread's InlineScope does).
  void Schedule(std::shared_ptr<Drainable> queue);

  // Hands this thread's deferred queue, if any, to its pool now: a thread
  // about to wait for what that queue's write leads to (room in a queue)
  // calls it first, so it never waits on itself.
  static void FlushInline();

  // Queues written by the threads that scheduled them (InlineScope).
  int64_t written_inline() const { return written_inline_.load(); }

 private:
  // Schedule, past any InlineScope.
  void Enqueue(std::shared_ptr<Drainable> queue);
  std::atomic<int64_t> written_inline_{0};

  void Loop();

  // A thread waiting for work.
  struct Idler {
    absl::CondVar cv;
    bool woken = false;  // (under mu_)
  };

  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Drainable>> pending_ ABSL_GUARDED_BY(mu_);
  // The idle threads, the most recently idle last: Schedule wakes that one
  // (its stack and caches are warm; with one busy queue, one thread
  // writes it every time, as a thread of its own would).
  std::vector<Idler*> idle_ ABSL_GUARDED_BY(mu_);
  int woken_ ABSL_GUARDED_BY(mu_) = 0;  // signalled, not yet running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace plexus
