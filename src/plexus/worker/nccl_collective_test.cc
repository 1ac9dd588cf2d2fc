// The NCCL path's decisions, without a GPU: the offers' wire form, which
// offers choose NCCL and which the host path, and what loading says where
// there is no GPU. (CallCollective's offer exchange: collective_test.cc;
// NCCL itself: tests/gpu/test_nccl.py, where two GPUs exist.)
#include "plexus/worker/nccl_collective.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

using ::testing::HasSubstr;

RankOffer OnGpu(const std::string& uuid, uint64_t communicator = 0) {
  RankOffer o;
  o.on_gpu = true;
  o.gpu = uuid;
  o.communicator = communicator;
  return o;
}

TEST(RankOfferTest, TravelsAsFixedSizeBytes) {
  RankOffer o = OnGpu("0123456789abcdef0123456789abcdef", 42);
  o.has_unique_id = true;
  for (size_t i = 0; i < o.unique_id.bytes.size(); ++i) {
    o.unique_id.bytes[i] = static_cast<char>(i * 7);
  }
  const std::string wire = o.Encode();
  ASSERT_EQ(wire.size(), RankOffer::kBytes);
  absl::StatusOr<RankOffer> back = RankOffer::Decode(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->on_gpu);
  EXPECT_EQ(back->gpu, o.gpu);
  EXPECT_EQ(back->communicator, 42u);
  EXPECT_TRUE(back->has_unique_id);
  EXPECT_EQ(back->unique_id.bytes, o.unique_id.bytes);

  RankOffer host;  // not on a GPU: no id, no GPU
  back = RankOffer::Decode(host.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->on_gpu);
  EXPECT_TRUE(back->gpu.empty());

  EXPECT_THAT(RankOffer::Decode(wire.substr(1)).status().message(),
              HasSubstr("not 176"));
  std::string garbage(RankOffer::kBytes, 'x');
  EXPECT_THAT(RankOffer::Decode(garbage).status().message(),
              HasSubstr("not an all_reduce offer"));
}

TEST(ChoosePathTest, RanksOnDistinctGpusMakeACommunicatorThenReuseIt) {
  const std::vector<int64_t> workers = {3, 5};
  std::vector<RankOffer> offers = {OnGpu("gpu-a"), OnGpu("gpu-b")};
  offers[0].has_unique_id = true;
  PathChoice first = ChoosePath(workers, offers);
  EXPECT_TRUE(first.nccl) << first.reason;
  EXPECT_TRUE(first.new_communicator);

  // Both hold the communicator these offers describe: reuse it.
  const uint64_t made = CommunicatorFingerprint(workers, offers);
  for (RankOffer& o : offers) o.communicator = made;
  PathChoice again = ChoosePath(workers, offers);
  EXPECT_TRUE(again.nccl) << again.reason;
  EXPECT_FALSE(again.new_communicator);

  // One lost it (aborted): all make a new one, with rank 0's id.
  offers[1].communicator = 0;
  EXPECT_TRUE(ChoosePath(workers, offers).new_communicator);
  // The same workers on other GPUs are another communicator.
  std::vector<RankOffer> moved = {OnGpu("gpu-a", made), OnGpu("gpu-c", made)};
  moved[0].has_unique_id = true;
  EXPECT_TRUE(ChoosePath(workers, moved).new_communicator);
  // Without rank 0's id no communicator can be made: the host path.
  moved[0].has_unique_id = false;
  PathChoice none = ChoosePath(workers, moved);
  EXPECT_FALSE(none.nccl);
  EXPECT_THAT(none.reason, HasSubstr("rank 0 has no NCCL unique id"));
}

TEST(ChoosePathTest, AHostValueAnywhereTakesTheHostPath) {
  std::vector<RankOffer> offers = {OnGpu("gpu-a"), RankOffer{}, OnGpu("gpu-c")};
  offers[0].has_unique_id = true;
  PathChoice c = ChoosePath({1, 2, 3}, offers);
  EXPECT_FALSE(c.nccl);
  EXPECT_THAT(c.reason,
              HasSubstr("rank 1 (worker 2) holds no value on a CUDA"));
}

// NCCL refuses two ranks on one GPU (or hangs): the offers find it first.
TEST(ChoosePathTest, TwoRanksOnOneGpuTakeTheHostPath) {
  std::vector<RankOffer> offers = {OnGpu("gpu-a"), OnGpu("gpu-b"),
                                   OnGpu("gpu-a")};
  offers[0].has_unique_id = true;
  PathChoice c = ChoosePath({7, 8, 9}, offers);
  EXPECT_FALSE(c.nccl);
  EXPECT_THAT(c.reason, HasSubstr("ranks 0 (worker 7) and 2 (worker 9) are on "
                                  "one GPU (gpu-a)"));
}

TEST(ChoosePathTest, OneRankNeedsNoNccl) {
  RankOffer only = OnGpu("gpu-a");
  only.has_unique_id = true;
  EXPECT_FALSE(ChoosePath({1}, {only}).nccl);
}

TEST(NcclTypeTest, TheDtypesNcclSums) {
  EXPECT_EQ(*NcclTypeOf(DType::kF32), cuda::NcclType::kFloat32);
  EXPECT_EQ(*NcclTypeOf(DType::kBF16), cuda::NcclType::kBfloat16);
  EXPECT_EQ(*NcclTypeOf(DType::kI64), cuda::NcclType::kInt64);
  EXPECT_THAT(NcclTypeOf(DType::kBool).status().message(),
              HasSubstr("NCCL does not sum bool"));
  EXPECT_FALSE(NcclTypeOf(DType::kC64).ok());
}

// Without a GPU (CI) the runtime does not load, and says why; a worker
// then registers without NCCL and every all_reduce sums on the host.
TEST(NcclRuntimeTest, SaysWhyItCannotLoad) {
  absl::StatusOr<std::unique_ptr<NcclRuntime>> runtime =
      NcclRuntime::Load({"/usr/local/cuda/lib"});
  if (access("/dev/nvidiactl", F_OK) == 0) {
    GTEST_SKIP() << "a GPU is here: " << runtime.status();
  }
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(runtime.status().message(),
              testing::AnyOf(HasSubstr("CUDA is not available"),
                             HasSubstr("cudaGetDeviceCount failed"),
                             HasSubstr("no GPU is visible")));
}

}  // namespace
}  // namespace plexus
