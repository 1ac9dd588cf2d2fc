#include "plexus/worker/task_queue.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

class TaskQueueTest : public ::testing::Test {
 protected:
  void Push(const std::string& name, uint64_t client, double tag,
            bool reorderable = true) {
    Push(name, client, tag, reorderable, reorderable);
  }
  void Push(const std::string& name, uint64_t client, double tag, bool may_pass,
            bool passable) {
    queue_.Push([this, name] { ran_.push_back(name); }, {.client = client,
                                                         .start_tag = tag,
                                                         .may_pass = may_pass,
                                                         .passable = passable});
  }
  std::vector<std::string> Drain() {
    while (!queue_.empty()) queue_.Pop()();
    return ran_;
  }
  TaskQueue queue_;
  std::vector<std::string> ran_;
};

TEST_F(TaskQueueTest, ALowerStartTagOfAnotherClientGoesFirst) {
  // A flooding client's calls are queued; a steady client's call, fairly
  // due earlier, runs next.
  Push("flood1", 1, 10);
  Push("flood2", 1, 11);
  Push("flood3", 1, 12);
  Push("steady", 2, 5);
  EXPECT_EQ(Drain(),
            (std::vector<std::string>{"steady", "flood1", "flood2", "flood3"}));
}

TEST_F(TaskQueueTest, OneClientsTasksKeepTheirOrder) {
  Push("a1", 1, 10);
  Push("b1", 2, 20);
  Push("b2", 2, 1);  // lower tag, but behind b1 of its own client
  EXPECT_EQ(Drain(), (std::vector<std::string>{"a1", "b1", "b2"}));
}

TEST_F(TaskQueueTest, NothingPassesATaskThatIsNotReorderable) {
  Push("a1", 1, 10);
  Push("collective", 2, 20, /*reorderable=*/false);
  Push("c1", 3, 1);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"a1", "collective", "c1"}));
}

TEST_F(TaskQueueTest, AFirstTaskThatIsNotReorderableRunsFirst) {
  Push("xla", 1, 10, /*reorderable=*/false);
  Push("c1", 2, 1);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"xla", "c1"}));
}

// A task waiting for a transfer (may not pass, passable) stays behind the
// tasks ahead of it, however low its tag: moved ahead, it would hold the
// device while its input's producer on another host may wait behind a
// task that waits for one behind it here (two clients' pipelines, in CI's
// restart matrix, hung so for good). Tasks that run to their end may still
// pass it.
TEST_F(TaskQueueTest, ATaskWaitingForATransferPassesNothingButIsPassed) {
  Push("a1", 1, 10);
  Push("waits", 2, 1, /*may_pass=*/false, /*passable=*/true);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"a1", "waits"}));
  ran_.clear();
  Push("waits", 2, 1, /*may_pass=*/false, /*passable=*/true);
  Push("c1", 3, 0);
  Push("b2", 2, 0);  // behind its client's first
  EXPECT_EQ(Drain(), (std::vector<std::string>{"c1", "waits", "b2"}));
  ran_.clear();
  Push("a1", 1, 10);
  Push("waits", 2, 5, /*may_pass=*/false, /*passable=*/true);
  Push("c1", 3, 1);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"c1", "a1", "waits"}));
}

TEST_F(TaskQueueTest, WithoutTagsItIsFifo) {
  Push("a", 1, 0, false);
  Push("b", 2, 0, false);
  Push("c", 1, 0, false);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace plexus
