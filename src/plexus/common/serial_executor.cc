#include "plexus/common/serial_executor.h"

#include <pthread.h>

#include <utility>

namespace plexus {

SerialExecutor::SerialExecutor(std::string name)
    : name_(std::move(name)), thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void SerialExecutor::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stop_ && queue_.empty() && running_ == 0) return;  // joined or joining
  queue_.push_back(std::move(fn));
}

int64_t SerialExecutor::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size()) + running_;
}

void SerialExecutor::Loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  mu_.Lock();
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || !queue_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) break;  // stopping, and everything ran
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    mu_.Unlock();
    fn();
    fn = nullptr;  // what it captured goes outside the lock too
    mu_.Lock();
    --running_;
  }
  mu_.Unlock();
}

}  // namespace plexus
