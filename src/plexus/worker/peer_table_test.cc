// The peer table: peers declared down, with why; their generations
// fenced; no sender once the worker is being destroyed.
#include "plexus/worker/peer_table.h"

#include "gtest/gtest.h"
#include "plexus/common/clock.h"

namespace plexus {
namespace {

class PeerTableTest : public ::testing::Test {
 protected:
  PeerTableTest()
      : reports_(Clock::Real()),
        peers_(me_, &counters_, /*cuda_ipc=*/nullptr, /*timeline=*/nullptr,
               &reports_) {
    proto::PeerInfo peer;
    peer.set_worker_id(2);
    peer.set_data_address("127.0.0.1:1");  // refused: nothing is sent
    peers_.Add(peer);
  }

  WorkerIdentity me_;
  transport::DataPlaneCounters counters_;
  ReportQueue reports_;
  PeerTable peers_;
};

TEST_F(PeerTableTest, APeerDeclaredDownStaysDownAndItsGenerationIsFenced) {
  EXPECT_FALSE(peers_.IsDown(2));
  EXPECT_FALSE(peers_.DownStatus(2).has_value());
  EXPECT_NE(peers_.SenderTo(2), nullptr);
  EXPECT_EQ(peers_.SenderTo(3), nullptr);  // never told of

  peers_.MarkDown(2, /*generation=*/17, absl::UnavailableError("lost"));
  EXPECT_TRUE(peers_.IsDown(2));
  ASSERT_TRUE(peers_.DownStatus(2).has_value());
  EXPECT_EQ(peers_.DownStatus(2)->message(), "lost");
  EXPECT_EQ(peers_.FencedWorker(17), 2);
  EXPECT_FALSE(peers_.FencedWorker(18).has_value());
  auto conn = peers_.Connect(2, [] { return false; });
  EXPECT_TRUE(absl::IsUnavailable(conn.status())) << conn.status();
  // Never told of (the server tells a worker of a peer as its ops need
  // it): not NOT_FOUND, which a peer compiling an executable answers.
  conn = peers_.Connect(3, [] { return false; });
  EXPECT_TRUE(absl::IsFailedPrecondition(conn.status())) << conn.status();
}

TEST_F(PeerTableTest, NoSenderIsMadeOnceTheSendersAreStopped) {
  peers_.StopSenders();
  EXPECT_EQ(peers_.SenderTo(2), nullptr);
}

}  // namespace
}  // namespace plexus
