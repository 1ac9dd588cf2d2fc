#include "plexus/common/donation.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

ArgSpec F32(Shape shape) { return {{DType::kF32, std::move(shape)}, {}}; }

proto::ProgramDef Def(std::vector<int> in, std::vector<int> out) {
  proto::ProgramDef def;
  def.set_name("update");
  def.set_kernel("xla");
  for (int i : in) def.mutable_xla()->add_donated_inputs(i);
  for (int o : out) def.mutable_xla()->add_donated_outputs(o);
  return def;
}

TEST(DonationTest, PairsOfOneLayoutAreTheDonatedInputs) {
  const std::vector<ArgSpec> inputs = {F32({4}), F32({2, 2}), F32({4})};
  const std::vector<ArgSpec> outputs = {F32({2, 2}), F32({4})};
  auto none = DonatedInputs(Def({}, {}), inputs, outputs);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto two = DonatedInputs(Def({2, 1}, {1, 0}), inputs, outputs);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<int>{2, 1}));
}

TEST(DonationTest, BadDeclarationsNameTheProgramAndWhat) {
  const std::vector<ArgSpec> inputs = {F32({4}), F32({4})};
  const std::vector<ArgSpec> outputs = {F32({4}), F32({8})};
  struct Case {
    std::vector<int> in, out;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{0}, {}, "1 donated inputs but 0 outputs"},
           {{2}, {0}, "input 2 does not exist (2 inputs)"},
           {{-1}, {0}, "input -1 does not exist"},
           {{0}, {5}, "output 5 does not exist (2 outputs)"},
           {{0, 0}, {0, 0}, "is named twice"},
           {{0, 1}, {0, 0}, "output 0 is named twice"},
           {{0}, {1}, "input 0 is float32[4]"},
       }) {
    auto got = DonatedInputs(Def(c.in, c.out), inputs, outputs);
    ASSERT_FALSE(got.ok()) << c.says;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("program 'update': donation: "),
              std::string::npos)
        << got.status();
    EXPECT_NE(got.status().message().find(c.says), std::string::npos)
        << got.status();
  }
}

}  // namespace
}  // namespace plexus
