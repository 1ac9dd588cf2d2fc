// Elementwise, creation, collective and test kernels.
#include <chrono>
#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/kernel_test_util.h"

namespace plexus::builtin {
namespace {

using testing::Arg;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::HostArray;
using testing::Infer;
using testing::MessageOf;
using testing::RunReplicated;
using testing::RunShard;

constexpr DType kF32 = DType::kF32;

TEST(AddTest, AddsElementwiseInEveryDType) {
  auto f = RunReplicated("add", {HostArray::Of<float>({3}, {1, 2, 3}),
                                 HostArray::Of<float>({3}, {10, 20, 30})});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)[0].values<float>(), ElementsAre(11, 22, 33));

  auto i = RunReplicated("add", {HostArray::Of<int64_t>({2}, {1, -5}),
                                 HostArray::Of<int64_t>({2}, {1, 5})});
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_THAT((*i)[0].values<int64_t>(), ElementsAre(2, 0));
}

TEST(AddTest, ArgumentsMustMatchInSpecAndSharding) {
  auto out = Infer("add", {Arg(kF32, {8, 4}, Sharding::Split(0)),
                           Arg(kF32, {4, 4}, Sharding::Split(0))});
  EXPECT_EQ(MessageOf(out),
            "argument 1: expected float32[8, 4] split(0) like argument 0, got "
            "float32[4, 4] split(0)");
  out = Infer("add", {Arg(kF32, {4}), Arg(DType::kI32, {4})});
  EXPECT_THAT(MessageOf(out), HasSubstr("got int32[4] replicated"));
}

TEST(AddTest, PartialPlusPartialIsPartial) {
  auto out = Infer("add",
                   {Arg(kF32, {4}, Sharding::Partial()),
                    Arg(kF32, {4}, Sharding::Partial())},
                   2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].ToString(), "float32[4] partial");
}

TEST(AddTest, UnevenSplitNamesTheArgument) {
  auto out = Infer(
      "add",
      {Arg(kF32, {6}, Sharding::Split(0)), Arg(kF32, {6}, Sharding::Split(0))},
      4);
  EXPECT_THAT(MessageOf(out), HasSubstr("argument 0: axis 0 of float32[6]"));
}

TEST(MulTest, MultipliesIntegers) {
  auto out = RunReplicated("mul", {HostArray::Of<int32_t>({3}, {2, 3, -4}),
                                   HostArray::Of<int32_t>({3}, {5, 6, 7})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<int32_t>(), ElementsAre(10, 18, -28));
}

TEST(MulTest, PartialArgumentsAreRefused) {
  auto out = Infer("mul", {Arg(kF32, {4}, Sharding::Partial()),
                           Arg(kF32, {4}, Sharding::Partial())});
  EXPECT_EQ(MessageOf(out),
            "argument 0 is partial (float32[4] partial); the kernel is not "
            "linear in it, all_reduce it first");
  out = Infer("mul", {Arg(kF32, {4}), Arg(kF32, {4}, Sharding::Partial())});
  EXPECT_THAT(MessageOf(out), HasSubstr("argument 1 is partial"));
}

TEST(ScaleTest, ScalesFloatsAndIntegersAndKeepsPartial) {
  const Attrs half{{"factor", 0.5}};
  auto f = RunReplicated("scale", {HostArray::Of<double>({2}, {3, -8})}, half);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)[0].values<double>(), ElementsAre(1.5, -4));

  auto i = RunReplicated("scale", {HostArray::Of<int32_t>({2}, {4, 6})},
                         {{"factor", int64_t{3}}});
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_THAT((*i)[0].values<int32_t>(), ElementsAre(12, 18));

  auto partial = Infer("scale", {Arg(kF32, {4}, Sharding::Partial())}, 2, half);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_TRUE((*partial)[0].sharding.is_partial());
}

TEST(ScaleTest, FactorIsRequired) {
  EXPECT_EQ(MessageOf(Infer("scale", {Arg(kF32, {4})})),
            "missing attribute 'factor'");
}

TEST(IdentityTest, CopiesItsArgument) {
  auto out = RunReplicated("identity", {HostArray::Of<int64_t>({2}, {7, 9})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<int64_t>(), ElementsAre(7, 9));
}

TEST(ReluTest, ZeroesNegativesAndRefusesIntegers) {
  auto out = RunReplicated("relu", {HostArray::Of<float>({4}, {-1, 0, 2, -3})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(0, 0, 2, 0));
  EXPECT_EQ(MessageOf(Infer("relu", {Arg(DType::kI32, {3})})),
            "argument 0: expected float32 or float64, got int32[3] replicated");
}

TEST(ReluGradTest, PassesTheGradientWherexIsPositive) {
  auto out =
      RunReplicated("relu_grad", {HostArray::Of<float>({3}, {-1, 0.5, 2}),
                                  HostArray::Of<float>({3}, {10, 20, 30})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(0, 20, 30));
}

TEST(BiasAddTest, AddsTheBiasToEveryRow) {
  auto out = RunReplicated("bias_add",
                           {HostArray::Of<float>({2, 3}, {1, 2, 3, 4, 5, 6}),
                            HostArray::Of<float>({3}, {10, 20, 30})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(11, 22, 33, 14, 25, 36));
}

TEST(BiasAddTest, RowSplitInputStaysSplit) {
  auto out = Infer("bias_add",
                   {Arg(kF32, {8, 3}, Sharding::Split(0)), Arg(kF32, {3})}, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].ToString(), "float32[8, 3] split(0)");
}

TEST(BiasAddTest, BadLayoutsAndShapesAreNamed) {
  EXPECT_EQ(MessageOf(Infer(
                "bias_add",
                {Arg(kF32, {8, 4}), Arg(kF32, {4}, Sharding::Split(0))}, 2)),
            "argument 1: expected a replicated bias, got float32[4] split(0)");
  EXPECT_EQ(MessageOf(Infer(
                "bias_add",
                {Arg(kF32, {8, 4}, Sharding::Split(1)), Arg(kF32, {4})}, 2)),
            "argument 0: expected replicated or split(0), got float32[8, 4] "
            "split(1)");
  EXPECT_EQ(MessageOf(Infer("bias_add", {Arg(kF32, {8, 4}), Arg(kF32, {3})})),
            "argument 1: expected float32[4] to match the columns of argument "
            "0 (float32[8, 4] replicated), got float32[3] replicated");
}

TEST(SgdUpdateTest, StepsAgainstTheGradient) {
  auto out = RunReplicated(
      "sgd_update",
      {HostArray::Of<float>({2}, {1, 2}), HostArray::Of<float>({2}, {10, -20})},
      {{"lr", 0.1}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(),
              ElementsAre(::testing::FloatEq(0), ::testing::FloatEq(4)));
}

TEST(SgdUpdateTest, PartialGradientMustBeAllReducedFirst) {
  auto out =
      Infer("sgd_update", {Arg(kF32, {4}), Arg(kF32, {4}, Sharding::Partial())},
            2, {{"lr", 0.1}});
  EXPECT_EQ(MessageOf(out),
            "argument 1 is partial (float32[4] partial); sgd_update needs "
            "whole values, all_reduce it first");
}

TEST(FillTest, FillsEachShardOfASplitArray) {
  const Attrs attrs{{"shape", std::vector<int64_t>{4, 2}},
                    {"dtype", std::string("int32")},
                    {"value", int64_t{7}},
                    {"split_axis", int64_t{0}}};
  auto spec = Infer("fill", {}, 2, attrs);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)[0].ToString(), "int32[4, 2] split(0)");
  auto out = RunShard("fill", {}, {}, attrs, /*shard=*/1, /*num_shards=*/2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].spec.ToString(), "int32[2, 2]");
  EXPECT_THAT((*out)[0].values<int32_t>(), ElementsAre(7, 7, 7, 7));
}

TEST(FillTest, DefaultsToReplicatedFloatZeros) {
  auto out = RunShard("fill", {}, {}, {{"shape", std::vector<int64_t>{3}}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].spec.ToString(), "float32[3]");
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(0, 0, 0));
}

TEST(FillTest, BadAttributesAreExplained) {
  EXPECT_EQ(MessageOf(Infer("fill", {}, 1,
                            {{"shape", std::vector<int64_t>{4}},
                             {"split_axis", int64_t{1}}})),
            "attribute 'split_axis' must be -1 (replicated) or in [0, 1) for "
            "shape [4], got 1");
  EXPECT_THAT(MessageOf(Infer("fill", {}, 3,
                              {{"shape", std::vector<int64_t>{4}},
                               {"split_axis", int64_t{0}}})),
              HasSubstr("does not split evenly over 3 devices"));
  EXPECT_THAT(MessageOf(Infer("fill", {}, 1,
                              {{"shape", std::vector<int64_t>{4}},
                               {"dtype", std::string("bfloat16")}})),
              HasSubstr("compute in float32, float64, int32 and int64, not "
                        "bfloat16"));
  EXPECT_THAT(MessageOf(Infer("fill", {}, 1,
                              {{"shape", std::vector<int64_t>{4}},
                               {"dtype", std::string("complex256")}})),
              HasSubstr("unsupported dtype 'complex256'"));
  EXPECT_THAT(MessageOf(Infer("fill", {}, 1,
                              {{"shape", std::vector<int64_t>{4}},
                               {"dtype", std::string("uint32")}})),
              HasSubstr("compute in float32, float64, int32 and int64, not "
                        "uint32"));
}

TEST(IotaTest, ReplicatedIotaCountsInRowMajorOrder) {
  auto out = RunShard(
      "iota", {}, {},
      {{"shape", std::vector<int64_t>{2, 3}}, {"dtype", std::string("int64")}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<int64_t>(), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(IotaTest, ShardsOfASplitIotaAreThePiecesOfTheGlobalIota) {
  // Global iota[2, 4] = [[0 1 2 3], [4 5 6 7]], split over columns.
  const Attrs attrs{{"shape", std::vector<int64_t>{2, 4}},
                    {"dtype", std::string("int32")},
                    {"split_axis", int64_t{1}}};
  auto left = RunShard("iota", {}, {}, attrs, 0, 2);
  auto right = RunShard("iota", {}, {}, attrs, 1, 2);
  ASSERT_TRUE(left.ok() && right.ok());
  EXPECT_THAT((*left)[0].values<int32_t>(), ElementsAre(0, 1, 4, 5));
  EXPECT_THAT((*right)[0].values<int32_t>(), ElementsAre(2, 3, 6, 7));

  auto bottom = RunShard(
      "iota", {}, {},
      {{"shape", std::vector<int64_t>{4, 2}}, {"split_axis", int64_t{0}}}, 1,
      2);
  ASSERT_TRUE(bottom.ok()) << bottom.status();
  EXPECT_THAT((*bottom)[0].values<float>(), ElementsAre(4, 5, 6, 7));
}

// Sums the caller's array with the other shards' arrays it was given, as
// the worker's collectives would once every shard has contributed.
class FakeCollectives : public Collectives {
 public:
  explicit FakeCollectives(std::vector<std::vector<float>> others)
      : others_(std::move(others)) {}
  absl::Status AllReduceSum(const ConstTensor& in,
                            const MutableTensor& out) override {
    for (int64_t i = 0; i < in.spec.num_elements(); ++i) {
      float sum = in.as<float>()[i];
      for (const auto& other : others_) sum += other[i];
      out.as<float>()[i] = sum;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::vector<float>> others_;
};

TEST(AllReduceTest, OutputIsTheReplicatedSumOfTheLocalPieces) {
  auto split = Infer("all_reduce", {Arg(kF32, {8, 4}, Sharding::Split(0))}, 2);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)[0].ToString(), "float32[4, 4] replicated");
  auto partial = Infer("all_reduce", {Arg(kF32, {3}, Sharding::Partial())}, 2);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ((*partial)[0].ToString(), "float32[3] replicated");

  FakeCollectives collectives({{10, 20, 30}});
  auto out =
      RunShard("all_reduce", {Arg(kF32, {3}, Sharding::Partial())},
               {HostArray::Of<float>({3}, {1, 2, 3})}, {}, 0, 2, &collectives);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(11, 22, 33));
}

TEST(AllReduceTest, WithoutCollectivesItFails) {
  auto out = RunShard("all_reduce", {Arg(kF32, {3}, Sharding::Partial())},
                      {HostArray::Of<float>({3}, {1, 2, 3})}, {}, 0, 2);
  EXPECT_THAT(MessageOf(out), HasSubstr("collectives is null"));
}

TEST(AssertFiniteTest, PassesFiniteValuesThrough) {
  auto out =
      RunReplicated("assert_finite", {HostArray::Of<double>({2}, {1.5, -2})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<double>(), ElementsAre(1.5, -2));
}

TEST(AssertFiniteTest, NamesTheFirstNonFiniteValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(MessageOf(RunReplicated("assert_finite",
                                    {HostArray::Of<float>({3}, {1, 2, nan})})),
            "non-finite value nan at index 2");
  EXPECT_EQ(MessageOf(RunReplicated("assert_finite",
                                    {HostArray::Of<float>({2}, {-inf, 0})})),
            "non-finite value -inf at index 0");
}

TEST(BusyWaitTest, SpinsForTheRequestedTimeThenCopies) {
  const auto start = std::chrono::steady_clock::now();
  auto out = RunReplicated("busy_wait", {HostArray::Of<int32_t>({2}, {4, 5})},
                           {{"micros", int64_t{2000}}});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<int32_t>(), ElementsAre(4, 5));
  EXPECT_GE(elapsed, std::chrono::microseconds(2000));
}

TEST(BusyWaitTest, NegativeDurationIsRefused) {
  EXPECT_EQ(MessageOf(Infer("busy_wait", {Arg(kF32, {1})}, 1,
                            {{"micros", int64_t{-1}}})),
            "attribute 'micros' must not be negative, got -1");
}

}  // namespace
}  // namespace plexus::builtin
