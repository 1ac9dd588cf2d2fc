// The data plane's robustness: bad peers, shutdown, addresses.
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/socket_io.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using test_support::kDeadline;
using test_support::MapHandler;
using test_support::Pattern;
using test_support::SameBytes;
using test_support::UniqueUnixName;

// Sends `bytes` on a raw connection and waits (with a deadline) for the
// server to close it.
bool ServerClosesAfter(internal::UniqueFd fd, const std::string& bytes) {
  if (send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
    return true;  // already closed
  }
  timeval timeout{static_cast<time_t>(absl::ToInt64Seconds(kDeadline)), 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char c;
  ssize_t n = recv(fd.get(), &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

std::string Header(uint32_t magic, internal::FrameType type, uint16_t flags,
                   uint64_t payload_bytes) {
  internal::FrameHeader h;
  h.magic = magic;
  h.type = static_cast<uint16_t>(type);
  h.flags = flags;
  h.payload_bytes = payload_bytes;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

TEST(DataPlaneServerTest, MalformedFramesCloseOnlyTheirConnection) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  using internal::FrameType;
  const uint32_t magic = internal::kFrameMagic;
  const std::vector<std::string> garbage = {
      std::string(64, 'x'),
      Header(magic, FrameType::kPush, 0, uint64_t{1} << 40),  // 1 TiB
      Header(magic, static_cast<FrameType>(42), 0, 0),
      Header(magic, FrameType::kPut, internal::kFlagFd, 16),  // fd over TCP
      Header(magic, FrameType::kData, 0, 0),  // a reply sent to the server
  };
  for (const std::string& bytes : garbage) {
    auto fd = internal::ConnectTcp((*server)->tcp_address());
    ASSERT_TRUE(fd.ok()) << fd.status();
    EXPECT_TRUE(ServerClosesAfter(*std::move(fd), bytes));
  }
  // A descriptor flag with no descriptor, on the unix socket.
  auto fd = internal::ConnectUnix((*server)->unix_path());
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(ServerClosesAfter(
      *std::move(fd), Header(magic, FrameType::kPut, internal::kFlagFd, 16)));

  auto conn =
      DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  std::shared_ptr<Storage> data = Pattern(1000, 9);
  ASSERT_TRUE((*conn)->Put({1, 0}, *data).ok());
  auto fetched = (*conn)->Fetch({1, 0});
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(SameBytes(**fetched, *data));
}

TEST(DataPlaneServerTest, DestructionWithIdleConnectionsIsPromptAndSafe) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<DataPlaneConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    auto c = DataPlaneConnection::Connect(
        (*server)->tcp_address(), i % 2 ? (*server)->unix_path() : "", nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Put({static_cast<uint64_t>(i), 0}, *Pattern(64, i)).ok());
    idle.push_back(*std::move(c));
  }
  absl::Time start = absl::Now();
  server->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // The peer is gone: calls fail with an error, never a signal.
  std::shared_ptr<Storage> big = Pattern(16 << 20, 0);
  for (auto& c : idle) {
    absl::Status s = c->Put({99, 0}, *big);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_FALSE(c->Wait({99, 0}).ok());
  }
}

TEST(DataPlaneServerTest, ReportsItsAddressesAndRejectsATakenUnixName) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->tcp_address().rfind("127.0.0.1:", 0), 0u);
  EXPECT_NE((*server)->tcp_address(), "127.0.0.1:0");
  EXPECT_EQ((*server)->unix_path(), options.unix_name);

  auto second = DataPlaneServer::Start(options, &handler, nullptr);
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(options.unix_name),
            std::string::npos);

  options.unix_name.clear();
  auto tcp_only = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(tcp_only.ok());
  EXPECT_EQ((*tcp_only)->unix_path(), "");
}

TEST(DataPlaneConnectionTest, ConnectToNothingFailsWithAClearError) {
  auto c = DataPlaneConnection::Connect("", UniqueUnixName(), nullptr);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos)
      << c.status();
  auto bad = DataPlaneConnection::Connect("no-port", "", nullptr);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataPlaneServerTest, AnotherProtocolVersionIsRefused) {
  MapHandler handler;
  auto server = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  internal::FrameHeader h;
  h.type = static_cast<uint16_t>(internal::FrameType::kWait);
  h.version = 1;
  auto fd = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(fd.ok());
  EXPECT_TRUE(ServerClosesAfter(
      *std::move(fd), std::string(reinterpret_cast<const char*>(&h), 64)));
  h.version = internal::kFrameVersion;
  h.reserved1 = 7;  // a field a later version may use
  fd = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(fd.ok());
  EXPECT_TRUE(ServerClosesAfter(
      *std::move(fd), std::string(reinterpret_cast<const char*>(&h), 64)));
}

TEST(DataPlaneServerTest, AStalledFrameIsDroppedButAnIdleConnectionIsNot) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.frame_timeout = absl::Milliseconds(100);
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  // Opened first, then idle while the stalled frame below times out.
  auto idle =
      DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
  ASSERT_TRUE(idle.ok());
  // Half a header, then nothing: closed once the frame timeout passes.
  auto stalled = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(stalled.ok());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(ServerClosesAfter(*std::move(stalled), std::string(20, '\0')));
  EXPECT_GE(absl::Now() - start, options.frame_timeout);
  // The idle connection waited longer than the frame timeout between
  // frames, and still serves.
  std::shared_ptr<Storage> data = Pattern(1024, 3);
  ASSERT_TRUE((*idle)->Put({5, 0}, *data).ok());
  EXPECT_TRUE((*idle)->Wait({5, 0}).ok());
}

TEST(DataPlaneServerTest, ConnectionsPastTheCapAreClosed) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.max_connections = 2;
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<DataPlaneConnection>> held;
  for (int i = 0; i < 2; ++i) {
    auto c =
        DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
    ASSERT_TRUE(c.ok());
    std::shared_ptr<Storage> data = Pattern(64, i);
    ASSERT_TRUE((*c)->Put({10, i}, *data).ok());  // served: a thread each
    held.push_back(*std::move(c));
  }
  auto third = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(third.ok());
  internal::FrameHeader h;
  h.type = static_cast<uint16_t>(internal::FrameType::kWait);
  EXPECT_TRUE(ServerClosesAfter(
      *std::move(third), std::string(reinterpret_cast<const char*>(&h), 64)));
  held.pop_back();  // one leaves: a new one is served
  auto c = DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
  ASSERT_TRUE(c.ok());
  absl::Status waited = (*c)->Wait({10, 0});
  // The server notices the departure on its own thread: a connection that
  // arrives first is still past the cap, and is retried (bounded in time).
  const absl::Time deadline = absl::Now() + kDeadline;
  while (!waited.ok() && absl::Now() < deadline) {
    c = DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
    ASSERT_TRUE(c.ok());
    waited = (*c)->Wait({10, 0});
  }
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(SocketIoTest, ATcpConnectThatGetsNoAnswerEndsAtItsTimeout) {
  // A listener that never accepts, its backlog full: the kernel drops
  // further SYNs, as a host that silently drops packets would.
  std::string address;
  auto listener = internal::ListenTcp("127.0.0.1", &address);
  ASSERT_TRUE(listener.ok());
  ASSERT_EQ(listen(listener->get(), 0), 0);
  std::vector<internal::UniqueFd> queued;
  absl::Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    auto fd = internal::ConnectTcp(address, absl::Milliseconds(200));
    if (fd.ok()) {
      queued.push_back(*std::move(fd));
    } else {
      refused = fd.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "the backlog never filled";
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("no answer within 200ms"), std::string::npos)
      << refused;
}

TEST(DataPlaneServerTest, ARequestWithoutTheRightCredentialIsRefusedInStep) {
  MapHandler handler;
  DataPlaneCredential right;
  right.fill(7);
  handler.RequireCredential(right);
  auto server = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  DataPlaneCredential wrong;
  wrong.fill(8);
  auto intruder = DataPlaneConnection::Connect((*server)->tcp_address(), "",
                                               nullptr, wrong);
  ASSERT_TRUE(intruder.ok());
  std::shared_ptr<Storage> data = Pattern(300 << 10, 1);
  absl::Status put = (*intruder)->Put({3, 0}, *data);
  EXPECT_EQ(put.code(), absl::StatusCode::kPermissionDenied) << put;
  EXPECT_EQ((*intruder)->Wait({3, 0}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*intruder)->healthy());  // refused, and still in step
  EXPECT_EQ(handler.admissions(), 0);   // nothing was done for it
  auto owner = DataPlaneConnection::Connect((*server)->tcp_address(), "",
                                            nullptr, right);
  ASSERT_TRUE(owner.ok());
  EXPECT_TRUE((*owner)->Put({3, 0}, *data).ok());
  auto back = (*owner)->Fetch({3, 0});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(**back, *data));
}

}  // namespace
}  // namespace plexus::transport
