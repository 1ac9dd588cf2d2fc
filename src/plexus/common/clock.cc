#include "plexus/common/clock.h"

#include <algorithm>

namespace plexus {
namespace {
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                         absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    cv->WaitWithDeadline(mu, deadline);
    return absl::Now() >= deadline;
  }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};
}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                                  absl::Time deadline) {
  // Registered before the time is read, so an Advance() that moves past
  // the deadline after this read also signals `cv`.
  {
    absl::MutexLock lock(&mu_);
    waiters_.push_back({mu, cv, cv});
    if (now_ < deadline) {
      mu_.Unlock();
      cv->Wait(mu);
      mu_.Lock();
    }
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [&](const Waiter& w) { return w.tag == cv; });
    if (it != waiters_.end()) waiters_.erase(it);
    return now_ >= deadline;
  }
}

bool FakeClock::AwaitCondition(absl::Mutex* mu, const absl::Condition& cond,
                               absl::Time deadline) {
  const Waiter self{mu, nullptr, &cond};
  {
    absl::MutexLock lock(&mu_);
    waiters_.push_back(self);
  }
  // Evaluated with `mu` held (lock order: `mu`, then mu_).
  auto done = [&] { return cond.Eval() || Now() >= deadline; };
  mu->Await(absl::Condition(&done));
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [&](const Waiter& w) { return w.tag == self.tag; });
    if (it != waiters_.end()) waiters_.erase(it);
  }
  return cond.Eval();
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::Mutex mu;
  absl::CondVar cv;
  absl::MutexLock lock(&mu);
  const absl::Time deadline = Now() + d;
  while (!AwaitWithDeadline(&mu, &cv, deadline)) {
  }
}

void FakeClock::Advance(absl::Duration d) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    now_ += d;
    waiters = waiters_;
  }
  for (const Waiter& w : waiters) {
    // Releasing the mutex makes absl evaluate AwaitCondition's conditions.
    absl::MutexLock lock(w.mu);
    if (w.cv != nullptr) w.cv->SignalAll();
  }
}

void FakeClock::AwaitWaiters(int n) {
  absl::MutexLock lock(&mu_);
  // Await evaluates the condition with mu_ held.
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(waiters_.size()) >= n;
  };
  mu_.Await(absl::Condition(&enough));
}

}  // namespace plexus
