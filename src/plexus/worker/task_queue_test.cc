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
    queue_.Push(
        [this, name] { ran_.push_back(name); },
        {.client = client, .start_tag = tag, .reorderable = reorderable});
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

TEST_F(TaskQueueTest, WithoutTagsItIsFifo) {
  Push("a", 1, 0, false);
  Push("b", 2, 0, false);
  Push("c", 1, 0, false);
  EXPECT_EQ(Drain(), (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace plexus
