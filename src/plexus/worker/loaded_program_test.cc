// LoadedProgram::OutputsOn: a program's local output specs, made once per
// slice size and read by every call.
#include "plexus/worker/loaded_program.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/synchronization/notification.h"

namespace plexus {
namespace {

ArgSpec Arg(Shape shape, Sharding sharding) {
  ArgSpec arg;
  arg.global = TensorSpec{DType::kF32, std::move(shape)};
  arg.sharding = std::move(sharding);
  return arg;
}

TEST(LoadedProgramTest, OutputsAreSplitOncePerSliceSize) {
  LoadedProgram program;
  program.outputs = {Arg({8, 4}, Sharding::Split(0)),
                     Arg({6}, Sharding::Replicated()),
                     Arg({6}, Sharding::Split(0))};

  std::shared_ptr<const LocalOutputs> two = program.OutputsOn(2);
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->shards, 2);
  ASSERT_EQ(two->spec.size(), 3u);
  EXPECT_EQ(two->spec[0], (TensorSpec{DType::kF32, {4, 4}}));
  EXPECT_EQ(two->spec[1], (TensorSpec{DType::kF32, {6}}));
  EXPECT_EQ(two->spec[2], (TensorSpec{DType::kF32, {3}}));
  for (const absl::Status& e : two->error) EXPECT_TRUE(e.ok()) << e;
  // The next call of the same slice size reads the same list.
  EXPECT_EQ(program.OutputsOn(2), two);

  // Another size (a resized slice): made again. Six rows do not split
  // four ways: that output's error, the others' specs.
  std::shared_ptr<const LocalOutputs> four = program.OutputsOn(4);
  EXPECT_NE(four, two);
  EXPECT_EQ(four->shards, 4);
  EXPECT_EQ(four->spec[0], (TensorSpec{DType::kF32, {2, 4}}));
  EXPECT_TRUE(four->error[0].ok());
  EXPECT_TRUE(four->error[1].ok());
  EXPECT_EQ(four->error[2].code(), absl::StatusCode::kInvalidArgument)
      << four->error[2];
  EXPECT_EQ(four->spec[2], TensorSpec());
  // The list an earlier call holds is unchanged.
  EXPECT_EQ(two->spec[0], (TensorSpec{DType::kF32, {4, 4}}));
}

// The ops connection's thread reads a call's specs while a compile of the
// same program may hold `xla_mu` (ExecutableFor holds it throughout, for
// seconds): it must not wait for it. (With the specs under `xla_mu`, a
// 3-host run stalled its workers' ops behind an island's compile, and the
// server dropped a worker: tests/test_deploy_kubernetes.py.)
TEST(LoadedProgramTest, ACallsSpecsDoNotWaitForACompile) {
  LoadedProgram program;
  program.outputs = {Arg({8}, Sharding::Split(0))};
  absl::Notification read;
  std::thread ops;
  {
    absl::MutexLock compiling(&program.xla_mu);
    ops = std::thread([&] {
      EXPECT_EQ(program.OutputsOn(2)->spec[0], (TensorSpec{DType::kF32, {4}}));
      read.Notify();
    });
    // A bounded wait for the event: the read is done while the compile
    // still holds the lock (without the fix it waits until it lets go).
    EXPECT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(20)));
  }
  ops.join();
}

}  // namespace
}  // namespace plexus
