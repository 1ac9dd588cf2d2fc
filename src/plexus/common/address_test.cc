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

}  // namespace
}  // namespace plexus
