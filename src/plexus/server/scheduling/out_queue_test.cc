#include "plexus/server/scheduling/out_queue.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

// The RPC handler that owns a worker's stream stops the queue's writer
// before it returns (and the stream dies), while a client session waiting
// for room still holds the queue. Before Stop() existed the handler only
// closed its reference: the writer kept writing what was queued to the dead
// stream for as long as the client session held the queue.
TEST(OutQueueTest, NoWriteAfterStopReturnsWhileAnotherOwnerHoldsTheQueue) {
  std::atomic<bool> stream_alive{true};
  std::atomic<int> writes{0};
  std::atomic<int> writes_to_dead_stream{0};
  absl::Notification writing, gate, handler_returned;
  auto queue = std::make_shared<OutQueue<int>>([&](std::vector<int>& ops) {
    if (!stream_alive) writes_to_dead_stream++;
    if (writes++ == 0) {
      writing.Notify();
      gate.WaitForNotification();  // a write in progress when Stop() comes
    }
    return true;
  });
  std::shared_ptr<OutQueue<int>> client_session = queue;  // waits for room

  queue->Push(1);
  writing.WaitForNotification();
  queue->Push(2);  // queued behind the write in progress
  std::thread handler([&] {
    queue->Stop();
    queue.reset();
    stream_alive = false;  // the handler returned
    handler_returned.Notify();
  });
  // The handler must not return while the write is in progress: give it
  // the chance to (it would, without Stop), then let the write finish.
  EXPECT_FALSE(
      handler_returned.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  gate.Notify();
  handler.join();

  EXPECT_EQ(writes, 2);           // what was queued before Stop() went out
  client_session->WaitForRoom();  // returns at once: the queue is closed
  client_session->Push(3);        // dropped
  client_session.reset();         // the last owner
  EXPECT_EQ(writes, 2);
  EXPECT_EQ(writes_to_dead_stream, 0);
}

TEST(OutQueueTest, StopIsIdempotentAndTheDestructorAfterItIsANoOp) {
  std::atomic<int> writes{0};
  auto queue = std::make_unique<OutQueue<int>>([&](std::vector<int>& ops) {
    writes += static_cast<int>(ops.size());
    return true;
  });
  queue->Push(1);
  queue->Stop();
  queue->Stop();
  queue.reset();
  EXPECT_EQ(writes, 1);
}

}  // namespace
}  // namespace plexus
