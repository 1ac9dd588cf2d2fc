// Which shards a fetch reads (PlanFetch), the rule a relayed call's
// workers follow too: every shard of a split or partial value, device 0's
// of a replicated one, the first device of each distinct block of a mesh.
#include "plexus/client/fetch_plan.h"

#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

ArgSpec Spec(Shape shape, Sharding sharding) {
  return ArgSpec{TensorSpec{DType::kF32, std::move(shape)},
                 std::move(sharding)};
}

std::vector<int> Reads(const ArgSpec& arg, int n) {
  absl::StatusOr<FetchPlan> plan = PlanFetch(arg, n);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->reads : std::vector<int>{};
}

TEST(FetchPlanTest, EachKindOfLayoutReadsItsBlocksOnce) {
  EXPECT_EQ(Reads(Spec({8}, Sharding::Replicated()), 4), (std::vector<int>{0}));
  EXPECT_EQ(Reads(Spec({8}, Sharding::Split(0)), 4),
            (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Reads(Spec({8}, Sharding::Partial()), 4),
            (std::vector<int>{0, 1, 2, 3}));
  // A 2x2 mesh, dimension 0 split over "data": devices 0 and 1 hold the
  // first block (replicas along "model"), 2 and 3 the second.
  const ArgSpec data =
      Spec({8, 4}, Sharding::Mesh({2, 2}, {"data", "model"}, {{0}, {}}));
  absl::StatusOr<FetchPlan> plan = PlanFetch(data, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->reads, (std::vector<int>{0, 2}));
  ASSERT_EQ(plan->boxes.size(), 2u);
  EXPECT_EQ(plan->boxes[1].start, (Shape{4, 0}));
  // Split over both axes: every device its own block.
  EXPECT_EQ(
      Reads(Spec({8, 4}, Sharding::Mesh({2, 2}, {"data", "model"}, {{0}, {1}})),
            4),
      (std::vector<int>{0, 1, 2, 3}));
}

TEST(FetchPlanTest, AMeshThatIsNotTheSlicesSizeIsAnError) {
  const ArgSpec data =
      Spec({8, 4}, Sharding::Mesh({2, 2}, {"data", "model"}, {{0}, {}}));
  EXPECT_FALSE(PlanFetch(data, 8).ok());
}

}  // namespace
}  // namespace plexus
