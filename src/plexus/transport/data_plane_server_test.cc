// The data plane's robustness: bad peers, shutdown, addresses.
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/frame_poller.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/handshake.h"
#include "plexus/transport/internal/socket_io.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using test_support::Client;
using test_support::Filled;
using test_support::kDeadline;
using test_support::MapHandler;
using test_support::Pattern;
using test_support::SameBytes;
using test_support::UniqueUnixName;

// Sends `bytes` on a raw connection and waits (with a deadline) for the
// server to close it, reading what it sends meanwhile (its CHALLENGE, an
// ERROR) into `*heard` when given.
bool ServerClosesAfter(internal::UniqueFd fd, const std::string& bytes,
                       std::string* heard = nullptr) {
  if (send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
    return true;  // already closed
  }
  timeval timeout{static_cast<time_t>(absl::ToInt64Seconds(kDeadline)), 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buffer[4096];
  while (true) {
    ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (heard != nullptr) heard->append(buffer, n);
      continue;
    }
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }
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
  // Past the cap, a connection is closed before its handshake: Connect
  // fails.
  EXPECT_FALSE(
      DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr).ok());
  held.pop_back();  // one leaves: a new one is served
  // The server notices the departure on its own thread: a connection that
  // arrives first is still past the cap (its handshake fails), and is
  // retried (bounded in time).
  absl::Status waited;
  const absl::Time deadline = absl::Now() + kDeadline;
  do {
    auto c =
        DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
    waited = c.ok() ? (*c)->Wait({10, 0}) : c.status();
  } while (!waited.ok() && absl::Now() < deadline);
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

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

TEST(DataPlaneHandshakeTest, AConnectionThatCannotProveItsCredentialIsRefused) {
  MapHandler handler;
  handler.RequireCredential(Filled(7));
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  for (const std::string& unix_path : {std::string(), options.unix_name}) {
    auto intruder = DataPlaneConnection::Connect(
        (*server)->tcp_address(), unix_path, nullptr, Client(3, Filled(8)));
    ASSERT_FALSE(intruder.ok());
    EXPECT_EQ(intruder.status().code(), absl::StatusCode::kPermissionDenied)
        << intruder.status();
    EXPECT_NE(intruder.status().message().find("proof does not match"),
              std::string::npos)
        << intruder.status();
  }
  EXPECT_EQ(handler.admissions(), 0);  // nothing was done for it
  auto owner = DataPlaneConnection::Connect((*server)->tcp_address(), "",
                                            nullptr, Client(3, Filled(7)));
  ASSERT_TRUE(owner.ok()) << owner.status();
  std::shared_ptr<Storage> data = Pattern(300 << 10, 1);
  EXPECT_TRUE((*owner)->Put({3, 0}, *data).ok());
  auto back = (*owner)->Fetch({3, 0});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(**back, *data));
}

TEST(DataPlaneHandshakeTest, ARawConnectionThatSkipsTheHandshakeIsRefused) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  internal::FrameHeader fetch;
  fetch.type = static_cast<uint16_t>(internal::FrameType::kFetch);
  for (bool unix_socket : {false, true}) {
    auto fd = unix_socket ? internal::ConnectUnix(options.unix_name)
                          : internal::ConnectTcp((*server)->tcp_address());
    ASSERT_TRUE(fd.ok()) << fd.status();
    std::string heard;
    EXPECT_TRUE(ServerClosesAfter(*std::move(fd), Bytes(&fetch, sizeof(fetch)),
                                  &heard));
    // The challenge, then an ERROR that says what was expected.
    ASSERT_GE(heard.size(), 2 * sizeof(internal::FrameHeader) + 32);
    internal::FrameHeader first, second;
    std::memcpy(&first, heard.data(), sizeof(first));
    std::memcpy(&second, heard.data() + sizeof(first) + 32, sizeof(second));
    EXPECT_EQ(first.frame_type(), internal::FrameType::kChallenge);
    EXPECT_EQ(second.frame_type(), internal::FrameType::kError);
    EXPECT_EQ(second.status_code,
              static_cast<int32_t>(absl::StatusCode::kPermissionDenied));
    EXPECT_NE(heard.find("expected HELLO, got FETCH"), std::string::npos);
  }
  EXPECT_EQ(handler.admissions(), 0);
}

TEST(DataPlaneHandshakeTest, AFloodWithoutACredentialTakesNoSlotOfAProvenPeer) {
  // Anyone may connect: 60 connections that never finish their handshake
  // (the cap on proven peers is 8) took every slot, and a client's
  // connection was then closed unserved.
  MapHandler handler;
  DataPlaneServerOptions options;
  options.max_connections = 8;
  options.max_handshaking = 4;
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<internal::UniqueFd> flood;
  for (int i = 0; i < 60; ++i) {
    auto fd = internal::ConnectTcp((*server)->tcp_address());
    ASSERT_TRUE(fd.ok()) << fd.status();
    flood.push_back(*std::move(fd));
  }
  auto client =
      DataPlaneConnection::Connect((*server)->tcp_address(), "", nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  std::shared_ptr<Storage> data = Pattern(256, 7);
  ASSERT_TRUE((*client)->Put({20, 0}, *data).ok());
  EXPECT_TRUE((*client)->Wait({20, 0}).ok());
  // The flood was pushed out, oldest first: the first connection sees the
  // end of its stream.
  EXPECT_TRUE(ServerClosesAfter(std::move(flood.front()), ""));
}

TEST(DataPlaneHandshakeTest, AHandshakeDribbledAByteAtATimeEndsAtItsDeadline) {
  // Every read made progress within the frame timeout, so a HELLO sent a
  // byte every 40 ms kept its connection (and thread) for as long as it
  // lasted; the handshake as a whole now has a deadline.
  MapHandler handler;
  DataPlaneServerOptions options;
  options.handshake_timeout = absl::Milliseconds(300);
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto fd = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(fd.ok()) << fd.status();
  internal::FrameHeader hello;
  hello.type = static_cast<uint16_t>(internal::FrameType::kHello);
  hello.shard = 1;
  hello.payload_bytes = 64;
  const std::string bytes =
      Bytes(&hello, sizeof(hello)) + std::string(64, 'x');  // 128 bytes, 5 s
  size_t sent = 0;
  bool closed = false;
  char buffer[256];
  while (sent < bytes.size() && !closed) {
    if (send(fd->get(), bytes.data() + sent, 1, MSG_NOSIGNAL) != 1) break;
    ++sent;
    pollfd p{fd->get(), POLLIN, 0};
    if (poll(&p, 1, 40) > 0) {
      const ssize_t n = recv(fd->get(), buffer, sizeof(buffer), 0);
      closed = n == 0 || (n < 0 && errno == ECONNRESET);
    }
  }
  EXPECT_LT(sent, bytes.size()) << "the handshake outlived its deadline";
}

TEST(DataPlaneHandshakeTest, AConnectionThatNeverSaysHelloIsClosedInTime) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.frame_timeout = absl::Milliseconds(200);
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto fd = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(fd.ok());
  // It reads the challenge and then says nothing: the worker's thread for
  // it is not held beyond the frame timeout.
  const absl::Time start = absl::Now();
  std::string heard;
  EXPECT_TRUE(ServerClosesAfter(*std::move(fd), "", &heard));
  EXPECT_LT(absl::Now() - start, kDeadline / 2);
  ASSERT_GE(heard.size(), sizeof(internal::FrameHeader));
  internal::FrameHeader first;
  std::memcpy(&first, heard.data(), sizeof(first));
  EXPECT_EQ(first.frame_type(), internal::FrameType::kChallenge);
}

TEST(DataPlaneHandshakeTest, ConnectingToAWorkerThatNeverAnswersCanBeGivenUp) {
  // A listener that never accepts, as a SIGSTOPped worker's: the kernel
  // completes the TCP connection, but no challenge ever comes.
  std::string address;
  auto listener = internal::ListenTcp("127.0.0.1", &address);
  ASSERT_TRUE(listener.ok());
  // The server's report that the worker is down comes while the connect
  // already waits: the first check says "not yet", every later one "down".
  std::atomic<int> checks{0};
  const absl::Time start = absl::Now();
  auto conn =
      DataPlaneConnection::Connect(address, "", nullptr, Client(1, Filled(1)),
                                   [&] { return checks.fetch_add(1) > 0; });
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(checks.load(), 2);
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kCancelled)
      << conn.status();
  EXPECT_LT(took, absl::Seconds(2)) << "not given up at once";
}

// A TCP relay between a connector and the server that records every byte
// in both directions: what a sniffer on the path would see.
class RecordingRelay {
 public:
  explicit RecordingRelay(const std::string& target) : target_(target) {
    auto listener = internal::ListenTcp("127.0.0.1", &address_);
    EXPECT_TRUE(listener.ok());
    listener_ = *std::move(listener);
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingRelay() { thread_.join(); }
  const std::string& address() const { return address_; }
  // Both directions, once the connector has closed.
  std::string Recorded() {
    thread_.join();
    thread_ = std::thread([] {});
    return to_server_ + to_client_;
  }
  const std::string& to_server() const { return to_server_; }

 private:
  void Run() {
    auto in = internal::Accept(listener_.get());
    auto out = internal::ConnectTcp(target_);
    if (!in.ok() || !out.ok()) return;
    pollfd fds[2] = {{in->get(), POLLIN, 0}, {out->get(), POLLIN, 0}};
    char buffer[1 << 16];
    const absl::Time deadline = absl::Now() + kDeadline;
    while (absl::Now() < deadline) {
      if (poll(fds, 2, 100) < 0) return;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = recv(fds[i].fd, buffer, sizeof(buffer), 0);
        if (n <= 0) return;  // either side closed: the session is over
        (i == 0 ? to_server_ : to_client_).append(buffer, n);
        send(fds[1 - i].fd, buffer, n, MSG_NOSIGNAL);
      }
    }
  }

  std::string target_;
  std::string address_;
  internal::UniqueFd listener_;
  std::string to_server_;
  std::string to_client_;
  std::thread thread_;
};

TEST(DataPlaneHandshakeTest, ASnifferLearnsNothingItCanReplay) {
  MapHandler handler;
  const Credential secret_credential = Filled(0x5c);
  handler.RequireCredential(secret_credential);
  auto server = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  RecordingRelay relay((*server)->tcp_address());
  {
    auto conn = DataPlaneConnection::Connect(relay.address(), "", nullptr,
                                             Client(4, secret_credential));
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE((*conn)->Put({4, 0}, *Pattern(4096, 2)).ok());
  }
  const std::string seen = relay.Recorded();
  EXPECT_EQ(seen.find(Bytes(secret_credential.data(), kCredentialSize)),
            std::string::npos)
      << "the credential crossed the wire";
  EXPECT_EQ(handler.admissions(), 1);
  // Replaying the connector's bytes on a new connection opens nothing: the
  // server's nonce is new, so the old proof does not match.
  auto fd = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(fd.ok());
  std::string heard;
  EXPECT_TRUE(ServerClosesAfter(*std::move(fd), relay.to_server(), &heard));
  EXPECT_NE(heard.find("proof does not match"), std::string::npos);
  EXPECT_EQ(handler.admissions(), 1);
}

TEST(DataPlaneHandshakeTest, AnAcceptorThatCannotProveTheCredentialIsLeft) {
  // A listener that speaks the handshake but does not know the credential:
  // it answers every HELLO with a made-up proof.
  std::string address;
  auto listener = internal::ListenTcp("127.0.0.1", &address);
  ASSERT_TRUE(listener.ok());
  std::thread impostor([&] {
    auto fd = internal::Accept(listener->get());
    if (!fd.ok()) return;
    internal::FrameSocket socket(*std::move(fd), /*is_unix=*/false);
    internal::FrameHeader challenge;
    challenge.type = static_cast<uint16_t>(internal::FrameType::kChallenge);
    socket.SendFrame(challenge, std::string(32, 'n')).IgnoreError();
    bool eof = false;
    auto hello = socket.ReadHeader(&eof);
    if (!hello.ok()) return;
    socket.ReadMessage(*hello).IgnoreError();
    internal::FrameHeader welcome;
    welcome.type = static_cast<uint16_t>(internal::FrameType::kWelcome);
    socket.SendFrame(welcome, std::string(32, 'p')).IgnoreError();
    socket.ReadHeader(&eof).IgnoreError();  // until the connector leaves
  });
  auto conn =
      DataPlaneConnection::Connect(address, "", nullptr, Client(1, Filled(1)));
  impostor.join();
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(conn.status().message().find("could not prove"), std::string::npos)
      << conn.status();
}

}  // namespace
}  // namespace plexus::transport

namespace plexus::transport {
namespace {

DataPlaneIdentity ServerOf(uint64_t generation) {
  DataPlaneIdentity me;
  me.peer = {CredentialRole::kServer, 0};
  me.generation = generation;
  return me;
}

// The server's ops connection: each OPS frame reaches the handler whole,
// in the order sent, with the generation its connection stamps, over
// either carrier; its end is said once, with why.
TEST(DataPlaneOpsTest, OpsFramesArriveInOrderAndTheirConnectionsEndIsSaid) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> expected;
  std::vector<std::string> ended;
  size_t connections = 0;
  for (const std::string& unix_path : {std::string(), options.unix_name}) {
    const uint64_t generation = unix_path.empty() ? 7 : 8;
    auto conn = DataPlaneConnection::Connect(
        (*server)->tcp_address(), unix_path, nullptr, ServerOf(generation));
    ASSERT_TRUE(conn.ok()) << conn.status();
    EXPECT_EQ((*conn)->uses_shared_memory(), !unix_path.empty());
    const std::string big(3 << 20, 'z');  // more than one socket buffer
    for (const std::string& m : {std::string("a"), big, std::string("c")}) {
      ASSERT_TRUE((*conn)->SendOps(m).ok());
      expected.push_back(absl::StrCat(generation, ":", m));
    }
    conn->reset();  // the server closes it
    // Each connection has a thread: the next one's frames wait until this
    // one's are all in (its end said), so the order is the test's.
    ++connections;
    EXPECT_EQ(handler.WaitForOps(expected.size(), connections, &ended),
              expected);
  }
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].rfind("7:UNAVAILABLE", 0), 0u) << ended[0];
  EXPECT_EQ(ended[1].rfind("8:UNAVAILABLE", 0), 0u) << ended[1];
}

// An op the handler refuses closes the connection (the server's next write
// fails and it ends the worker's session), saying why; so does a frame
// of another generation than the connection's first.
TEST(DataPlaneOpsTest, ARefusedOpOrAnotherGenerationClosesTheConnection) {
  MapHandler handler;
  auto server = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto conn = DataPlaneConnection::Connect((*server)->tcp_address(), "",
                                           nullptr, ServerOf(5));
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->SendOps("fail").ok());
  std::vector<std::string> ended;
  handler.WaitForOps(1, 1, &ended);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_NE(ended[0].find("told to fail"), std::string::npos) << ended[0];

  auto raw = internal::ConnectTcp((*server)->tcp_address());
  ASSERT_TRUE(raw.ok()) << raw.status();
  internal::FrameSocket socket(*std::move(raw), false);
  ASSERT_TRUE(internal::ConnectHandshake(socket, ServerOf(5)).ok());
  socket.set_generation(5);
  ASSERT_TRUE(socket.SendOps("one").ok());
  socket.set_generation(6);
  ASSERT_TRUE(socket.SendOps("two").ok());
  bool eof = false;
  EXPECT_FALSE(socket.ReadHeader(&eof).ok());  // closed by the server
  std::vector<std::string> ops = handler.WaitForOps(2, 2, &ended);
  EXPECT_EQ(ops.back(), "5:one");
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_NE(ended[1].find("OPS of generation 6 on a connection that carried "
                          "generation 5's"),
            std::string::npos)
      << ended[1];
}

// A handler that takes each ops connection after its first frame reads
// the rest on its own poller (as the simulated hosts do); the end is then
// its poller's to say.
class TakingHandler : public MapHandler {
 public:
  TakingHandler() {
    auto poller =
        FramePoller::Start(PolledFrames::kOps, "test-taken", "the server");
    EXPECT_TRUE(poller.ok()) << poller.status();
    if (poller.ok()) poller_ = *std::move(poller);
  }
  bool TakeOpsConnection(const DataPlanePeer&, uint64_t generation,
                         int fd) override {
    const int mine = ::dup(fd);
    auto frame = [this, generation](std::string& message) {
      absl::MutexLock lock(&taken_mu_);
      taken_.push_back(absl::StrCat(generation, ":", message));
      return absl::OkStatus();
    };
    auto end = [this, generation](const absl::Status& why) {
      absl::MutexLock lock(&taken_mu_);
      taken_ended_.push_back(absl::StrCat(generation, ":", why.message()));
    };
    return mine >= 0 &&
           poller_->Add(static_cast<int64_t>(generation), mine, frame, end)
               .ok();
  }
  // The frames its poller read, once there are `n` and `ends` ends.
  std::vector<std::string> WaitForTaken(size_t n, size_t ends,
                                        std::vector<std::string>* ended) {
    absl::MutexLock lock(&taken_mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(taken_mu_) {
      return taken_.size() >= n && taken_ended_.size() >= ends;
    };
    taken_mu_.AwaitWithTimeout(absl::Condition(&done), kDeadline);
    *ended = taken_ended_;
    return taken_;
  }

 private:
  std::unique_ptr<FramePoller> poller_;
  absl::Mutex taken_mu_;
  std::vector<std::string> taken_ ABSL_GUARDED_BY(taken_mu_);
  std::vector<std::string> taken_ended_ ABSL_GUARDED_BY(taken_mu_);
};

// The first OPS frame is applied by the connection's thread; the handler
// takes the connection then, and every later frame, in order, and the
// connection's end reach its reader only: the data plane says no OpsEnded
// for it. Over either carrier.
TEST(DataPlaneOpsTest, AHandlerThatTakesTheConnectionReadsItsLaterFrames) {
  TakingHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> first, later, ended;
  for (const std::string& unix_path : {std::string(), options.unix_name}) {
    const uint64_t generation = unix_path.empty() ? 3 : 4;
    auto conn = DataPlaneConnection::Connect(
        (*server)->tcp_address(), unix_path, nullptr, ServerOf(generation));
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE((*conn)->SendOps("first").ok());
    first.push_back(absl::StrCat(generation, ":first"));
    // Applied before the next is sent: nothing was read past it.
    ASSERT_EQ(handler.WaitForOps(first.size(), 0, &ended), first);
    const std::string big(3 << 20, 'z');  // more than one socket buffer
    for (const std::string& m : {std::string("second"), big}) {
      ASSERT_TRUE((*conn)->SendOps(m).ok());
      later.push_back(absl::StrCat(generation, ":", m));
    }
    conn->reset();
    std::vector<std::string> taken_ended;
    EXPECT_EQ(handler.WaitForTaken(later.size(), first.size(), &taken_ended),
              later);
    ASSERT_EQ(taken_ended.size(), first.size());
    EXPECT_EQ(taken_ended.back(),
              absl::StrCat(generation, ":the server closed it"));
  }
  EXPECT_EQ(handler.WaitForOps(first.size(), 0, &ended), first);
  EXPECT_TRUE(ended.empty()) << ended[0];
}

}  // namespace
}  // namespace plexus::transport
