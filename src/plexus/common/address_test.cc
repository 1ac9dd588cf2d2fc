#include "plexus/common/address.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(AddressTest, TheHostOfAnAddress) {
  EXPECT_EQ(HostOfAddress("10.0.0.1:50051"), "10.0.0.1");
  EXPECT_EQ(HostOfAddress("[::1]:7"), "::1");
  EXPECT_EQ(HostOfAddress("localhost:0"), "localhost");
  EXPECT_EQ(HostOfAddress("::1"), "::1");
  EXPECT_EQ(HostOfAddress("host"), "host");
}

TEST(AddressTest, OnlyThisMachinesOwnAddressesAreLoopback) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "", "10.0.0.1", "192.168.1.1",
                           "example.com", "128.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(AddressTest, AListOfServersIsOneTargetThatTriesThemInOrder) {
  EXPECT_EQ(*ServerTarget("10.0.0.1:7070"), "10.0.0.1:7070");
  EXPECT_EQ(*ServerTarget("dns:///plexus:7070"), "dns:///plexus:7070");
  EXPECT_EQ(*ServerTarget("127.0.0.1:1, 127.0.0.1:2"),
            "ipv4:127.0.0.1:1,127.0.0.1:2");
  EXPECT_EQ(*ServerTarget("[::1]:1,[::1]:2"), "ipv6:[::1]:1,[::1]:2");
  for (const char* bad : {"10.0.0.1,10.0.0.2:1", "10.0.0.1:1,[::1]:2",
                          "10.0.0.1:1,", "plexus-server-a.invalid:1,b:2"}) {
    absl::StatusOr<std::string> t = ServerTarget(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ServerTarget("10.0.0.1:1,10.0.0.2")
                .status()
                .message()
                .find("'10.0.0.2' has no port"),
            std::string::npos);
  EXPECT_NE(ServerTarget("no-such-server.invalid:1,10.0.0.2:1")
                .status()
                .message()
                .find("'no-such-server.invalid:1' does not resolve"),
            std::string::npos);
}

// A list of names (one Kubernetes Service per server): each is resolved
// once, to its IPv4 address if it has one; the list's TLS name is its
// first entry as written.
TEST(AddressTest, AListOfNamesIsResolvedAndCheckedAgainstItsFirstName) {
  EXPECT_EQ(*ServerTarget("localhost:7070,127.0.0.2:7071"),
            "ipv4:127.0.0.1:7070,127.0.0.2:7071");
  EXPECT_EQ(ServerListAuthority(" localhost:7070 ,127.0.0.2:7071"),
            "localhost:7070");
  EXPECT_EQ(ServerListAuthority("localhost:7070"), "");
}

TEST(AddressTest, AServerListIsRetriedOftenEnoughToFindItsStandbyAtOnce) {
  EXPECT_EQ(RetryCapFor("10.0.0.1:1", absl::Seconds(5)), absl::Seconds(5));
  EXPECT_EQ(RetryCapFor("10.0.0.1:1,10.0.0.2:1", absl::Seconds(5)),
            kServerListRetryCap);
  EXPECT_EQ(RetryCapFor("10.0.0.1:1,10.0.0.2:1", absl::Milliseconds(100)),
            absl::Milliseconds(100));
}

}  // namespace
}  // namespace plexus
