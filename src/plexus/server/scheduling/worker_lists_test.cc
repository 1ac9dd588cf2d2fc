#include "plexus/server/scheduling/worker_lists.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(WorkerListsTest, EqualListsAreOneCopy) {
  WorkerLists lists;
  const std::vector<int64_t> slice = {1, 2, 3, 4};
  WorkerLists::List a = lists.Share(slice);
  WorkerLists::List b = lists.Share({1, 2, 3, 4});
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(*a, slice);
  WorkerLists::List other = lists.Share({1, 2});
  EXPECT_NE(other.get(), a.get());
  EXPECT_EQ(lists.Share({1, 2}).get(), other.get());
}

TEST(WorkerListsTest, AListOutlivesItsPlaceWhileACallHoldsIt) {
  WorkerLists lists;
  WorkerLists::List held = lists.Share({7, 9});
  // kKept other lists push it out of the kept ones...
  for (int64_t w = 0; w < static_cast<int64_t>(WorkerLists::kKept); ++w) {
    lists.Share({100 + w});
  }
  // ...so an equal list is a new copy, and the held one is intact.
  WorkerLists::List again = lists.Share({7, 9});
  EXPECT_NE(again.get(), held.get());
  EXPECT_EQ(*held, (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(*again, *held);
}

}  // namespace
}  // namespace plexus
