// softmax_xent and softmax_xent_grad.
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/kernel_test_util.h"

namespace plexus::builtin {
namespace {

using testing::Arg;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using testing::HostArray;
using testing::Infer;
using testing::MessageOf;
using ::testing::Pointwise;
using testing::RunReplicated;
using testing::RunShard;

constexpr DType kF32 = DType::kF32;
constexpr DType kF64 = DType::kF64;

// A batch of 4 rows over 3 classes.
const std::vector<double> kLogits = {1.0, 2.0, 3.0, -1.0, 0.0,  4.0,
                                     0.5, 0.5, 0.5, 2.0,  -3.0, 1.0};
const std::vector<int32_t> kLabels = {2, 0, 1, 0};

// -log softmax(row)[label], written out directly.
double RowLoss(const double* row, int label) {
  double sum = 0;
  for (int c = 0; c < 3; ++c) sum += std::exp(row[c]);
  return -std::log(std::exp(row[label]) / sum);
}

double ExpectedLoss() {
  double total = 0;
  for (int r = 0; r < 4; ++r) total += RowLoss(&kLogits[r * 3], kLabels[r]);
  return total / 4;
}

std::vector<double> ExpectedGrad() {
  std::vector<double> grad(12);
  for (int r = 0; r < 4; ++r) {
    double sum = 0;
    for (int c = 0; c < 3; ++c) sum += std::exp(kLogits[r * 3 + c]);
    for (int c = 0; c < 3; ++c) {
      grad[r * 3 + c] =
          (std::exp(kLogits[r * 3 + c]) / sum - (c == kLabels[r] ? 1.0 : 0.0)) /
          4;
    }
  }
  return grad;
}

// Rows [2 * shard, 2 * shard + 2) of the batch.
std::vector<HostArray> HalfBatch(int shard) {
  return {HostArray::Of<double>(
              {2, 3}, std::vector<double>(kLogits.begin() + shard * 6,
                                          kLogits.begin() + shard * 6 + 6)),
          HostArray::Of<int32_t>(
              {2}, std::vector<int32_t>(kLabels.begin() + shard * 2,
                                        kLabels.begin() + shard * 2 + 2))};
}

const std::vector<ArgSpec> kSplitBatch = {
    Arg(kF64, {4, 3}, Sharding::Split(0)),
    Arg(DType::kI32, {4}, Sharding::Split(0))};

TEST(SoftmaxXentTest, ReplicatedLossIsTheBatchMean) {
  auto out =
      RunReplicated("softmax_xent", {HostArray::Of<double>({4, 3}, kLogits),
                                     HostArray::Of<int32_t>({4}, kLabels)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].spec.ToString(), "float64[]");
  EXPECT_NEAR((*out)[0].values<double>()[0], ExpectedLoss(), 1e-12);
}

TEST(SoftmaxXentTest, ShardsOfASplitBatchGivePartialLossesThatSumToTheMean) {
  auto spec = Infer("softmax_xent", kSplitBatch, 2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)[0].ToString(), "float64[] partial");
  double sum = 0;
  for (int shard = 0; shard < 2; ++shard) {
    auto out =
        RunShard("softmax_xent", kSplitBatch, HalfBatch(shard), {}, shard, 2);
    ASSERT_TRUE(out.ok()) << out.status();
    sum += (*out)[0].values<double>()[0];
  }
  EXPECT_NEAR(sum, ExpectedLoss(), 1e-12);
}

TEST(SoftmaxXentTest, HugeLogitsStayFinite) {
  auto out =
      RunReplicated("softmax_xent", {HostArray::Of<float>({1, 2}, {1000, 0}),
                                     HostArray::Of<int32_t>({1}, {1})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FLOAT_EQ((*out)[0].values<float>()[0], 1000);
}

TEST(SoftmaxXentTest, OutOfRangeLabelNamesTheGlobalRow) {
  std::vector<HostArray> second_half = HalfBatch(1);
  second_half[1] = HostArray::Of<int32_t>({2}, {0, 7});
  auto out = RunShard("softmax_xent", kSplitBatch, second_half, {}, 1, 2);
  EXPECT_EQ(MessageOf(out), "label 7 in row 3 is out of range for 3 classes");
}

TEST(SoftmaxXentTest, LogitsAndLabelsMustBeLaidOutAlike) {
  auto out =
      Infer("softmax_xent",
            {Arg(kF32, {4, 3}, Sharding::Split(0)), Arg(DType::kI32, {4})}, 2);
  EXPECT_EQ(MessageOf(out),
            "logits and labels must be both split(0) or both replicated, got "
            "argument 0 (float32[4, 3] split(0)) and argument 1 (int32[4] "
            "replicated)");
}

TEST(SoftmaxXentTest, LabelsMustBeInt32WithOneLabelPerRow) {
  EXPECT_EQ(MessageOf(Infer("softmax_xent",
                            {Arg(kF32, {4, 3}), Arg(DType::kI64, {4})})),
            "argument 1: expected int32, got int64[4] replicated");
  EXPECT_EQ(MessageOf(Infer("softmax_xent",
                            {Arg(kF32, {4, 3}), Arg(DType::kI32, {3})})),
            "argument 1: expected int32[4], one label per row of argument 0 "
            "(float32[4, 3] replicated), got int32[3] replicated");
}

TEST(SoftmaxXentTest, SplitRunWithoutInputShardingsFails) {
  std::vector<HostArray> half = HalfBatch(0);
  KernelContext ctx;
  ctx.inputs = {{half[0].spec, half[0].bytes.data()},
                {half[1].spec, half[1].bytes.data()}};
  double loss = 0;
  ctx.outputs = {{{kF64, {}}, &loss}};
  ctx.num_shards = 2;
  EXPECT_THAT(
      MessageOf(KernelRegistry::Global().Find("softmax_xent")->Run(ctx)),
      HasSubstr("needs KernelContext::input_shardings"));
}

TEST(SoftmaxXentGradTest, GradientIsSoftmaxMinusOneHotOverTheBatch) {
  auto out = RunReplicated("softmax_xent_grad",
                           {HostArray::Of<double>({4, 3}, kLogits),
                            HostArray::Of<int32_t>({4}, kLabels)});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].spec.ToString(), "float64[4, 3]");
  EXPECT_THAT((*out)[0].values<double>(),
              Pointwise(DoubleNear(1e-12), ExpectedGrad()));
}

TEST(SoftmaxXentGradTest, ShardsOfASplitBatchAreRowsOfTheGlobalGradient) {
  auto spec = Infer("softmax_xent_grad", kSplitBatch, 2);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ((*spec)[0].ToString(), "float64[4, 3] split(0)");
  const std::vector<double> expected = ExpectedGrad();
  for (int shard = 0; shard < 2; ++shard) {
    auto out = RunShard("softmax_xent_grad", kSplitBatch, HalfBatch(shard), {},
                        shard, 2);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_THAT(
        (*out)[0].values<double>(),
        Pointwise(DoubleNear(1e-12),
                  std::vector<double>(expected.begin() + shard * 6,
                                      expected.begin() + shard * 6 + 6)));
  }
}

}  // namespace
}  // namespace plexus::builtin
