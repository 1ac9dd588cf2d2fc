#include "plexus/common/status_proto.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(StatusProtoTest, EveryCodeAndItsMessageSurviveTheRoundTrip) {
  for (int code = 1; code <= 16; ++code) {
    absl::Status sent(static_cast<absl::StatusCode>(code),
                      "slice 3 lost a host: worker 2 [host1, pid 7]");
    proto::Status wire;
    ASSERT_TRUE(wire.ParseFromString(
        StatusToProto(sent).SerializeAsString()));  // as between processes
    EXPECT_EQ(StatusFromProto(wire), sent) << sent;
  }
}

TEST(StatusProtoTest, TheCodesUsersSeeAreKept) {
  // The errors issue 8 found reaching Python with the wrong class.
  EXPECT_TRUE(absl::IsUnavailable(StatusFromProto(
      StatusToProto(absl::UnavailableError("slice 1 lost a host")))));
  EXPECT_TRUE(absl::IsInvalidArgument(StatusFromProto(StatusToProto(
      absl::InvalidArgumentError("a slice needs at least 1 device")))));
  EXPECT_TRUE(absl::IsResourceExhausted(StatusFromProto(
      StatusToProto(absl::ResourceExhaustedError("4 live devices")))));
}

TEST(StatusProtoTest, OkTravelsAsOk) {
  EXPECT_TRUE(StatusFromProto(StatusToProto(absl::OkStatus())).ok());
  EXPECT_TRUE(StatusFromProto(proto::Status()).ok());
}

TEST(StatusProtoTest, AnErrorIsNeverReadAsSuccess) {
  proto::Status no_code;  // a sender that set the message only
  no_code.set_message("worker 2 is down");
  EXPECT_EQ(StatusFromProto(no_code), absl::UnknownError("worker 2 is down"));

  proto::Status unknown_code;  // from a newer sender, or corrupted
  unknown_code.set_code(99);
  unknown_code.set_message("what happened");
  EXPECT_EQ(StatusFromProto(unknown_code), absl::UnknownError("what happened"));
  unknown_code.set_code(-1);
  EXPECT_EQ(StatusFromProto(unknown_code), absl::UnknownError("what happened"));
}

}  // namespace
}  // namespace plexus
