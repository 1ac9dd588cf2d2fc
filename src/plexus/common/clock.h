// Time as an injected dependency, so heartbeat, deadline and failure tests
// run in milliseconds without sleeping. Implementations are thread-safe.
//
// Code that waits with a deadline waits through its Clock
// (AwaitWithDeadline), never on the wall clock directly: with the real
// clock that is an ordinary timed wait; with a FakeClock the wait ends when
// the test advances the clock past the deadline.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace plexus {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Waits on `cv` (with `mu` held, as CondVar::Wait) until signalled or
  // until Now() reaches `deadline`. Returns true if the deadline has passed.
  // Spurious wake-ups happen, as with any condition variable: callers loop.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                                 absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // The absl::Mutex::Await form of the same, for state under a lock whose
  // changes signal no CondVar: waits (with `mu` held) until `cond` holds or
  // Now() reaches `deadline`, and returns whether `cond` holds. `cond` is
  // evaluated with `mu` held, by whichever thread releases `mu`. The
  // default is the wall clock's timed wait (Real()'s); a clock whose time
  // is its own (FakeClock) overrides it.
  virtual bool AwaitCondition(absl::Mutex* mu, const absl::Condition& cond,
                              absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(cond, deadline);
  }
  // Sleeps until Now() has moved on by `d`: a real sleep on the real clock;
  // on a FakeClock it returns once the test has advanced the clock that far.
  // For pacing and back-off only; a wait for a condition uses
  // AwaitWithDeadline, so it ends as soon as the condition holds.
  virtual void SleepFor(absl::Duration d) = 0;
  static Clock* Real();  // process-wide wall clock; never deleted
};

// A clock that moves only when told to. For tests. Advance() wakes every
// wait in AwaitWithDeadline, which then re-reads the time. A wait does not
// return while an Advance() is still waking it, so a waiter's mutex and
// condition variable may be destroyed as soon as its wait returns.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override;
  bool AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                         absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Counts as a waiter; Advance() releases `mu` once, which makes absl
  // evaluate `cond` (and the deadline) again.
  bool AwaitCondition(absl::Mutex* mu, const absl::Condition& cond,
                      absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void SleepFor(absl::Duration d) override;  // counts as a waiter
  void Advance(absl::Duration d);
  // Waits (really) until at least `n` threads are waiting on this clock, so
  // a test advances time only once the code under test is blocked.
  void AwaitWaiters(int n);

 private:
  struct Waiter {
    uint64_t id;
    absl::Mutex* mu;    // null for a sleep, which waits on mu_
    absl::CondVar* cv;  // null for AwaitCondition's
    int pins = 0;       // Advance() calls still waking this wait
  };
  uint64_t Register(absl::Mutex* mu, absl::CondVar* cv)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the wait once no Advance() is waking it; while one is, `mu` is
  // let go (and taken again, before mu_) so that Advance() can finish.
  void Unregister(uint64_t id, absl::Mutex* mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Waiter* Find(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Lock order: a waiter's mutex, then this one; Advance() never holds
  // this one while taking a waiter's.
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
