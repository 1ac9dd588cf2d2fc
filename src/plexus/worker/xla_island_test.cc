// IslandExecution: the rendezvous of an XLA call's partitions on one worker.
#include "plexus/worker/xla_island.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

xla::XlaArgument In(const float* data) {
  return {TensorSpec{DType::kF32, {1}}, data};
}

// A device buffer standing for partition p's output (only its identity is
// looked at).
class Marker : public DeviceBuffer {
 public:
  explicit Marker(int p) : p(p) {}
  size_t size() const override { return 0; }
  absl::Status Await() const override { return absl::OkStatus(); }
  const void* host_address() const override { return nullptr; }
  absl::Status CopyToHost(void*) const override { return absl::OkStatus(); }
  const int p;
};

absl::StatusOr<IslandExecution::Outputs> OnePerPartition(int parts) {
  IslandExecution::Outputs out(parts);
  for (int p = 0; p < parts; ++p) out[p].push_back(std::make_shared<Marker>(p));
  return out;
}

TEST(IslandExecutionTest, TheLastArrivalRunsOnceWithEveryPartition) {
  constexpr int kParts = 3;
  IslandExecution island(kParts);
  float values[kParts] = {1, 2, 3};
  std::atomic<int> runs{0};
  std::atomic<int> seen_parts{0};
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs& in,
                                   IslandExecution::DoneFn done) {
    done(absl::OkStatus());
    runs++;
    int n = 0;
    for (int p = 0; p < kParts; ++p) {
      if (in[p].size() == 1 && in[p][0].host == &values[p]) n++;
    }
    seen_parts = n;
    return OnePerPartition(kParts);
  };
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<std::vector<std::shared_ptr<const DeviceBuffer>>>>
      result(kParts);
  for (int p = 0; p < kParts; ++p) {
    threads.emplace_back(
        [&, p] { result[p] = island.Arrive(p, {In(&values[p])}, run); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(seen_parts.load(), kParts);
  for (int p = 0; p < kParts; ++p) {
    ASSERT_TRUE(result[p].ok()) << result[p].status();
    ASSERT_EQ(result[p]->size(), 1u);
    // Each partition gets its own outputs.
    EXPECT_EQ(static_cast<const Marker&>(*(*result[p])[0]).p, p);
  }
}

TEST(IslandExecutionTest, ARunWithTooFewPartitionsIsAnError) {
  IslandExecution island(2);
  float v = 0;
  IslandExecution::RunFn run = [](const IslandExecution::Inputs&,
                                  IslandExecution::DoneFn done) {
    done(absl::OkStatus());
    return OnePerPartition(1);
  };
  absl::Status a;
  std::thread t([&] { a = island.Arrive(0, {In(&v)}, run).status(); });
  absl::Status b = island.Arrive(1, {In(&v)}, run).status();
  t.join();
  EXPECT_EQ(a.code(), absl::StatusCode::kInternal) << a;
  EXPECT_EQ(b, a);
}

TEST(IslandExecutionTest, AFailedPartitionFailsTheIslandWithoutRunning) {
  IslandExecution island(3);
  float v = 0;
  std::atomic<int> runs{0};
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs&,
                                   IslandExecution::DoneFn) {
    runs++;
    return OnePerPartition(3);
  };
  absl::Status a, b;
  std::thread t1([&] { a = island.Arrive(0, {In(&v)}, run).status(); });
  std::thread t2([&] { b = island.Arrive(2, {In(&v)}, run).status(); });
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
  IslandExecution::RunFn run =
      [](const IslandExecution::Inputs&,
         IslandExecution::DoneFn) -> absl::StatusOr<IslandExecution::Outputs> {
    return absl::InternalError("XLA execute: boom");
  };
  absl::Status a;
  std::thread t([&] { a = island.Arrive(0, {In(&v)}, run).status(); });
  absl::Status b = island.Arrive(1, {In(&v)}, run).status();
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
                                   IslandExecution::DoneFn) {
    runs++;
    return OnePerPartition(2);
  };
  island.Fail(0, absl::OkStatus());
  absl::Status s = island.Arrive(1, {In(&v)}, run).status();
  EXPECT_EQ(runs.load(), 0);
  EXPECT_FALSE(s.ok());
}

TEST(IslandExecutionTest, WhatWaitsForTheEndRunsWhenTheRunEnds) {
  // The run is queued, not run, when the partitions return: what needs its
  // end (inputs let go, the call reported) waits for `done`.
  IslandExecution island(2);
  float v = 0;
  IslandExecution::DoneFn done;
  IslandExecution::RunFn run = [&](const IslandExecution::Inputs&,
                                   IslandExecution::DoneFn d) {
    done = std::move(d);
    return OnePerPartition(2);
  };
  absl::Status a;
  std::thread t([&] { a = island.Arrive(0, {In(&v)}, run).status(); });
  absl::Status b = island.Arrive(1, {In(&v)}, run).status();
  t.join();
  ASSERT_TRUE(a.ok()) << a;
  ASSERT_TRUE(b.ok()) << b;
  std::vector<std::string> seen;
  island.WhenEnded([&](const absl::Status& s) { seen.push_back("first"); });
  island.WhenEnded(
      [&](const absl::Status& s) { seen.push_back(std::string(s.message())); });
  EXPECT_TRUE(seen.empty());  // not ended yet
  ASSERT_TRUE(done);
  done(absl::ResourceExhaustedError("out of memory on the device"));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "first");
  EXPECT_EQ(seen[1], "out of memory on the device");
  // After the end: at once, with the same status.
  absl::Status late;
  island.WhenEnded([&](const absl::Status& s) { late = s; });
  EXPECT_EQ(late.code(), absl::StatusCode::kResourceExhausted);
}

TEST(IslandExecutionTest, AnIslandThatNeverRanHasEndedAtOnce) {
  IslandExecution island(2);
  float v = 0;
  IslandExecution::RunFn run =
      [](const IslandExecution::Inputs&,
         IslandExecution::DoneFn) -> absl::StatusOr<IslandExecution::Outputs> {
    return absl::InternalError("never");
  };
  island.Fail(0, absl::NotFoundError("input 0 failed upstream"));
  EXPECT_FALSE(island.Arrive(1, {In(&v)}, run).ok());
  absl::Status end;
  island.WhenEnded([&](const absl::Status& s) { end = s; });
  EXPECT_EQ(end, absl::NotFoundError("input 0 failed upstream"));
}

}  // namespace
}  // namespace plexus
