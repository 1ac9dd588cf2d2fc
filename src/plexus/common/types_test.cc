#include "plexus/common/types.h"

#include <cmath>
#include <cstring>

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(ArgSpecTest, LocalShapeOfSplitDividesTheAxis) {
  ArgSpec arg{{DType::kF32, {8, 4}}, Sharding::Split(0)};
  auto local = arg.Local(4);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->shape, (Shape{2, 4}));
}

TEST(ArgSpecTest, UnevenSplitNamesTheAxisAndLength) {
  ArgSpec arg{{DType::kF32, {6, 4}}, Sharding::Split(0)};
  auto local = arg.Local(4);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("length 6"), std::string::npos);
}

TEST(ArgSpecTest, ProtoRoundTripKeepsPartial) {
  ArgSpec arg{{DType::kI32, {3}}, Sharding::Partial()};
  auto back = FromProto(ToProto(arg));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, arg);
  EXPECT_EQ(back->ToString(), "int32[3] partial");
}

TEST(AttrsTest, ProtoRoundTrip) {
  Attrs attrs{{"lr", 0.5},
              {"n", int64_t{3}},
              {"s", std::string("x")},
              {"shape", std::vector<int64_t>{2, 3}}};
  proto::ProgramDef def;
  AttrsToProto(attrs, def.mutable_attrs());
  EXPECT_EQ(AttrsFromProto(def.attrs()), attrs);
}

TEST(DTypeTest, EveryDTypeRoundTripsThroughItsName) {
  for (int code = 1; code <= kMaxDType; ++code) {
    DType d = static_cast<DType>(code);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
    EXPECT_GT(DTypeSize(d), 0u);
    auto spec = FromProto(ToProto(TensorSpec{d, {2}}));
    ASSERT_TRUE(spec.ok()) << DTypeName(d);
    EXPECT_EQ(spec->dtype, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kC128), 16u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3FN), 1u);
  EXPECT_STREQ(DTypeName(DType::kU32), "uint32");
  EXPECT_FALSE(ParseDType("complex256").ok());
  proto::TensorSpec beyond;
  beyond.set_dtype(static_cast<proto::DType>(kMaxDType + 1));
  EXPECT_FALSE(FromProto(beyond).ok());
}

TEST(DTypeTest, SubByteDTypesAreRefusedSayingWhy) {
  auto parsed = ParseDType("int4");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("smaller than a byte"),
            std::string::npos)
      << parsed.status();
}

TEST(DTypeTest, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16(1.0f)), 1.0f);
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to even (1).
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16(1.0f + 3.0f / 256)),
            1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(NAN))));
}

TEST(DTypeTest, Float16RoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = Float16ToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(f)))) << bits;
    } else {
      EXPECT_EQ(FloatToFloat16(f), h) << bits;
    }
  }
  EXPECT_EQ(FloatToFloat16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);  // smallest
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -26)), 0x0000);  // under half
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
#if defined(__FLT16_MAX__)
  // Against the compiler's own binary16 where it has one (GCC 12).
  for (float f = -70000.0f; f < 70000.0f; f += 0.37f) {
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, sizeof(ref_bits));
    ASSERT_EQ(FloatToFloat16(f), ref_bits) << f;
  }
#endif
}

TEST(DTypeTest, AccumulateAddsNarrowTypesAndOrsBools) {
  uint16_t acc[2] = {FloatToBfloat16(1.5f), FloatToBfloat16(-1.0f)};
  const uint16_t in[2] = {FloatToBfloat16(0.25f), FloatToBfloat16(3.0f)};
  AccumulateInto(DType::kBF16, acc, in, 2);
  EXPECT_EQ(Bfloat16ToFloat(acc[0]), 1.75f);
  EXPECT_EQ(Bfloat16ToFloat(acc[1]), 2.0f);
  uint16_t h[1] = {FloatToFloat16(0.5f)};
  const uint16_t hi[1] = {FloatToFloat16(0.25f)};
  AccumulateInto(DType::kF16, h, hi, 1);
  EXPECT_EQ(Float16ToFloat(h[0]), 0.75f);
  uint8_t b[3] = {0, 1, 0};
  const uint8_t bi[3] = {0, 1, 1};
  AccumulateInto(DType::kBool, b, bi, 3);
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[1], 1);
  EXPECT_EQ(b[2], 1);
}

TEST(DTypeTest, AccumulateWrapsUnsignedAndAddsComplex) {
  uint32_t u[2] = {0xffffffffu, 7};
  const uint32_t ui[2] = {2, 5};
  ASSERT_TRUE(CanAccumulate(DType::kU32));
  AccumulateInto(DType::kU32, u, ui, 2);
  EXPECT_EQ(u[0], 1u);
  EXPECT_EQ(u[1], 12u);
  float c[2] = {1.0f, 2.0f};  // one complex64: 1 + 2i
  const float ci[2] = {0.5f, -3.0f};
  AccumulateInto(DType::kC64, c, ci, 1);
  EXPECT_EQ(c[0], 1.5f);
  EXPECT_EQ(c[1], -1.0f);
  EXPECT_FALSE(CanAccumulate(DType::kF8E4M3FN));
  EXPECT_FALSE(CanAccumulate(DType::kF8E8M0FNU));
}

// --- PartitionSpecs over meshes of several axes ----------------------------

// {data: 2, fsdp: 2, tensor: 2}; dims[d]: the mesh axes splitting dim d.
Sharding Mesh222(std::vector<std::vector<int32_t>> dims) {
  return Sharding::Mesh({2, 2, 2}, {"data", "fsdp", "tensor"}, std::move(dims));
}

TEST(MeshShardingTest, OneDimensionOverTheWholeMeshIsSplit) {
  EXPECT_EQ(Mesh222({{0, 1, 2}, {}}), Sharding::Split(0));
  EXPECT_EQ(Mesh222({{}, {}}), Sharding::Replicated());
  // Axes of size 1 split nothing.
  EXPECT_EQ(Sharding::Mesh({4, 1}, {"x", "y"}, {{1}, {0}}), Sharding::Split(1));
  EXPECT_TRUE(Mesh222({{1, 0, 2}, {}}).is_mesh());  // another order
  EXPECT_TRUE(Mesh222({{0}, {}}).is_mesh());
}

TEST(MeshShardingTest, NamesItsAxes) {
  EXPECT_EQ(Mesh222({{0, 1}, {}}).ToString(),
            "P(('data', 'fsdp'), None) over {data: 2, fsdp: 2, tensor: 2}");
}

TEST(MeshShardingTest, BlocksFollowJaxDeviceOrder) {
  // P(('fsdp', 'data'), 'tensor') on [8, 4]: dim 0 in 4 blocks numbered
  // fsdp * 2 + data, dim 1 in 2 blocks by tensor.
  ArgSpec arg{{DType::kF32, {8, 4}}, Mesh222({{1, 0}, {2}})};
  ASSERT_EQ(arg.Local(8)->shape, (Shape{2, 2}));
  for (int i = 0; i < 8; ++i) {
    const int data = i / 4, fsdp = (i / 2) % 2, tensor = i % 2;
    auto box = arg.BlockOf(8, i);
    ASSERT_TRUE(box.ok());
    EXPECT_EQ(box->start, (Shape{(fsdp * 2 + data) * 2, tensor * 2})) << i;
    EXPECT_EQ(box->extent, (Shape{2, 2}));
  }
}

TEST(MeshShardingTest, RefusesAMeshOfAnotherSizeAndUnevenSplits) {
  ArgSpec arg{{DType::kF32, {8, 3}}, Mesh222({{0}, {1}})};
  EXPECT_EQ(arg.Local(4).status().message(),
            "sharding P('data', 'fsdp') over {data: 2, fsdp: 2, tensor: 2} "
            "is over 8 devices, but the slice has 4");
  EXPECT_EQ(arg.Local(8).status().message(),
            "dimension 1 of float32[8, 3] (length 3) does not split evenly "
            "into 2 blocks of P('data', 'fsdp') over {data: 2, fsdp: 2, "
            "tensor: 2}");
  Sharding twice = Mesh222({{0}, {0}});
  EXPECT_FALSE(ValidateSharding(twice, 2).ok());
  EXPECT_FALSE(ValidateSharding(Mesh222({{0}}), 2).ok());
}

TEST(MeshShardingTest, RoundTripsThroughProto) {
  ArgSpec arg{{DType::kF32, {8, 4}}, Mesh222({{1, 0}, {2}})};
  auto back = FromProto(ToProto(arg));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, arg);
  EXPECT_EQ(back->sharding.axis_names, arg.sharding.axis_names);
  proto::ArgDef bad = ToProto(arg);
  bad.mutable_sharding()->mutable_dim_axes(1)->set_values(0, 7);
  EXPECT_FALSE(FromProto(bad).ok());
}

TEST(MeshShardingTest, RelayoutIsAnyButPartial) {
  TensorSpec t{DType::kF32, {8, 4}};
  EXPECT_TRUE(CanRelayout({t, Mesh222({{0}, {1}})}, {t, Sharding::Split(1)}));
  EXPECT_TRUE(
      CanRelayout({t, Sharding::Replicated()}, {t, Sharding::Split(0)}));
  EXPECT_FALSE(CanRelayout({t, Sharding::Partial()}, {t, Sharding::Split(0)}));
  EXPECT_FALSE(CanRelayout({t, Sharding::Split(0)},
                           {{DType::kF32, {8, 5}}, Sharding::Split(0)}));
}

TEST(CopyBoxTest, CopiesABoxRunByRun) {
  // src [4, 6] = 0..23; copy the [2, 3] box at (1, 2) to (0, 1) of [3, 5].
  std::vector<int32_t> src(24), dst(15, -1);
  for (int i = 0; i < 24; ++i) src[i] = i;
  ASSERT_TRUE(CopyBox(src.data(), 96, {4, 6}, {1, 2}, dst.data(), 60, {3, 5},
                      {0, 1}, {2, 3}, 4)
                  .ok());
  EXPECT_EQ(dst, (std::vector<int32_t>{-1, 8, 9, 10, -1, -1, 14, 15, 16, -1, -1,
                                       -1, -1, -1, -1}));
  // Whole inner rows merge into one run; scalars copy one element.
  std::vector<int32_t> whole(24, 0);
  ASSERT_TRUE(CopyBox(src.data(), 96, {4, 6}, {2, 0}, whole.data(), 96, {4, 6},
                      {0, 0}, {2, 6}, 4)
                  .ok());
  EXPECT_EQ(whole[0], 12);
  EXPECT_EQ(whole[11], 23);
  int32_t one = 5, out = 0;
  ASSERT_TRUE(CopyBox(&one, 4, {}, {}, &out, 4, {}, {}, {}, 4).ok());
  EXPECT_EQ(out, 5);
}

TEST(CopyBoxTest, RefusesOutOfRangeBoxesAndCopiesNothing) {
  std::vector<int32_t> src(24, 1), dst(15, 0);
  absl::Status s = CopyBox(src.data(), 96, {4, 6}, {3, 0}, dst.data(), 60,
                           {3, 5}, {0, 0}, {2, 3}, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(dst, std::vector<int32_t>(15, 0));
  EXPECT_FALSE(CopyBox(src.data(), 90, {4, 6}, {0, 0}, dst.data(), 60, {3, 5},
                       {0, 0}, {1, 1}, 4)
                   .ok());
}

}  // namespace
}  // namespace plexus
