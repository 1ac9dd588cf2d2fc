// matmul and reduce_sum.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/kernel_test_util.h"

namespace plexus::builtin {
namespace {

using testing::Arg;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::HostArray;
using testing::Infer;
using testing::MessageOf;
using ::testing::Pointwise;
using testing::RunReplicated;
using testing::RunShard;

constexpr DType kF32 = DType::kF32;

// Row-major a[m, k] x b[k, n] by the definition.
template <typename T>
std::vector<T> NaiveMatmul(const std::vector<T>& a, const std::vector<T>& b,
                           int m, int k, int n) {
  std::vector<T> c(m * n, 0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int l = 0; l < k; ++l) c[i * n + j] += a[i * k + l] * b[l * n + j];
    }
  }
  return c;
}

template <typename T>
std::vector<T> Transposed(const std::vector<T>& x, int rows, int cols) {
  std::vector<T> t(x.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

template <typename T>
std::vector<T> Ramp(int n, T scale) {
  std::vector<T> x(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<T>((i % 7) - 3) * scale;
  return x;
}

TEST(MatmulTest, MatchesTheNaiveProductForEveryTransposeCombination) {
  const int m = 3, k = 5, n = 4;
  const std::vector<double> a = Ramp<double>(m * k, 0.5);
  const std::vector<double> b = Ramp<double>(k * n, 1.25);
  const std::vector<double> expected = NaiveMatmul(a, b, m, k, n);
  for (int64_t ta : {0, 1}) {
    for (int64_t tb : {0, 1}) {
      HostArray a_arg = ta ? HostArray::Of<double>({k, m}, Transposed(a, m, k))
                           : HostArray::Of<double>({m, k}, a);
      HostArray b_arg = tb ? HostArray::Of<double>({n, k}, Transposed(b, k, n))
                           : HostArray::Of<double>({k, n}, b);
      auto out = RunReplicated("matmul", {a_arg, b_arg},
                               {{"transpose_a", ta}, {"transpose_b", tb}});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ((*out)[0].spec.ToString(), "float64[3, 4]");
      EXPECT_THAT((*out)[0].values<double>(),
                  Pointwise(DoubleNear(1e-12), expected))
          << "transpose_a=" << ta << " transpose_b=" << tb;
    }
  }
}

TEST(MatmulTest, Float32UsesSgemm) {
  auto out =
      RunReplicated("matmul", {HostArray::Of<float>({2, 2}, {1, 2, 3, 4}),
                               HostArray::Of<float>({2, 1}, {5, 6})});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].values<float>(), ElementsAre(17, 39));
}

TEST(MatmulTest, ShardingFollowsTheLogicalAxes) {
  struct Case {
    Sharding a, b;
    int64_t transpose_a;
    const char* expected;
  };
  const Sharding r = Sharding::Replicated();
  for (const Case& c : std::vector<Case>{
           {r, r, 0, "float32[8, 6] replicated"},
           {Sharding::Split(0), r, 0, "float32[8, 6] split(0)"},
           {Sharding::Split(1), r, 1, "float32[8, 6] split(0)"},  // a is [k, m]
           {r, Sharding::Split(1), 0, "float32[8, 6] split(1)"},
           {Sharding::Split(1), Sharding::Split(0), 0, "float32[8, 6] partial"},
           {Sharding::Split(0), Sharding::Split(0), 1, "float32[8, 6] partial"},
       }) {
    Shape a_shape = c.transpose_a ? Shape{4, 8} : Shape{8, 4};
    auto out =
        Infer("matmul", {Arg(kF32, a_shape, c.a), Arg(kF32, {4, 6}, c.b)}, 2,
              {{"transpose_a", c.transpose_a}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].ToString(), c.expected);
  }
}

TEST(MatmulTest, UnsupportedShardingNamesBothArguments) {
  auto out = Infer("matmul",
                   {Arg(kF32, {8, 4}, Sharding::Split(0)),
                    Arg(kF32, {4, 6}, Sharding::Split(1))},
                   2);
  EXPECT_THAT(MessageOf(out),
              HasSubstr("matmul cannot combine argument 0 (float32[8, 4] "
                        "split(0)) with argument 1 (float32[4, 6] split(1))"));
}

TEST(MatmulTest, ContractionMismatchShowsBothShapes) {
  auto out = Infer("matmul", {Arg(kF32, {8, 4}), Arg(kF32, {5, 6})});
  EXPECT_EQ(MessageOf(out),
            "argument 1: expected length 4 on axis 0 (the contraction axis) to "
            "match argument 0 (float32[8, 4] replicated), got float32[5, 6] "
            "replicated");
}

TEST(MatmulTest, IntegersAndBadFlagsAreRefused) {
  EXPECT_EQ(MessageOf(Infer("matmul", {Arg(DType::kI32, {2, 2}),
                                       Arg(DType::kI32, {2, 2})})),
            "argument 0: expected float32 or float64, got int32[2, 2] "
            "replicated");
  EXPECT_EQ(MessageOf(Infer("matmul", {Arg(kF32, {2, 2}), Arg(kF32, {2, 2})}, 1,
                            {{"transpose_b", int64_t{2}}})),
            "attribute 'transpose_b' must be 0 or 1, got 2");
}

TEST(MatmulTest, ShardsSplitOnKSumToTheFullProduct) {
  // a[2, 4] and b[4, 2], both split on k over 2 shards.
  const std::vector<float> a = Ramp<float>(8, 1), b = Ramp<float>(8, 2);
  const std::vector<ArgSpec> args = {Arg(kF32, {2, 4}, Sharding::Split(1)),
                                     Arg(kF32, {4, 2}, Sharding::Split(0))};
  std::vector<float> sum(4, 0);
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<float> a_piece, b_piece;
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) a_piece.push_back(a[r * 4 + shard * 2 + c]);
    }
    for (int i = 0; i < 4; ++i) b_piece.push_back(b[shard * 4 + i]);
    auto out = RunShard("matmul", args,
                        {HostArray::Of<float>({2, 2}, a_piece),
                         HostArray::Of<float>({2, 2}, b_piece)},
                        {}, shard, 2);
    ASSERT_TRUE(out.ok()) << out.status();
    for (int i = 0; i < 4; ++i) sum[i] += (*out)[0].values<float>()[i];
  }
  EXPECT_THAT(sum, ElementsAreArray(NaiveMatmul(a, b, 2, 4, 2)));
}

TEST(ReduceSumTest, SumsOneAxisOrAll) {
  const HostArray x = HostArray::Of<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto all = RunReplicated("reduce_sum", {x});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)[0].spec.ToString(), "int32[]");
  EXPECT_THAT((*all)[0].values<int32_t>(), ElementsAre(21));

  auto rows = RunReplicated("reduce_sum", {x}, {{"axis", int64_t{0}}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT((*rows)[0].values<int32_t>(), ElementsAre(5, 7, 9));

  auto cols = RunReplicated("reduce_sum", {x}, {{"axis", int64_t{1}}});
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_THAT((*cols)[0].values<int32_t>(), ElementsAre(6, 15));
}

TEST(ReduceSumTest, ReducingASplitAxisGivesAPartialResult) {
  struct Case {
    Sharding in;
    int64_t axis;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {Sharding::Split(0), -1, "float32[] partial"},
           {Sharding::Split(0), 0, "float32[4, 6] partial"},
           {Sharding::Split(2), 0, "float32[4, 6] split(1)"},
           {Sharding::Split(0), 2, "float32[8, 4] split(0)"},
           {Sharding::Partial(), 1, "float32[8, 6] partial"},
           {Sharding::Replicated(), 1, "float32[8, 6] replicated"},
       }) {
    auto out = Infer("reduce_sum", {Arg(kF32, {8, 4, 6}, c.in)}, 2,
                     {{"axis", c.axis}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].ToString(), c.expected)
        << c.in.ToString() << " axis " << c.axis;
  }
}

TEST(ReduceSumTest, AxisOutOfRangeNamesTheArgument) {
  EXPECT_EQ(MessageOf(Infer("reduce_sum", {Arg(kF32, {8, 4})}, 1,
                            {{"axis", int64_t{2}}})),
            "argument 0 (float32[8, 4] replicated): attribute 'axis' must be "
            "-1 (all axes) or in [0, 2), got 2");
}

}  // namespace
}  // namespace plexus::builtin
