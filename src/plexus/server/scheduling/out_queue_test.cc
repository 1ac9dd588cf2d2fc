#include "plexus/server/scheduling/out_queue.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
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

// PushAll onto an empty queue takes the pushed ops' storage whole; onto
// ops still queued (the writer busy) it appends them: either way the
// writer gets every op once, in order, and the pusher's vector is empty.
TEST(OutQueueTest, PushAllKeepsTheOrderWhetherOrNotOpsAreQueued) {
  absl::Mutex mu;
  std::vector<int> written;
  absl::Notification writing, gate;
  auto queue = std::make_shared<OutQueue<int>>([&](std::vector<int>& ops) {
    {
      absl::MutexLock lock(&mu);
      written.insert(written.end(), ops.begin(), ops.end());
    }
    if (!writing.HasBeenNotified()) {
      writing.Notify();
      gate.WaitForNotification();  // the next pushes queue behind it
    }
    return true;
  });
  std::vector<int> ops = {1, 2};
  queue->PushAll(ops);  // onto an empty queue
  EXPECT_TRUE(ops.empty());
  writing.WaitForNotification();
  ops = {3, 4};
  queue->PushAll(ops);  // onto an empty queue, the writer busy
  ops = {5};
  queue->PushAll(ops);  // onto 3 and 4, still queued
  EXPECT_TRUE(ops.empty());
  gate.Notify();
  queue->Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(written, (std::vector<int>{1, 2, 3, 4, 5}));
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

// Pool mode: many queues written by a few threads. Each queue's ops arrive
// in order, by one thread at a time, and all of them; Stop() returns once
// what was queued is written, and nothing is written after it.
TEST(OutQueueTest, APoolWritesManyQueuesEachInOrderAndOneAtATime) {
  constexpr int kQueues = 16;
  constexpr int kOps = 200;
  struct Sink {
    std::atomic<int> in_write{0};
    std::atomic<int> overlaps{0};
    std::vector<int> got;  // written by one thread at a time (checked)
    std::atomic<bool> stopped{false};
    std::atomic<int> after_stop{0};
  };
  std::vector<Sink> sinks(kQueues);
  std::vector<std::shared_ptr<OutQueue<int>>> queues;
  {
    WriterPool pool({.threads = 3, .queues_per_thread = 2});
    for (int q = 0; q < kQueues; ++q) {
      Sink* sink = &sinks[q];
      queues.push_back(std::make_shared<OutQueue<int>>(
          [sink](std::vector<int>& ops) {
            if (sink->in_write++ != 0) sink->overlaps++;
            if (sink->stopped) sink->after_stop++;
            sink->got.insert(sink->got.end(), ops.begin(), ops.end());
            sink->in_write--;
            return true;
          },
          &pool));
    }
    // Two producers, each its own half of every queue's ops in turn, as
    // the scheduler's batches come (one at a time per queue: in order).
    for (int i = 0; i < kOps; ++i) {
      std::vector<int> one = {i};
      for (auto& q : queues) {
        std::vector<int> ops = one;
        q->PushAll(ops);
        EXPECT_TRUE(ops.empty());
      }
    }
    for (int q = 0; q < kQueues; ++q) {
      queues[q]->Stop();
      sinks[q].stopped = true;
      queues[q]->Push(-1);  // after Stop: dropped
    }
  }  // the pool joins its threads
  for (int q = 0; q < kQueues; ++q) {
    ASSERT_EQ(sinks[q].got.size(), static_cast<size_t>(kOps)) << q;
    for (int i = 0; i < kOps; ++i) EXPECT_EQ(sinks[q].got[i], i) << q;
    EXPECT_EQ(sinks[q].overlaps, 0) << q;
    EXPECT_EQ(sinks[q].after_stop, 0) << q;
  }
}

// A write that blocks (a worker that stopped reading) holds one of the
// pool's threads; the other queues are written meanwhile. A failed write
// closes its queue, which then drops what comes.
TEST(OutQueueTest, AQueueWhoseWriteBlocksDoesNotHoldUpTheOthers) {
  WriterPool pool({.threads = 2, .queues_per_thread = 1});
  absl::Notification blocked, release;
  std::atomic<int> slow_writes{0};
  auto slow = std::make_shared<OutQueue<int>>(
      [&](std::vector<int>&) {
        if (slow_writes++ == 0) {
          blocked.Notify();
          release.WaitForNotification();
        }
        return true;
      },
      &pool);
  absl::Notification fast_wrote;
  auto fast = std::make_shared<OutQueue<int>>(
      [&](std::vector<int>&) {
        fast_wrote.Notify();
        return true;
      },
      &pool);
  std::atomic<int> failing_writes{0};
  auto failing = std::make_shared<OutQueue<int>>(
      [&](std::vector<int>&) {
        failing_writes++;
        return false;  // the stream broke
      },
      &pool);
  slow->Push(1);
  blocked.WaitForNotification();
  fast->Push(1);
  fast_wrote.WaitForNotification();  // while the slow write still blocks
  failing->Push(1);
  failing->Stop();
  EXPECT_TRUE(failing->closed());
  failing->Push(2);  // dropped: the queue closed on the failed write
  failing->Stop();
  EXPECT_EQ(failing_writes, 1);
  release.Notify();
  slow->Stop();
  fast->Stop();
  EXPECT_EQ(slow_writes, 1);
}

// InlineScope: the first queue a thread schedules in its scope is written
// by that thread as the scope ends, when it says a write cannot block; one
// that cannot say so, or a second queue, goes to the pool's threads.
TEST(OutQueueTest, AScopeWritesItsFirstWritableQueueOnItsOwnThread) {
  WriterPool pool({.threads = 2});
  auto make = [&](std::atomic<std::thread::id>* writer, bool writable,
                  absl::Notification* wrote) {
    return std::make_shared<OutQueue<int>>(
        [writer, wrote](std::vector<int>& batch) {
          *writer = std::this_thread::get_id();
          if (batch.size() == 2) wrote->Notify();
          return true;
        },
        &pool, OutQueue<int>::kDefaultCapacity,
        [writable] { return writable; });
  };
  std::atomic<std::thread::id> first_by, second_by, refusing_by;
  absl::Notification first_wrote, second_wrote, refusing_wrote;
  auto first = make(&first_by, true, &first_wrote);
  auto second = make(&second_by, true, &second_wrote);
  auto refusing = make(&refusing_by, false, &refusing_wrote);
  {
    WriterPool::InlineScope scope(&pool);
    std::vector<int> two = {1, 2};
    first->PushAll(two);
    two = {1, 2};
    second->PushAll(two);
    EXPECT_FALSE(first_wrote.HasBeenNotified());  // not before the scope ends
  }
  EXPECT_TRUE(first_wrote.HasBeenNotified());
  EXPECT_EQ(first_by.load(), std::this_thread::get_id());
  second_wrote.WaitForNotification();
  EXPECT_NE(second_by.load(), std::this_thread::get_id());
  {
    WriterPool::InlineScope scope(&pool);
    std::vector<int> two = {1, 2};
    refusing->PushAll(two);
  }
  refusing_wrote.WaitForNotification();
  EXPECT_NE(refusing_by.load(), std::this_thread::get_id());
  EXPECT_EQ(pool.written_inline(), 1);
  first->Stop();
  second->Stop();
  refusing->Stop();
}

}  // namespace
}  // namespace plexus
