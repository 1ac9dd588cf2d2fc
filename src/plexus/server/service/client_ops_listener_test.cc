// ClientOpsListener over real sockets, with an apply that records: a
// session's frames wait for its stream's last message and are applied in
// order; only the session's own credential and generation are heard, on one
// connection; Close applies what was sent before the connection's end,
// cancels an apply that waits, and nothing is applied after it.
#include "plexus/server/service/internal/client_ops_listener.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/transport/data_plane.h"

namespace plexus {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(30);

class ClientOpsListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto secret = ClusterSecret::Generate();
    ASSERT_TRUE(secret.ok()) << secret.status();
    secret_ = *secret;
    auto listener =
        ClientOpsListener::Start("127.0.0.1", secret_, Clock::Real());
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
  }

  // Session `generation` of client `client`, recording each batch's first
  // op's slice_release.
  void Open(uint64_t generation, uint64_t client) {
    listener_->Open(generation, client, [this](proto::ClientToServer& msg) {
      absl::MutexLock lock(&mu_);
      applied_.push_back(msg.ops(0).slice_release());
      return absl::OkStatus();
    });
  }

  // A connection proving `client`'s credential (or `credential_of`'s),
  // its frames stamped with `generation`; over unix or TCP.
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> Connect(
      uint64_t client, uint64_t generation, bool over_unix,
      uint64_t credential_of = 0) {
    transport::DataPlaneIdentity me;
    me.peer = {CredentialRole::kClient, client};
    me.credential = secret_.Derive(CredentialRole::kClient,
                                   credential_of != 0 ? credential_of : client);
    me.generation = generation;
    return transport::DataPlaneConnection::Connect(
        over_unix ? "" : absl::StrCat("127.0.0.1:", listener_->tcp_port()),
        over_unix ? listener_->unix_name() : "", &counters_, me);
  }

  // Whether the server closed `conn` (its socket reads its end) within
  // the deadline: nothing is ever sent back on an ops connection.
  static bool ClosedByServer(const transport::DataPlaneConnection& conn) {
    const int fd = conn.socket_fd();
    timeval timeout{static_cast<time_t>(absl::ToInt64Seconds(kDeadline)), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, 0);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

  static std::string Batch(uint64_t n) {
    proto::ClientToServer msg;
    msg.add_ops()->set_slice_release(n);
    return msg.SerializeAsString();
  }

  // The batches applied, once there are `n` (or what there is at the
  // deadline).
  std::vector<uint64_t> Applied(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return applied_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kDeadline);
    return applied_;
  }

  ClusterSecret secret_;
  transport::DataPlaneCounters counters_;
  std::unique_ptr<ClientOpsListener> listener_;
  absl::Mutex mu_;
  std::vector<uint64_t> applied_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ClientOpsListenerTest, FramesWaitForTheStreamsLastMessageThenGoInOrder) {
  for (bool over_unix : {true, false}) {
    SCOPED_TRACE(over_unix ? "unix" : "tcp");
    const uint64_t generation = over_unix ? 7 : 8;
    Open(generation, 3);
    auto conn = Connect(3, generation, over_unix);
    ASSERT_TRUE(conn.ok()) << conn.status();
    EXPECT_EQ((*conn)->uses_shared_memory(), over_unix);
    ASSERT_TRUE((*conn)->SendOps("").ok());  // the client's first frame
    for (uint64_t n = 1; n <= 3; ++n) {
      ASSERT_TRUE((*conn)->SendOps(Batch(n)).ok());
    }
    // Not one before the stream's last message was read (an early apply
    // would show here most times).
    EXPECT_EQ(listener_->frames(generation), 0);
    ASSERT_TRUE(listener_->MarkerRead(generation));
    const std::vector<uint64_t> want =
        over_unix ? std::vector<uint64_t>{1, 2, 3}
                  : std::vector<uint64_t>{1, 2, 3, 1, 2, 3};
    EXPECT_EQ(Applied(want.size()), want);
    EXPECT_EQ(listener_->frames(generation), 3);
    conn->reset();
    listener_->Close(generation, kDeadline, [] {});
    EXPECT_EQ(listener_->frames(generation), 0);  // forgotten
  }
}

TEST_F(ClientOpsListenerTest,
       OnlyTheSessionsOwnCredentialGenerationAndOneConnection) {
  Open(7, 3);
  ASSERT_TRUE(listener_->MarkerRead(7));
  // A client with no session here, and one proving another's credential:
  // refused at the handshake.
  auto stranger = Connect(4, 7, /*over_unix=*/true);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied)
      << stranger.status();
  auto forged = Connect(3, 7, /*over_unix=*/true, /*credential_of=*/4);
  EXPECT_FALSE(forged.ok());
  // Its own credential with another generation: the frame closes the
  // connection, unapplied.
  auto old = Connect(3, 6, /*over_unix=*/true);
  ASSERT_TRUE(old.ok()) << old.status();
  ASSERT_TRUE((*old)->SendOps(Batch(1)).ok());
  EXPECT_TRUE(ClosedByServer(**old));
  // The session's connection, then a second one for it: closed.
  auto conn = Connect(3, 7, /*over_unix=*/true);
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->SendOps(Batch(2)).ok());
  EXPECT_EQ(Applied(1), std::vector<uint64_t>({2}));
  auto second = Connect(3, 7, /*over_unix=*/false);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->SendOps(Batch(3)).ok());
  EXPECT_TRUE(ClosedByServer(**second));
  // Bytes that are not a ClientToServer, and a frame with a session's
  // opening fields: each closes the connection, unapplied.
  ASSERT_TRUE((*conn)->SendOps(Batch(4)).ok());
  EXPECT_EQ(Applied(2), std::vector<uint64_t>({2, 4}));
  ASSERT_TRUE((*conn)->SendOps("\xff\xff\xff garbage").ok());
  EXPECT_TRUE(ClosedByServer(**conn));
  EXPECT_EQ(Applied(2), std::vector<uint64_t>({2, 4}));
  EXPECT_EQ(listener_->frames(7), 2);
  listener_->Close(7, kDeadline, [] {});
  // A shard request is not served here.
  Open(9, 5);
  auto asker = Connect(5, 9, /*over_unix=*/true);
  ASSERT_TRUE(asker.ok()) << asker.status();
  EXPECT_EQ((*asker)->Fetch({1, 0}).status().code(),
            absl::StatusCode::kPermissionDenied);
  asker->reset();
  listener_->Close(9, kDeadline, [] {});
}

TEST_F(ClientOpsListenerTest, CloseAppliesWhatCameBeforeTheConnectionsEnd) {
  Open(7, 3);
  ASSERT_TRUE(listener_->MarkerRead(7));
  auto conn = Connect(3, 7, /*over_unix=*/false);
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->SendOps("").ok());  // before the marker, as a client
  constexpr uint64_t kFrames = 200;
  for (uint64_t n = 1; n <= kFrames; ++n) {
    ASSERT_TRUE((*conn)->SendOps(Batch(n)).ok());
  }
  conn->reset();  // then the stream's end: the session closes
  listener_->Close(7, kDeadline, [] {});
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(applied_.size(), kFrames);
  for (uint64_t n = 1; n <= kFrames; ++n) EXPECT_EQ(applied_[n - 1], n);
}

TEST_F(ClientOpsListenerTest, CloseCancelsAnApplyThatWaitsAndTakesNoMore) {
  absl::Notification entered, cancelled;
  int applies = 0;
  listener_->Open(7, 3, [&](proto::ClientToServer&) {
    ++applies;
    entered.Notify();
    cancelled.WaitForNotificationWithTimeout(kDeadline);  // room, a resume
    return absl::OkStatus();
  });
  ASSERT_TRUE(listener_->MarkerRead(7));
  auto conn = Connect(3, 7, /*over_unix=*/true);
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE((*conn)->SendOps(Batch(1)).ok());
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(kDeadline));
  ASSERT_TRUE((*conn)->SendOps(Batch(2)).ok());
  // The client's connection still open: Close waits no longer than the
  // drain, shuts it, and returns once the waiting apply was cancelled.
  const absl::Time start = absl::Now();
  listener_->Close(7, absl::ZeroDuration(), [&] { cancelled.Notify(); });
  EXPECT_TRUE(cancelled.HasBeenNotified());
  EXPECT_LT(absl::Now() - start, kDeadline);
  EXPECT_EQ(applies, 1);                // the frame behind it was never applied
  EXPECT_TRUE(ClosedByServer(**conn));  // shut down
}

}  // namespace
}  // namespace plexus
