#include "plexus/server/scheduling/writer_pool.h"

#include <algorithm>
#include <utility>

#include "plexus/common/thread_name.h"

namespace plexus {

WriterPool::WriterPool(Options options) : options_(options) {
  const int n = std::max(1, options_.threads);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] {
      SetThreadName(options_.name);
      Loop();
    });
  }
}

WriterPool::~WriterPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Idler* idler : idle_) idler->cv.Signal();
  }
  for (std::thread& t : threads_) t.join();
}

namespace {
thread_local WriterPool::InlineScope* inline_scope = nullptr;
}  // namespace

WriterPool::InlineScope::InlineScope(WriterPool* pool)
    : pool_(pool), outer_(inline_scope) {
  inline_scope = this;
}

WriterPool::InlineScope::~InlineScope() {
  inline_scope = outer_;
  if (deferred_ == nullptr) return;
  if (deferred_->WritableNow()) {
    pool_->written_inline_.fetch_add(1, std::memory_order_relaxed);
    if (!deferred_->DrainOnce()) return;  // written, and nothing more
  }
  pool_->Enqueue(std::move(deferred_));
}

void WriterPool::FlushInline() {
  InlineScope* scope = inline_scope;
  if (scope == nullptr || scope->deferred_ == nullptr) return;
  scope->pool_->Enqueue(std::move(scope->deferred_));
  scope->deferred_ = nullptr;
}

void WriterPool::Schedule(std::shared_ptr<Drainable> queue) {
  if (InlineScope* scope = inline_scope;
      scope != nullptr && scope->pool_ == this && scope->deferred_ == nullptr) {
    scope->deferred_ = std::move(queue);
    return;
  }
  Enqueue(std::move(queue));
}

void WriterPool::Enqueue(std::shared_ptr<Drainable> queue) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(queue));
  // One more thread only when those signalled and not yet running have
  // more than queues_per_thread waiting each. Threads already writing do
  // not count: one may be held by a write that blocks.
  if (!idle_.empty() && static_cast<int>(pending_.size()) >
                            woken_ * std::max(1, options_.queues_per_thread)) {
    Idler* idler = idle_.back();
    idle_.pop_back();
    idler->woken = true;
    ++woken_;
    idler->cv.Signal();
  }
}

void WriterPool::Loop() {
  std::shared_ptr<Drainable> queue;  // has more to write when not null
  Idler me;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (queue != nullptr) pending_.push_back(std::move(queue));
      while (pending_.empty() && !stopping_) {
        me.woken = false;
        idle_.push_back(&me);
        while (!me.woken && !stopping_) me.cv.Wait(&mu_);
        if (me.woken) {
          --woken_;
        } else {  // stopping: off the idle list
          idle_.erase(std::find(idle_.begin(), idle_.end(), &me));
        }
      }
      if (pending_.empty()) return;  // stopping, nothing left
      queue = std::move(pending_.front());
      pending_.pop_front();
    }
    // The queue's last reference may go here, outside any lock.
    if (!queue->DrainOnce()) queue.reset();
  }
}

}  // namespace plexus
