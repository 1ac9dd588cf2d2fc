#include "plexus/common/argument_count.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(ArgumentCountTest, TheProgramsOwnCountPasses) {
  EXPECT_TRUE(CheckArgumentCount("add", 2, 2).ok());
  EXPECT_TRUE(CheckArgumentCount("iota", 0, 0).ok());
}

TEST(ArgumentCountTest, AnotherCountNamesTheProgramAndBothCounts) {
  absl::Status s = CheckArgumentCount("add", 2, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "program 'add' takes 2 arguments, got 3");
  EXPECT_EQ(CheckArgumentCount("iota", 0, 1).message(),
            "program 'iota' takes 0 arguments, got 1");
}

}  // namespace
}  // namespace plexus
