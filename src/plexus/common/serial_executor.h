// SerialExecutor: runs closures one at a time, in the order they were
// posted, on one thread of its own (named, so `top -H` shows whose work it
// is). For work that must not run on the thread that discovers it: a PJRT
// event's callback (a plugin thread, which must not block), an I/O thread.
//
//   Post(fn) ──▶ queued ──(the thread takes it)──▶ running ──▶ gone
//
// Thread-safe. A closure may Post more work. The destructor runs every
// closure posted before it began (so a completion is never dropped), then
// joins; Post after that runs nothing.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace plexus {

class SerialExecutor {
 public:
  // `name`: the thread's name, at most 15 characters.
  explicit SerialExecutor(std::string name);
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `fn`; never blocks on the work already queued.
  void Post(std::function<void()> fn);
  // Closures posted and not yet finished.
  int64_t pending() const;

 private:
  void Loop();

  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace plexus
