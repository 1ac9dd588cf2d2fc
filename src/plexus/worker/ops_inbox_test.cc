#include "plexus/worker/ops_inbox.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

proto::ServerToWorker Numbered(int64_t n) {
  proto::ServerToWorker msg;
  msg.set_worker_id(n);
  return msg;
}

TEST(OpsInboxTest, MessagesComeOutInTheOrderTheyWentIn) {
  OpsInbox inbox;
  for (int64_t n = 1; n <= 5; ++n) inbox.Push(Numbered(n));
  inbox.Close();
  inbox.Push(Numbered(6));  // after Close: dropped
  proto::ServerToWorker msg;
  for (int64_t n = 1; n <= 5; ++n) {
    ASSERT_TRUE(inbox.Pop(&msg));
    EXPECT_EQ(msg.worker_id(), n);
  }
  EXPECT_FALSE(inbox.Pop(&msg));
}

// The applier waits for a message; the reader's Close ends its wait.
TEST(OpsInboxTest, APopWaitsForAPushOrTheClose) {
  OpsInbox inbox;
  proto::ServerToWorker got;
  std::atomic<int> popped{0};
  std::thread applier([&] {
    while (inbox.Pop(&got)) popped++;
  });
  inbox.Push(Numbered(7));
  inbox.Close();
  applier.join();
  EXPECT_EQ(popped.load(), 1);
  EXPECT_EQ(got.worker_id(), 7);
}

// A full inbox holds its reader back until the applier takes one (the
// server's writes then wait on the stream's flow control); the first
// message is taken whatever its size.
TEST(OpsInboxTest, AFullInboxHoldsThePushUntilAPop) {
  const size_t one = Numbered(1).ByteSizeLong();
  OpsInbox inbox(/*max_bytes=*/one);
  inbox.Push(Numbered(1));  // reaches the bound
  absl::Notification pushed;
  std::thread reader([&] {
    inbox.Push(Numbered(2));
    pushed.Notify();
  });
  // Held back while the inbox is full (a bounded look: it must not come).
  EXPECT_FALSE(pushed.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  proto::ServerToWorker msg;
  ASSERT_TRUE(inbox.Pop(&msg));
  EXPECT_EQ(msg.worker_id(), 1);
  EXPECT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  reader.join();
  ASSERT_TRUE(inbox.Pop(&msg));
  EXPECT_EQ(msg.worker_id(), 2);
}

}  // namespace
}  // namespace plexus
