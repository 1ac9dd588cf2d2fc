#include "plexus/common/types.h"

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

}  // namespace
}  // namespace plexus
