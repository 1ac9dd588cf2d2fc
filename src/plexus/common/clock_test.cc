#include "plexus/common/clock.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(FakeClockTest, SleepForReturnsOnlyOnceAdvancedFarEnough) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke = true;
  });
  clock.AwaitWaiters(1);
  clock.Advance(absl::Seconds(4));
  clock.AwaitWaiters(1);  // woke, saw 4 s of 10, and waits again
  EXPECT_FALSE(woke);
  clock.Advance(absl::Seconds(6));
  sleeper.join();
  EXPECT_TRUE(woke);
}

// A sleep's wait is its own: when it ends while an Advance() is still
// waking the waiters it saw, that Advance() must not touch the sleep's
// (by then gone) state. CI met this once as "Mutex corrupt" in the test
// above: its second Advance() saw the first wake's registration, and the
// sleep returned and freed its mutex before Advance() locked it. The race
// is a few instructions wide, so this runs the sequence many times.
TEST(FakeClockTest, ASleepThatEndsDuringAnAdvanceIsNotTouchedAfterIt) {
  for (int round = 0; round < 2000; ++round) {
    FakeClock clock;
    std::thread sleeper([&] { clock.SleepFor(absl::Seconds(10)); });
    clock.AwaitWaiters(1);
    clock.Advance(absl::Seconds(4));
    clock.Advance(absl::Seconds(6));  // may meet the first wake's record
    sleeper.join();
  }
}

TEST(FakeClockTest, AwaitWithDeadlineEndsWhenTheClockPassesTheDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  absl::CondVar cv;
  std::atomic<bool> expired{false};
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    const absl::Time deadline = clock.Now() + absl::Seconds(1);
    while (!clock.AwaitWithDeadline(&mu, &cv, deadline)) {
    }
    expired = true;
  });
  clock.AwaitWaiters(1);
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_TRUE(expired);
}

TEST(FakeClockTest, AwaitConditionEndsWhenItHoldsOrTheClockPassesTheDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  bool flag = false;
  std::atomic<int> results{0};  // 1: the condition held; 2: expired
  auto wait = [&] {
    absl::MutexLock lock(&mu);
    auto set = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return flag; };
    const bool held = clock.AwaitCondition(&mu, absl::Condition(&set),
                                           clock.Now() + absl::Seconds(1));
    results = held ? 1 : 2;
  };
  std::thread expires(wait);
  clock.AwaitWaiters(1);
  clock.Advance(absl::Seconds(1));
  expires.join();
  EXPECT_EQ(results, 2);
  std::thread holds(wait);
  clock.AwaitWaiters(1);
  {
    absl::MutexLock lock(&mu);
    flag = true;
  }
  holds.join();
  EXPECT_EQ(results, 1);
}

TEST(RealClockTest, AwaitConditionReturnsAtTheDeadline) {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  auto never = [] { return false; };
  Clock* clock = Clock::Real();
  EXPECT_FALSE(clock->AwaitCondition(&mu, absl::Condition(&never),
                                     clock->Now() + absl::Milliseconds(2)));
}

TEST(RealClockTest, SleepForSleepsAtLeastThatLong) {
  Clock* clock = Clock::Real();
  const absl::Time start = clock->Now();
  clock->SleepFor(absl::Milliseconds(2));
  EXPECT_GE(clock->Now() - start, absl::Milliseconds(2));
}

}  // namespace
}  // namespace plexus
