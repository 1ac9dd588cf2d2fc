#include "plexus/transport/data_plane.h"

#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using test_support::kDeadline;
using test_support::MapHandler;
using test_support::Pattern;
using test_support::SameBytes;
using test_support::UniqueUnixName;

ino_t Inode(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

enum class Carrier { kTcp, kUnix };

// A worker's data plane (server + map handler) and clients of it.
class DataPlaneTest : public ::testing::TestWithParam<Carrier> {
 protected:
  void SetUp() override {
    DataPlaneServerOptions options;
    options.unix_name = UniqueUnixName();
    auto server = DataPlaneServer::Start(options, &handler_, &server_counters_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    handler_.Close();
    server_.reset();
  }
  std::unique_ptr<DataPlaneConnection> Connect() {
    auto c = DataPlaneConnection::Connect(
        server_->tcp_address(),
        GetParam() == Carrier::kUnix ? server_->unix_path() : "",
        &client_counters_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  MapHandler handler_;
  DataPlaneCounters server_counters_;
  DataPlaneCounters client_counters_;
  std::unique_ptr<DataPlaneServer> server_;
};

TEST_P(DataPlaneTest, PutThenFetchReturnsTheSameBytes) {
  const size_t bytes = 16 << 20;
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  const bool over_unix = GetParam() == Carrier::kUnix;
  EXPECT_EQ(conn->uses_shared_memory(), over_unix);
  std::shared_ptr<Storage> sent = Pattern(bytes, 1);
  ASSERT_TRUE(sent->shared());

  ASSERT_TRUE(conn->Put({7, 2}, *sent).ok());
  EXPECT_EQ(server_counters_.bytes_from_clients.load(), bytes);
  auto fetched = conn->Fetch({7, 2});
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(SameBytes(**fetched, *sent));
  // Frames are served in order: once WAIT is answered, the FETCH has been
  // counted.
  ASSERT_TRUE(conn->Wait({7, 2}).ok());
  EXPECT_EQ(server_counters_.bytes_to_clients.load(), bytes);

  if (over_unix) {
    // The memfd travelled both ways: no storage was allocated for the bytes,
    // and what came back is the very file that was put.
    EXPECT_EQ(handler_.allocations(), 0);
    EXPECT_TRUE((*fetched)->shared());
    EXPECT_EQ(Inode((*fetched)->fd()), Inode(sent->fd()));
  } else {
    EXPECT_EQ(handler_.allocations(), 1);
    EXPECT_NE(Inode((*fetched)->fd()), Inode(sent->fd()));
  }
}

TEST_P(DataPlaneTest, APutAndAFetchCountTheirPayloadBytesForTheirCaller) {
  const size_t bytes = (5 << 20) + 123;  // chunks, and a part of one
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  std::shared_ptr<Storage> data = Pattern(bytes, 3);
  std::atomic<int64_t> sent{0};
  ASSERT_TRUE(conn->Put({8, 0}, *data, &sent).ok());
  EXPECT_EQ(sent.load(), static_cast<int64_t>(bytes));
  std::atomic<int64_t> received{0};
  auto fetched = conn->Fetch({8, 0}, &received);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(SameBytes(**fetched, *data));
  EXPECT_EQ(received.load(), static_cast<int64_t>(bytes));
}

TEST_P(DataPlaneTest, AServedExecutableIsFetchedByItsFingerprint) {
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  const size_t bytes = 3 << 20;  // a large executable: a memfd over unix
  std::shared_ptr<Storage> exe = Pattern(bytes, 5);
  handler_.ServeExecutable(0xfeedfacecafebeefull, exe);
  auto fetched = conn->FetchExecutable(0xfeedfacecafebeefull);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(SameBytes(**fetched, *exe));
  // None under another fingerprint: the peer's error, the stream in step.
  auto missing = conn->FetchExecutable(7);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound)
      << missing.status();
  // Requests are served in order: once that is answered, the first reply
  // has been counted.
  EXPECT_EQ(server_counters_.bytes_sent.load(), bytes);
  EXPECT_TRUE(conn->healthy());
  EXPECT_TRUE(conn->FetchExecutable(0xfeedfacecafebeefull).ok());
}

TEST_P(DataPlaneTest, FetchBlocksUntilTheShardIsPushed) {
  auto fetcher = Connect();
  auto pusher = Connect();
  ASSERT_TRUE(fetcher && pusher);
  absl::Notification fetched;
  absl::StatusOr<std::shared_ptr<Storage>> result;
  std::thread t([&] {
    result = fetcher->Fetch({1, 0});
    fetched.Notify();
  });
  ASSERT_TRUE(handler_.WaitForWaiters(1));
  EXPECT_FALSE(fetched.HasBeenNotified());

  std::shared_ptr<Storage> data = Pattern(Storage::kShmThreshold, 3);
  ASSERT_TRUE(pusher->Push({1, 0}, *data).ok());
  ASSERT_TRUE(fetched.WaitForNotificationWithTimeout(kDeadline));
  t.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(SameBytes(**result, *data));
}

TEST_P(DataPlaneTest, PushOfSmallHeapDataArrivesInline) {
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  std::shared_ptr<Storage> data = Pattern(4096, 5);
  ASSERT_FALSE(data->shared());
  ASSERT_TRUE(conn->Push({3, 1}, *data).ok());
  EXPECT_EQ(client_counters_.bytes_sent.load(), 4096);

  absl::Status error;
  std::shared_ptr<Storage> received = handler_.WaitFor({3, 1}, &error);
  ASSERT_NE(received, nullptr) << error;
  EXPECT_TRUE(SameBytes(*received, *data));
  EXPECT_EQ(server_counters_.bytes_received.load(), 4096);
  EXPECT_EQ(handler_.allocations(), 1);  // heap bytes travel inline
}

TEST_P(DataPlaneTest, ErrorsKeepTheirCodeAndMessage) {
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  const absl::Status freed = absl::NotFoundError(
      "buffer 9 was deleted by the client before shard 0 was fetched");
  handler_.Fail({9, 0}, freed);
  EXPECT_EQ(conn->Fetch({9, 0}).status(), freed);
  EXPECT_EQ(conn->Wait({9, 0}), freed);

  const absl::Status full =
      absl::ResourceExhaustedError("device 3 has no room for 16777216 bytes");
  handler_.RejectDeliveries(full);
  EXPECT_EQ(conn->Put({10, 0}, *Pattern(1 << 20, 0)), full);
  EXPECT_EQ(conn->Put({10, 1}, *Pattern(100, 0)), full);

  // The connection is still usable after error replies.
  handler_.Fail({11, 0}, absl::InvalidArgumentError("x"));
  EXPECT_EQ(conn->Wait({11, 0}), absl::InvalidArgumentError("x"));

  // A failure pushed to a peer keeps its code (the peer's readers, and a
  // Python caller, see the same error class) and its message.
  const absl::Status why = absl::InvalidArgumentError(
      "program 'matmul' failed: shapes [8, 4] and [5, 2]");
  ASSERT_TRUE(conn->PushError({12, 3}, why).ok());
  absl::Status error;
  EXPECT_EQ(handler_.WaitFor({12, 3}, &error), nullptr);
  EXPECT_EQ(error, why);
}

TEST_P(DataPlaneTest, WaitsForManyShardsAnsweredInOrderUntilADeadline) {
  auto conn = Connect();
  auto pusher = Connect();
  ASSERT_TRUE(conn && pusher);
  // More keys than are ever unanswered at once: the rest go out as answers
  // come in.
  std::vector<ShardKey> keys;
  for (int i = 0; i < 600; ++i) {
    keys.push_back({20, i});
    ASSERT_TRUE(pusher->Push(keys.back(), *Pattern(8, i)).ok());
  }
  ASSERT_TRUE(conn->SendWaits(keys).ok());
  auto all = conn->AwaitWaits(keys, absl::Now() + kDeadline);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, keys.size());
  EXPECT_TRUE(conn->healthy());

  // A shard not yet there: the ones before it are confirmed, then the
  // deadline passes and the connection (answers still due) is broken.
  const std::vector<ShardKey> some = {{20, 0}, {20, 1}, {21, 0}, {20, 2}};
  ASSERT_TRUE(conn->SendWaits(some).ok());
  auto two = conn->AwaitWaits(some, absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, 2u);
  EXPECT_FALSE(conn->healthy());

  // A failed shard: its error, code and message intact.
  auto again = Connect();
  ASSERT_NE(again, nullptr);
  handler_.Fail({22, 0}, absl::InvalidArgumentError("bad shard"));
  const std::vector<ShardKey> failed = {{20, 0}, {22, 0}};
  ASSERT_TRUE(again->SendWaits(failed).ok());
  EXPECT_EQ(again->AwaitWaits(failed, absl::InfiniteFuture()).status(),
            absl::InvalidArgumentError("bad shard"));
  EXPECT_TRUE(again->healthy());  // it was the last answer due
}

TEST_P(DataPlaneTest, PushThatCannotBeStoredFailsTheShardNotTheConnection) {
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  handler_.RejectAllocations(absl::ResourceExhaustedError("device 0 is full"));
  ASSERT_TRUE(conn->Push({4, 0}, *Pattern(4096, 1)).ok());
  absl::Status error;
  EXPECT_EQ(handler_.WaitFor({4, 0}, &error), nullptr);
  EXPECT_NE(error.message().find("device 0 is full"), std::string::npos)
      << error;
  EXPECT_NE(error.message().find("buffer 4 shard 0"), std::string::npos)
      << error;

  handler_.RejectAllocations(absl::OkStatus());
  std::shared_ptr<Storage> data = Pattern(4096, 2);
  ASSERT_TRUE(conn->Push({4, 1}, *data).ok());
  std::shared_ptr<Storage> received = handler_.WaitFor({4, 1}, &error);
  ASSERT_NE(received, nullptr) << error;
  EXPECT_TRUE(SameBytes(*received, *data));
}

TEST_P(DataPlaneTest, ClosingTheHandlerReleasesABlockedFetch) {
  auto conn = Connect();
  ASSERT_NE(conn, nullptr);
  absl::StatusOr<std::shared_ptr<Storage>> result;
  std::thread t([&] { result = conn->Fetch({5, 0}); });
  ASSERT_TRUE(handler_.WaitForWaiters(1));
  handler_.Close();
  t.join();
  EXPECT_EQ(result.status(), absl::CancelledError("handler closed"));
  server_.reset();  // returns: no thread is left inside the handler
}

// A worker in another network namespace registers a unix socket that is not
// there for us (abstract sockets are per namespace): Connect falls back to
// TCP, the same worker, and the bytes still arrive.
TEST(DataPlaneConnectTest, AnUnreachableUnixSocketFallsBackToTcp) {
  MapHandler handler;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();

  auto conn = DataPlaneConnection::Connect(
      (*server)->tcp_address(), UniqueUnixName() + "-nobody-listens", nullptr);
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_FALSE((*conn)->uses_shared_memory());
  std::shared_ptr<Storage> sent = Pattern(1 << 20, 3);
  ASSERT_TRUE((*conn)->Put({9, 0}, *sent).ok());
  auto fetched = (*conn)->Fetch({9, 0});
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(SameBytes(**fetched, *sent));

  // A reachable unix socket is still preferred.
  auto shm = DataPlaneConnection::Connect((*server)->tcp_address(),
                                          (*server)->unix_path(), nullptr);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_TRUE((*shm)->uses_shared_memory());
  handler.Close();
}

TEST(DataPlaneConnectTest, NeitherCarrierReachableNamesTheTcpAddress) {
  // A port nobody listens on: bind one, note it, close it.
  MapHandler handler;
  auto server = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->tcp_address();
  handler.Close();
  server->reset();

  auto conn = DataPlaneConnection::Connect(
      address, UniqueUnixName() + "-nobody-listens", nullptr);
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(conn.status().message().find(address), std::string::npos)
      << conn.status();
}

// A worker in a pod or behind a firewall listens on a port fixed by its
// flags (plexus-worker --data-host 0.0.0.0:7071).
TEST(DataPlaneListenTest, AFixedPortIsTheOneBoundAndAPortInUseIsNamed) {
  MapHandler handler;
  auto first = DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->tcp_address();  // 127.0.0.1:<port>

  DataPlaneServerOptions fixed;
  fixed.tcp_host = taken;
  auto refused = DataPlaneServer::Start(fixed, &handler, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("bind " + taken), std::string::npos)
      << refused.status();

  first->reset();  // the port is free again
  auto second = DataPlaneServer::Start(fixed, &handler, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->tcp_address(), taken);

  DataPlaneServerOptions any;  // port 0: a free one, as "127.0.0.1" alone
  any.tcp_host = "127.0.0.1:0";
  auto ephemeral = DataPlaneServer::Start(any, &handler, nullptr);
  ASSERT_TRUE(ephemeral.ok()) << ephemeral.status();
  EXPECT_NE((*ephemeral)->tcp_address(), "127.0.0.1:0");

  DataPlaneServerOptions bad;
  bad.tcp_host = "127.0.0.1:notaport";
  auto named = DataPlaneServer::Start(bad, &handler, nullptr);
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(named.status().message().find("127.0.0.1:notaport"),
            std::string::npos)
      << named.status();
  handler.Close();
}

INSTANTIATE_TEST_SUITE_P(Carriers, DataPlaneTest,
                         ::testing::Values(Carrier::kTcp, Carrier::kUnix),
                         [](const auto& info) {
                           return info.param == Carrier::kTcp ? "Tcp" : "Unix";
                         });

}  // namespace
}  // namespace plexus::transport
