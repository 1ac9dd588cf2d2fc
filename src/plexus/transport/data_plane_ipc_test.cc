// PUSH_IPC, the frame that moves a shard by CUDA IPC between two workers of
// one host: its payload's encoding, the capability a worker offers in its
// handshake, and how a server answers it (stored, declined, refused, a
// malformed frame). No CUDA is needed: the handler stands in for the worker
// that maps and copies the value.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/handshake.h"
#include "plexus/transport/internal/socket_io.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using internal::DecodeIpc;
using internal::EncodeIpc;
using internal::FrameType;
using internal::IpcPayload;
using test_support::kDeadline;
using test_support::MapHandler;
using test_support::Pattern;
using test_support::SameBytes;
using test_support::UniqueUnixName;

IpcShard Shard(uint64_t bytes) {
  IpcShard shard;
  for (size_t i = 0; i < shard.handle.size(); ++i) {
    shard.handle[i] = static_cast<char>(i * 7 + 1);
  }
  shard.offset = 4096;
  shard.bytes = bytes;
  shard.ordinal = 0;
  return shard;
}

// A shard exported as a POSIX fd: a memfd holding `text` stands in for the
// descriptor cuMemExportToShareableHandle gives (the transport only passes
// it on).
IpcShard FdShard(const std::string& text) {
  IpcShard shard;
  shard.kind = IpcShard::Kind::kPosixFd;
  const int fd = memfd_create("ipc_test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
  shard.fd = SharedFd(fd);
  shard.mapping_size = 128 << 20;
  shard.offset = 1 << 20;
  shard.bytes = 4096;
  shard.ordinal = 1;
  return shard;
}

// What the descriptor `fd` holds from its start (pread: its own offset is
// left alone), at most 256 bytes.
std::string Contents(int fd) {
  char buf[256];
  const ssize_t n = pread(fd, buf, sizeof(buf), 0);
  return n < 0 ? "<unreadable>" : std::string(buf, static_cast<size_t>(n));
}

// Descriptors open in this process (the server runs in it too).
int OpenFds() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

bool Same(const IpcShard& a, const IpcShard& b) {
  return a.kind == b.kind && a.handle == b.handle &&
         a.mapping_size == b.mapping_size && a.offset == b.offset &&
         a.bytes == b.bytes && a.ordinal == b.ordinal &&
         a.fd.valid() == b.fd.valid();
}

TEST(IpcPayloadTest, RoundTripsEveryField) {
  IpcShard shard = Shard(1 << 30);
  shard.ordinal = 3;
  const IpcPayload payload = EncodeIpc(shard);
  EXPECT_EQ(payload.kind, 0u);
  EXPECT_EQ(payload.mapping_size, 0u);
  absl::StatusOr<IpcShard> back = DecodeIpc(payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Same(*back, shard));
  EXPECT_EQ(back->kind, IpcShard::Kind::kLegacyHandle);
  EXPECT_FALSE(back->fd.valid());
}

TEST(IpcPayloadTest, APosixFdExportRoundTripsWithItsDescriptor) {
  const IpcShard shard = FdShard("allocation");
  const IpcPayload payload = EncodeIpc(shard);
  EXPECT_EQ(payload.kind, 1u);
  EXPECT_EQ(payload.mapping_size, uint64_t{128} << 20);
  absl::StatusOr<IpcShard> back = DecodeIpc(payload, shard.fd);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(Same(*back, shard));
  EXPECT_EQ(back->fd.get(), shard.fd.get());
}

TEST(IpcPayloadTest, APayloadThatBreaksARuleIsRefusedNamingIt) {
  struct Case {
    const char* says;
    void (*spoil)(IpcPayload&);
  };
  const Case cases[] = {
      {"unknown export kind 7", [](IpcPayload& p) { p.kind = 7; }},
      {"a mapping size with a legacy IPC handle",
       [](IpcPayload& p) { p.mapping_size = 1 << 20; }},
      {"a POSIX fd export without its fd", [](IpcPayload& p) { p.kind = 1; }},
      {"more than 64 GiB",
       [](IpcPayload& p) { p.bytes = internal::kMaxPayloadBytes + 1; }},
      {"CUDA device -1", [](IpcPayload& p) { p.ordinal = -1; }},
      {"offset", [](IpcPayload& p) { p.offset = ~uint64_t{0}; }},
  };
  for (const Case& c : cases) {
    IpcPayload payload = EncodeIpc(Shard(16));
    c.spoil(payload);
    absl::StatusOr<IpcShard> decoded = DecodeIpc(payload);
    ASSERT_FALSE(decoded.ok()) << c.says;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find(c.says), std::string::npos)
        << decoded.status();
  }
  // With its descriptor, a POSIX fd export must say how much to map, and
  // the value must lie inside it; a legacy handle comes without one.
  const Case with_fd[] = {
      {"mapping size 0", [](IpcPayload& p) { p.mapping_size = 0; }},
      {"more than 1 TiB",
       [](IpcPayload& p) {
         p.mapping_size = internal::kMaxIpcMappingBytes + 1;
       }},
      {"lies outside the mapping of 2097152 bytes",
       [](IpcPayload& p) {
         p.mapping_size = 2 << 20;
         p.offset = (2 << 20) - 100;
       }},
      {"a descriptor with a legacy IPC handle",
       [](IpcPayload& p) {
         p.kind = 0;
         p.mapping_size = 0;
       }},
  };
  for (const Case& c : with_fd) {
    IpcShard shard = FdShard("x");
    IpcPayload payload = EncodeIpc(shard);
    c.spoil(payload);
    absl::StatusOr<IpcShard> decoded = DecodeIpc(payload, shard.fd);
    ASSERT_FALSE(decoded.ok()) << c.says;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find(c.says), std::string::npos)
        << decoded.status();
  }
}

// A worker that opens CUDA IPC, reduced to what the data plane sees: it
// records each PUSH_IPC and answers as told (stored, or an error), and can
// hold one until released.
class IpcHandler : public MapHandler {
 public:
  explicit IpcHandler(bool opens) : opens_(opens) {}
  bool OpensCudaIpc() override { return opens_; }
  absl::Status ReceiveIpc(const ShardKey& key, const IpcShard& shard) override {
    absl::MutexLock lock(&mu_);
    received_ = shard;
    ++calls_;
    entered_ = true;
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &hold_));
    return answer_;
  }
  void Answer(absl::Status answer) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(answer);
  }
  void Hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  bool AwaitEntered() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&entered_), kDeadline);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::optional<IpcShard> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  const bool opens_;
  absl::Mutex mu_;
  absl::Status answer_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<IpcShard> received_ ABSL_GUARDED_BY(mu_);
};

struct Served {
  std::unique_ptr<DataPlaneServer> server;
  std::string unix_name;
};

Served Serve(DataPlaneHandler* handler) {
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, handler, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  return {server.ok() ? *std::move(server) : nullptr, options.unix_name};
}

TEST(DataPlaneIpcTest, OnlyAWorkerThatOpensCudaIpcOffersItAndOnlyOverUnix) {
  IpcHandler opens(/*opens=*/true);
  IpcHandler closed(/*opens=*/false);
  Served a = Serve(&opens);
  Served b = Serve(&closed);
  ASSERT_TRUE(a.server && b.server);
  auto over_unix = DataPlaneConnection::Connect(a.server->tcp_address(),
                                                a.unix_name, nullptr);
  auto over_tcp =
      DataPlaneConnection::Connect(a.server->tcp_address(), "", nullptr);
  auto to_closed = DataPlaneConnection::Connect(b.server->tcp_address(),
                                                b.unix_name, nullptr);
  ASSERT_TRUE(over_unix.ok() && over_tcp.ok() && to_closed.ok());
  EXPECT_TRUE((*over_unix)->uses_shared_memory());
  EXPECT_TRUE((*over_unix)->peer_opens_cuda_ipc());
  EXPECT_FALSE((*over_tcp)->peer_opens_cuda_ipc());
  EXPECT_FALSE((*to_closed)->peer_opens_cuda_ipc());
  // Asked anyway, a connection that was not offered it refuses at once.
  absl::Status s = (*over_tcp)->PushIpc({1, 0}, Shard(16));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE((*over_tcp)->healthy());
  EXPECT_EQ(opens.calls(), 0);
}

TEST(DataPlaneIpcTest, AStoredShardIsAcknowledgedADeclinedOneLeavesTheLineUp) {
  IpcHandler handler(/*opens=*/true);
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  const IpcShard shard = Shard(300 << 10);
  ASSERT_TRUE((*conn)->PushIpc({5, 1}, shard).ok());
  ASSERT_TRUE(handler.received().has_value());
  EXPECT_TRUE(Same(*handler.received(), shard));  // as sent, every field

  // Declined (say, the value's memory could not be mapped there): the
  // sender hears why, and the same connection then carries the bytes.
  handler.Answer(absl::UnavailableError("cudaIpcOpenMemHandle failed: no"));
  absl::Status declined = (*conn)->PushIpc({6, 0}, shard);
  EXPECT_EQ(declined.code(), absl::StatusCode::kUnavailable) << declined;
  EXPECT_NE(declined.message().find("cudaIpcOpenMemHandle"), std::string::npos);
  EXPECT_TRUE((*conn)->healthy());
  std::shared_ptr<Storage> bytes = Pattern(300 << 10, 4);
  ASSERT_TRUE((*conn)->Push({6, 0}, *bytes).ok());
  absl::Status error;
  std::shared_ptr<Storage> got = handler.WaitFor({6, 0}, &error);
  ASSERT_NE(got, nullptr) << error;
  EXPECT_TRUE(SameBytes(*got, *bytes));
}

TEST(DataPlaneIpcTest, ARefusedPushIpcIsAnsweredWithoutAskingTheHandler) {
  // A peer the handler does not authorize, or a fenced generation: ERROR,
  // and the worker never maps anything for it.
  class Refusing : public IpcHandler {
   public:
    Refusing() : IpcHandler(true) {}
    absl::Status AdmitGeneration(uint64_t generation) override {
      if (generation == 9) return absl::FailedPreconditionError("fenced");
      return absl::OkStatus();
    }
  };
  Refusing handler;
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  DataPlaneIdentity fenced;
  fenced.generation = 9;
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr, fenced);
  ASSERT_TRUE(conn.ok()) << conn.status();
  absl::Status s = (*conn)->PushIpc({7, 0}, Shard(16));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "fenced");
  EXPECT_TRUE((*conn)->healthy());
  EXPECT_EQ(handler.calls(), 0);
}

// A connection through the handshake, as the worker side of a peer, whose
// frames the test writes itself.
std::unique_ptr<internal::FrameSocket> Handshaken(const Served& served,
                                                  bool over_unix) {
  auto fd = over_unix ? internal::ConnectUnix(served.unix_name)
                      : internal::ConnectTcp(served.server->tcp_address());
  EXPECT_TRUE(fd.ok()) << fd.status();
  if (!fd.ok()) return nullptr;
  auto socket =
      std::make_unique<internal::FrameSocket>(*std::move(fd), over_unix);
  absl::Status s = internal::ConnectHandshake(*socket, DataPlaneIdentity{});
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? std::move(socket) : nullptr;
}

TEST(DataPlaneIpcTest, FromABadPeerAClearErrorNeverACrash) {
  IpcHandler handler(/*opens=*/true);
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  // Over TCP (another host could not map it): answered with an ERROR that
  // says so; the stream stays in step.
  auto tcp = Handshaken(served, /*over_unix=*/false);
  ASSERT_NE(tcp, nullptr);
  ASSERT_TRUE(tcp->SendIpc({8, 0}, Shard(16)).ok());
  bool eof = false;
  auto reply = tcp->ReadHeader(&eof);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->frame_type(), FrameType::kError);
  absl::Status over_tcp = tcp->ReadErrorStatus(*reply);
  EXPECT_NE(over_tcp.message().find("unix socket only"), std::string::npos)
      << over_tcp;
  // A payload that breaks its rules: an ERROR naming the rule.
  auto unix_socket = Handshaken(served, /*over_unix=*/true);
  ASSERT_NE(unix_socket, nullptr);
  IpcPayload bad = EncodeIpc(Shard(16));
  bad.ordinal = -2;
  internal::FrameHeader header;
  header.type = static_cast<uint16_t>(FrameType::kPushIpc);
  header.buffer_id = 8;
  ASSERT_TRUE(unix_socket
                  ->SendFrame(header, absl::string_view(
                                          reinterpret_cast<const char*>(&bad),
                                          sizeof(bad)))
                  .ok());
  reply = unix_socket->ReadHeader(&eof);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->frame_type(), FrameType::kError);
  EXPECT_NE(
      unix_socket->ReadErrorStatus(*reply).message().find("CUDA device -2"),
      std::string::npos);
  EXPECT_EQ(handler.calls(), 0);
  // A payload of another size is a malformed frame: that connection closes.
  ASSERT_TRUE(unix_socket->SendFrame(header, "short").ok());
  reply = unix_socket->ReadHeader(&eof);
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(handler.calls(), 0);
  // The server serves everyone else as before.
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_TRUE((*conn)->PushIpc({9, 0}, Shard(16)).ok());
}

TEST(DataPlaneIpcTest, ASenderWaitingForItsAnswerIsReleasedByShutdown) {
  // The receiver holds the PUSH_IPC (a worker that stopped): the sender's
  // wait ends when its owner shuts the connection down (the peer was
  // declared down), so it lets go of the exported memory.
  IpcHandler handler(/*opens=*/true);
  handler.Hold(true);
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  absl::Status result;
  absl::Notification done;
  std::thread sender([&] {
    result = (*conn)->PushIpc({10, 0}, Shard(16));
    done.Notify();
  });
  ASSERT_TRUE(handler.AwaitEntered());
  (*conn)->Shutdown();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(kDeadline));
  sender.join();
  EXPECT_FALSE(result.ok());
  EXPECT_FALSE((*conn)->healthy());
  handler.Hold(false);  // the server's connection thread may end
}

TEST(DataPlaneIpcTest, APosixFdExportArrivesAsAWorkingDescriptor) {
  IpcHandler handler(/*opens=*/true);
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->peer_opens_cuda_ipc());
  const IpcShard shard = FdShard("the exported allocation");
  ASSERT_TRUE((*conn)->PushIpc({11, 0}, shard).ok());
  std::optional<IpcShard> got = handler.received();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(Same(*got, shard));  // every field, and a descriptor
  // The receiver's own descriptor of the same file: what was written to
  // it reads back, and writes through it reach the sender's.
  ASSERT_TRUE(got->fd.valid());
  EXPECT_NE(got->fd.get(), shard.fd.get());
  EXPECT_EQ(Contents(got->fd.get()), "the exported allocation");
  ASSERT_EQ(pwrite(got->fd.get(), "T", 1, 0), 1);
  EXPECT_EQ(Contents(shard.fd.get()), "The exported allocation");
  // A legacy handle on the same connection still goes without one, and
  // the bytes of a PUSH after it as before.
  ASSERT_TRUE((*conn)->PushIpc({12, 0}, Shard(16)).ok());
  got = handler.received();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(Same(*got, Shard(16)));
  EXPECT_FALSE(got->fd.valid());
  std::shared_ptr<Storage> bytes = Pattern(300 << 10, 5);
  ASSERT_TRUE((*conn)->Push({13, 0}, *bytes).ok());
  absl::Status error;
  std::shared_ptr<Storage> pushed = handler.WaitFor({13, 0}, &error);
  ASSERT_NE(pushed, nullptr) << error;
  EXPECT_TRUE(SameBytes(*pushed, *bytes));
  EXPECT_EQ(handler.calls(), 2);
}

TEST(DataPlaneIpcTest, ARefusedPosixFdExportLeavesNoDescriptorOpen) {
  // A fenced generation: refused before the handler is asked, and the
  // descriptor that came with it is closed before the answer.
  class Refusing : public IpcHandler {
   public:
    Refusing() : IpcHandler(true) {}
    absl::Status AdmitGeneration(uint64_t generation) override {
      return absl::FailedPreconditionError("fenced");
    }
  };
  Refusing handler;
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  DataPlaneIdentity fenced;
  fenced.generation = 9;
  auto conn = DataPlaneConnection::Connect(served.server->tcp_address(),
                                           served.unix_name, nullptr, fenced);
  ASSERT_TRUE(conn.ok()) << conn.status();
  const IpcShard shard = FdShard("x");
  const int before = OpenFds();
  absl::Status s = (*conn)->PushIpc({14, 0}, shard);
  EXPECT_EQ(s.message(), "fenced");
  EXPECT_TRUE((*conn)->healthy());
  EXPECT_EQ(OpenFds(), before);
  EXPECT_EQ(handler.calls(), 0);
}

TEST(DataPlaneIpcTest, ADescriptorWhereNoneBelongsIsRefusedInStep) {
  IpcHandler handler(/*opens=*/true);
  Served served = Serve(&handler);
  ASSERT_TRUE(served.server);
  // Over TCP a descriptor cannot travel: the sender says so, sends nothing.
  auto tcp = Handshaken(served, /*over_unix=*/false);
  ASSERT_NE(tcp, nullptr);
  absl::Status over_tcp = tcp->SendIpc({15, 0}, FdShard("x"));
  EXPECT_EQ(over_tcp.code(), absl::StatusCode::kFailedPrecondition) << over_tcp;
  EXPECT_FALSE(tcp->broken());
  // A legacy handle with a descriptor beside it, and a POSIX fd export
  // without one: ERRORs naming the rule; the stream stays in step.
  auto unix_socket = Handshaken(served, /*over_unix=*/true);
  ASSERT_NE(unix_socket, nullptr);
  const IpcShard fd_shard = FdShard("x");
  internal::FrameHeader header;
  header.type = static_cast<uint16_t>(FrameType::kPushIpc);
  header.buffer_id = 15;
  header.flags = internal::kFlagFd;
  header.payload_bytes = sizeof(IpcPayload);
  IpcPayload legacy = EncodeIpc(Shard(16));
  iovec iov[2] = {{&header, sizeof(header)}, {&legacy, sizeof(legacy)}};
  ASSERT_TRUE(
      internal::SendAll(unix_socket->fd(), iov, 2, fd_shard.fd.get()).ok());
  bool eof = false;
  auto reply = unix_socket->ReadHeader(&eof);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->frame_type(), FrameType::kError);
  EXPECT_NE(unix_socket->ReadErrorStatus(*reply).message().find(
                "a descriptor with a legacy IPC handle"),
            std::string::npos);
  header.flags = 0;
  const IpcPayload no_fd = EncodeIpc(fd_shard);
  ASSERT_TRUE(unix_socket
                  ->SendFrame(header, absl::string_view(
                                          reinterpret_cast<const char*>(&no_fd),
                                          sizeof(no_fd)))
                  .ok());
  reply = unix_socket->ReadHeader(&eof);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->frame_type(), FrameType::kError);
  EXPECT_NE(unix_socket->ReadErrorStatus(*reply).message().find(
                "a POSIX fd export without its fd"),
            std::string::npos);
  EXPECT_EQ(handler.calls(), 0);
  // The same socket then carries a good one.
  ASSERT_TRUE(unix_socket->SendIpc({16, 0}, fd_shard).ok());
  reply = unix_socket->ReadHeader(&eof);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->frame_type(), FrameType::kAck);
  EXPECT_EQ(handler.calls(), 1);
}

}  // namespace
}  // namespace plexus::transport
