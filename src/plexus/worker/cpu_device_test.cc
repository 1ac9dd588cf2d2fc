#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/worker/device.h"

namespace plexus {
namespace {

// A task that runs long shows as busy while it runs (the live page and
// plexus top read busy time from heartbeats), not only once it ends.
TEST(CpuDeviceTest, BusyTimeGrowsWhileATaskRuns) {
  CpuDevice device(0, 1 << 20);
  absl::Notification started, release;
  device.Enqueue(
      [&] {
        started.Notify();
        release.WaitForNotification();
      },
      {});
  started.WaitForNotification();
  const int64_t first = device.busy_micros();
  int64_t later = first;
  // Busy time is in microseconds: it grows within a few thousand reads.
  for (int i = 0; i < 10'000'000 && later == first; ++i) {
    later = device.busy_micros();
  }
  EXPECT_GT(later, first);
  release.Notify();
  // Once it ends, its whole run is counted, and nothing more grows.
  absl::Notification done;
  device.Enqueue([&] { done.Notify(); }, {});
  done.WaitForNotification();
  EXPECT_GE(device.busy_micros(), later);
}

}  // namespace
}  // namespace plexus
