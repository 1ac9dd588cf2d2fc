// CheckCompileOptions against hand-encoded xla.CompileOptionsProto bytes:
// what jaxlib writes for an island passes; what would abort XLA, or run on
// other devices than the island's, is an error.
#include "plexus/executors/xla/compile_options.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/xla/xla_test_util.h"

namespace plexus::xla {
namespace {

using ::testing::HasSubstr;
using testing::LenField;
using testing::Varint;
using testing::VarintField;

// CompileOptionsProto { executable_build_options { num_replicas,
// num_partitions, device_assignment { 1 x devices } } }, packed ids.
std::string Options(int replicas, int partitions,
                    const std::vector<int>* devices) {
  std::string build =
      VarintField(4, replicas) + VarintField(5, partitions) + VarintField(6, 1);
  if (devices != nullptr) {
    std::string da = VarintField(1, 1) + VarintField(2, devices->size());
    for (int d : *devices) da += LenField(3, LenField(1, Varint(d)));
    build += LenField(9, da);
  }
  return LenField(3, build) + VarintField(5, 0);
}

TEST(CompileOptionsTest, AnIslandsOwnOptionsPass) {
  const std::vector<int> island = {3, 1};
  EXPECT_TRUE(CheckCompileOptions(Options(1, 2, &island), {3, 1}).ok());
  // One device, no assignment: XLA's default is device 0.
  EXPECT_TRUE(CheckCompileOptions(Options(1, 1, nullptr), {0}).ok());
}

TEST(CompileOptionsTest, WhatWouldAbortOrMisplaceIsAnError) {
  EXPECT_THAT(CheckCompileOptions("", {0}).message(),
              HasSubstr("no executable_build_options"));
  EXPECT_THAT(CheckCompileOptions("\xff\xff\xff", {0}).message(),
              HasSubstr("not a serialized xla.CompileOptionsProto"));
  EXPECT_THAT(CheckCompileOptions(Options(0, 1, nullptr), {0}).message(),
              HasSubstr("num_replicas must be 1, got 0"));
  EXPECT_THAT(CheckCompileOptions(Options(1, 1, nullptr), {0, 1}).message(),
              HasSubstr("num_partitions is 1, the island has 2 devices"));
  EXPECT_THAT(CheckCompileOptions(Options(1, 1, nullptr), {1}).message(),
              HasSubstr("no device assignment"));
  const std::vector<int> other = {0, 1};
  EXPECT_THAT(CheckCompileOptions(Options(1, 2, &other), {1, 0}).message(),
              HasSubstr("compile options for devices [1, 0]: assigns "
                        "devices [0, 1]"));
}

// An island XLA cannot run on: options that match it passed the check
// before (the invariant of fuzz/compile_options_fuzz.cc).
TEST(CompileOptionsTest, AnIslandNeedsDistinctNonNegativeDevices) {
  const std::vector<int> none = {};
  EXPECT_THAT(CheckCompileOptions(Options(1, 0, &none), none).message(),
              HasSubstr("the island has no devices"));
  const std::vector<int> twice = {1, 1};
  EXPECT_THAT(CheckCompileOptions(Options(1, 2, &twice), twice).message(),
              HasSubstr("device 1 appears twice"));
  const std::vector<int> negative = {0, -1};
  EXPECT_THAT(CheckCompileOptions(Options(1, 2, &negative), negative).message(),
              HasSubstr("device -1"));
}

}  // namespace
}  // namespace plexus::xla
