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

uint64_t FakeClock::Register(absl::Mutex* mu, absl::CondVar* cv) {
  const uint64_t id = next_id_++;
  waiters_.push_back({id, mu, cv});
  return id;
}

FakeClock::Waiter* FakeClock::Find(uint64_t id) {
  auto it = std::find_if(waiters_.begin(), waiters_.end(),
                         [&](const Waiter& w) { return w.id == id; });
  return it == waiters_.end() ? nullptr : &*it;
}

void FakeClock::Unregister(uint64_t id, absl::Mutex* mu)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // lets `mu` go and takes it back
  while (Find(id)->pins > 0) {
    mu_.Unlock();
    mu->Unlock();
    mu_.Lock();
    auto unpinned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return Find(id)->pins == 0;
    };
    mu_.Await(absl::Condition(&unpinned));
    mu_.Unlock();
    mu->Lock();  // the lock order: the waiter's mutex, then mu_
    mu_.Lock();
  }
  waiters_.erase(waiters_.begin() + (Find(id) - waiters_.data()));
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                                  absl::Time deadline) {
  // Registered before the time is read, so an Advance() that moves past
  // the deadline after this read also signals `cv`.
  absl::MutexLock lock(&mu_);
  const uint64_t id = Register(mu, cv);
  if (now_ < deadline) {
    mu_.Unlock();
    cv->Wait(mu);
    mu_.Lock();
  }
  Unregister(id, mu);
  return now_ >= deadline;
}

bool FakeClock::AwaitCondition(absl::Mutex* mu, const absl::Condition& cond,
                               absl::Time deadline) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = Register(mu, nullptr);
  }
  // Evaluated with `mu` held (lock order: `mu`, then mu_).
  auto done = [&] { return cond.Eval() || Now() >= deadline; };
  mu->Await(absl::Condition(&done));
  {
    absl::MutexLock lock(&mu_);
    Unregister(id, mu);
  }
  return cond.Eval();
}

void FakeClock::SleepFor(absl::Duration d) {
  // A sleep waits on the clock's own mutex, which Advance() releases after
  // moving the time: the sleep has no mutex of its own to wake.
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = now_ + d;
  const uint64_t id = Register(nullptr, nullptr);
  auto passed = [this, deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return now_ >= deadline;
  };
  mu_.Await(absl::Condition(&passed));
  waiters_.erase(waiters_.begin() + (Find(id) - waiters_.data()));
}

void FakeClock::Advance(absl::Duration d) {
  // Every wait registered now must be woken to read the new time; one that
  // registers later reads it anyway. Each is pinned while it is woken, so
  // its wait cannot return (and free its mutex) before this is done.
  std::vector<Waiter> to_wake;
  {
    absl::MutexLock lock(&mu_);
    now_ += d;
    for (Waiter& w : waiters_) {
      if (w.mu == nullptr) continue;  // a sleep: mu_'s release wakes it
      ++w.pins;
      to_wake.push_back(w);
    }
  }
  for (const Waiter& w : to_wake) {
    // Releasing the mutex makes absl evaluate AwaitCondition's conditions.
    absl::MutexLock lock(w.mu);
    if (w.cv != nullptr) w.cv->SignalAll();
  }
  absl::MutexLock lock(&mu_);
  for (const Waiter& w : to_wake) --Find(w.id)->pins;
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
