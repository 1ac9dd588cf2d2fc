#include "plexus/common/names.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(NamesTest, ANameUpToTheBoundIsTaken) {
  EXPECT_TRUE(CheckName("client name", "trainer-7").ok());
  EXPECT_TRUE(CheckName("client name", "").ok());
  EXPECT_TRUE(CheckName("client name", std::string(kMaxNameBytes, 'a')).ok());
  EXPECT_TRUE(CheckName("program name", "Ünïcode ok").ok());
}

TEST(NamesTest, ALongNameIsRefusedWithoutBeingEchoed) {
  const std::string name(6 << 20, 'x');
  absl::Status s = CheckName("client name", name);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("a client name is at most 256 bytes; "
                                     "this one is 6291456"));
  EXPECT_LT(s.message().size(), 300u);
}

TEST(NamesTest, AControlCharacterIsRefused) {
  absl::Status s = CheckName("program name", "a\nfake log line");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("byte 10"));
  EXPECT_THAT(s.message(), Not(HasSubstr("\n")));
}

TEST(NamesTest, AbbreviatedKeepsShortTextAndCutsLongText) {
  EXPECT_EQ(Abbreviated("short"), "short");
  EXPECT_EQ(Abbreviated(std::string(100, 'y')),
            std::string(64, 'y') + "... (100 bytes)");
}

}  // namespace
}  // namespace plexus
