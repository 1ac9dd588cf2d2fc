// PeerWatch: asks only while armed, stops asking when disarmed, and calls
// on_serves once when the other answers; PeerServes against a real
// server's port, a port bound and not listening (a standby's), and a
// SIGSTOPped server (its kernel accepts, it never answers).
#include "plexus/server/standby/peer_watch.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/common/clock.h"

namespace plexus {
namespace {

// A stand-in for the other server: answers what the test says, counts the
// questions, and lets the test wait for the n-th.
struct FakePeer {
  absl::Mutex mu;
  int asked ABSL_GUARDED_BY(mu) = 0;
  bool serves ABSL_GUARDED_BY(mu) = false;
  bool Ask() {
    absl::MutexLock lock(&mu);
    ++asked;
    return serves;
  }
  bool AwaitAsked(int n) {
    absl::MutexLock lock(&mu);
    auto enough = [this, n]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return asked >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
};

TEST(PeerWatchTest, AsksOnlyWhileArmedAndStepsDownOnceWhenTheOtherServes) {
  FakePeer peer;
  FakeClock clock;
  PeerWatchOptions options;
  options.peer = "10.0.0.2:7070";
  options.clock = &clock;
  options.serves = [&](const std::string& address, absl::Duration) {
    EXPECT_EQ(address, "10.0.0.2:7070");
    return peer.Ask();
  };
  std::atomic<int> stepped_down{0};
  absl::Notification down;
  PeerWatch watch(options, [&] {
    stepped_down++;
    down.Notify();
  });
  // Disarmed: nothing is asked, however long it waits.
  clock.Advance(absl::Seconds(10));
  {
    absl::MutexLock lock(&peer.mu);
    EXPECT_EQ(peer.asked, 0);
  }
  watch.Arm("the standby's stream ended");
  ASSERT_TRUE(peer.AwaitAsked(1));
  // A standby (or a dead server) does not serve: asked again each period.
  // (Time moves once the watch waits for it: advanced before, the period
  // would start after the advance, and no second question would come.)
  clock.AwaitWaiters(1);
  clock.Advance(absl::Milliseconds(250));
  ASSERT_TRUE(peer.AwaitAsked(2));
  watch.Disarm();
  EXPECT_FALSE(watch.armed());
  {
    absl::MutexLock lock(&peer.mu);
    peer.serves = true;
  }
  clock.AwaitWaiters(1);
  clock.Advance(absl::Seconds(10));
  {
    absl::MutexLock lock(&peer.mu);
    EXPECT_LE(peer.asked, 3) << "asked while disarmed";
  }
  EXPECT_FALSE(down.HasBeenNotified());
  watch.Arm("stalled for the lease");
  ASSERT_TRUE(down.WaitForNotificationWithTimeout(absl::Seconds(30)));
  clock.Advance(absl::Seconds(10));
  watch.Arm("again");
  EXPECT_EQ(stepped_down.load(), 1);
}

// Disarmed and armed again while the other is being asked: asked again at
// once, not a period later by a clock that (in a test) does not move. (The
// first test lost this way on a loaded machine: its Arm came while the
// second question was still being asked, and the watch then waited for the
// fake clock.)
TEST(PeerWatchTest, ArmedAgainWhileAskingAsksAgainAtOnce) {
  FakeClock clock;
  absl::Notification first_asked, rearmed;
  std::atomic<int> asked{0};
  PeerWatchOptions options;
  options.peer = "10.0.0.2:7070";
  options.clock = &clock;
  options.serves = [&](const std::string&, absl::Duration) {
    if (asked.fetch_add(1) == 0) {
      first_asked.Notify();
      rearmed.WaitForNotification();  // the test re-arms meanwhile
      return false;
    }
    return true;
  };
  absl::Notification down;
  PeerWatch watch(options, [&] { down.Notify(); });
  watch.Arm("the standby's stream ended");
  first_asked.WaitForNotification();
  watch.Disarm();
  watch.Arm("stalled for the lease");
  rearmed.Notify();
  // No clock.Advance: the second question must not wait for one.
  ASSERT_TRUE(down.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(asked.load(), 2);
}

}  // namespace
}  // namespace plexus
