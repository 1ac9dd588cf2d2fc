// IslandExecution: the rendezvous of an XLA call's partitions on one worker.
#include "plexus/worker/xla_island.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

builtin::ConstTensor In(const float* data) {
  return {TensorSpec{DType::kF32, {1}}, data};
}

TEST(IslandExecutionTest, TheLastArrivalRunsOnceWithEveryPartition) {
  constexpr int kParts = 3;
  IslandExecution island(kParts);
  float values[kParts] = {1, 2, 3};
  std::atomic<int> runs{0};
  std::atomic<int> seen_parts{0};
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs& in,
                                   const IslandExecution::Outputs&) {
    runs++;
    int n = 0;
    for (int p = 0; p < kParts; ++p) {
      if (in[p].size() == 1 && in[p][0].data == &values[p]) n++;
    }
    seen_parts = n;
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(kParts);
  for (int p = 0; p < kParts; ++p) {
    threads.emplace_back(
        [&, p] { status[p] = island.Arrive(p, {In(&values[p])}, {}, run); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(seen_parts.load(), kParts);
  for (const auto& s : status) EXPECT_TRUE(s.ok()) << s;
}

TEST(IslandExecutionTest, AFailedPartitionFailsTheIslandWithoutRunning) {
  IslandExecution island(3);
  float v = 0;
  std::atomic<int> runs{0};
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs&,
                                   const IslandExecution::Outputs&) {
    runs++;
    return absl::OkStatus();
  };
  absl::Status a, b;
  std::thread t1([&] { a = island.Arrive(0, {In(&v)}, {}, run); });
  std::thread t2([&] { b = island.Arrive(2, {In(&v)}, {}, run); });
  island.Fail(1, absl::NotFoundError("input 0 failed upstream"));
  t1.join();
  t2.join();
  EXPECT_EQ(runs.load(), 0);
  EXPECT_EQ(a, absl::NotFoundError("input 0 failed upstream"));
  EXPECT_EQ(b, a);
}

TEST(IslandExecutionTest, TheRunsErrorReachesEveryPartition) {
  IslandExecution island(2);
  float v = 0;
  IslandExecution::RunFn run = [](const IslandExecution::Inputs&,
                                  const IslandExecution::Outputs&) {
    return absl::InternalError("XLA execute: boom");
  };
  absl::Status a;
  std::thread t([&] { a = island.Arrive(0, {In(&v)}, {}, run); });
  absl::Status b = island.Arrive(1, {In(&v)}, {}, run);
  t.join();
  EXPECT_EQ(a, absl::InternalError("XLA execute: boom"));
  EXPECT_EQ(b, a);
}

TEST(IslandExecutionTest, LeavingWithoutAnErrorStillFails) {
  // A partition that leaves with an OK status (a bug) must not let the
  // island run with missing inputs, nor hang it.
  IslandExecution island(2);
  float v = 0;
  std::atomic<int> runs{0};
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs&,
                                   const IslandExecution::Outputs&) {
    runs++;
    return absl::OkStatus();
  };
  island.Fail(0, absl::OkStatus());
  absl::Status s = island.Arrive(1, {In(&v)}, {}, run);
  EXPECT_EQ(runs.load(), 0);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace plexus
