// RememberedIds: the last `capacity` ids added, an id forgotten on request
// whether or not it is above the largest added.
#include "plexus/store/remembered_ids.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(RememberedIdsTest, KeepsTheLastIdsAndForgetsOnRequest) {
  RememberedIds ids(3);
  for (uint64_t id : {10, 20, 30, 40}) ids.Add(id);
  EXPECT_FALSE(ids.Contains(10));  // the oldest, past the capacity
  EXPECT_TRUE(ids.Contains(20) && ids.Contains(30) && ids.Contains(40));
  ids.Forget(30);  // below the largest: looked up and taken out
  EXPECT_FALSE(ids.Contains(30));
  ids.Forget(50);  // above every id added: nothing to take out
  EXPECT_EQ(ids.size(), 2u);
  // An id added again after another client's newer ones: still found and
  // forgotten (the largest is a bound, not the last added).
  ids.Add(5);
  EXPECT_TRUE(ids.Contains(5));
  ids.Forget(5);
  EXPECT_FALSE(ids.Contains(5));
  ids.Clear();
  EXPECT_EQ(ids.size(), 0u);
  ids.Add(7);  // the bound starts again from the ids added after Clear
  ids.Forget(7);
  EXPECT_FALSE(ids.Contains(7));
}

}  // namespace
}  // namespace plexus
