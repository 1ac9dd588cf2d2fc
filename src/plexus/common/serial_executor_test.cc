#include "plexus/common/serial_executor.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(SerialExecutorTest, RunsInPostOrderOffTheCallersThread) {
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  absl::Notification done;
  {
    SerialExecutor executor("test-serial");
    for (int i = 0; i < 100; ++i) {
      executor.Post([&, i] {
        absl::MutexLock lock(&mu);
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
    }
    executor.Post([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const auto& t : threads) {
    EXPECT_NE(t, std::this_thread::get_id());
    EXPECT_EQ(t, threads[0]);
  }
}

TEST(SerialExecutorTest, TheDestructorRunsWhatWasPostedBeforeIt) {
  absl::Notification release;
  int ran = 0;  // written by the executor's thread only, read after join
  {
    SerialExecutor executor("test-serial");
    executor.Post([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) executor.Post([&] { ++ran; });
    // A closure posted by a closure while the destructor waits runs too.
    executor.Post([&] { executor.Post([&] { ++ran; }); });
    EXPECT_GE(executor.pending(), 11);
    release.Notify();
  }
  EXPECT_EQ(ran, 11);
}

}  // namespace
}  // namespace plexus
