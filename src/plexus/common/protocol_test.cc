#include "plexus/common/protocol.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

using ::testing::HasSubstr;

TEST(ProtocolTest, TheSameVersionIsAccepted) {
  EXPECT_TRUE(CheckProtocolVersion("server", "worker", kProtocolVersion).ok());
}

TEST(ProtocolTest, AMismatchNamesBothVersions) {
  absl::Status s =
      CheckProtocolVersion("server", "worker", kProtocolVersion + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("the worker speaks protocol version ",
                                     kProtocolVersion + 1)));
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("this server speaks protocol version ",
                                     kProtocolVersion)));
}

TEST(ProtocolTest, APeerWithoutAVersionIsRefused) {
  absl::Status s = CheckProtocolVersion("server", "client", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("the client speaks no protocol version"));
}

}  // namespace
}  // namespace plexus
