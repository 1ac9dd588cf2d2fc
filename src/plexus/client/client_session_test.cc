// ClientSession's waits on the client's injected clock (ClientOptions::
// clock), without a server: a wait for the server's word on a lost host
// ends when the clock passes its timeout, or at once on Close.
#include "plexus/client/client_session.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "plexus/common/clock.h"

namespace plexus {
namespace {

// The data path's place, hearing nothing.
class NoDataPath : public SessionObserver {
 public:
  void SessionInstalled(uint64_t,
                        const transport::DataPlaneIdentity&) override {}
  void StreamBroke() override {}
  void SessionEnded() override { ended++; }
  void WorkerDown(int64_t, const absl::Status&) override {}
  void PutsReleased(const absl::flat_hash_set<uint64_t>&) override {}
  void RePut(uint64_t, int32_t) override {}
  void SessionDone() override {}
  void SessionResumed(uint64_t, const transport::DataPlaneIdentity&) override {}
  std::atomic<int> ended{0};
};

class ClientSessionTest : public ::testing::Test {
 protected:
  ClientSessionTest() {
    options_.clock = &clock_;
    session_ = std::make_unique<ClientSession>(options_, &data_path_,
                                               [](proto::ClientStats*) {});
  }
  FakeClock clock_;
  ClientOptions options_;
  NoDataPath data_path_;
  std::unique_ptr<ClientSession> session_;
};

TEST_F(ClientSessionTest, AWaitForWordOfALossEndsWhenTheClientsClockPassesIt) {
  std::atomic<int> heard{-1};
  std::thread reader(
      [&] { heard = session_->AwaitLoss(0, absl::Seconds(5)) ? 1 : 0; });
  clock_.AwaitWaiters(1);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(heard, -1);  // 4 s of 5: still waiting
  clock_.Advance(absl::Seconds(1));
  reader.join();
  EXPECT_EQ(heard, 0);  // no loss heard
}

TEST_F(ClientSessionTest, IdsPastTheLayoutsLimitAreRefusedNeverReused) {
  // Past 2^39 - 1 a client's id would be one the server makes in its
  // namespace (common/ids.h): refused, and a refused batch takes none.
  session_->set_next_id_for_test(kMaxIdCount - 2);
  absl::StatusOr<uint64_t> two = session_->NextIds(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_FALSE(IsServerMade(*two + 1));
  absl::StatusOr<uint64_t> three = session_->NextIds(3);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(three.status().message().find("this client's ids"),
            std::string::npos)
      << three.status();
  absl::StatusOr<uint64_t> last = session_->NextIds();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, *two + 2);
  EXPECT_FALSE(IsServerMade(*last));
  EXPECT_TRUE(absl::IsResourceExhausted(session_->NextIds().status()));
}

TEST_F(ClientSessionTest, AWaitForWordOfALossEndsAtTheWaitsDeadline) {
  // A wait with a timeout (plexus.wait(f, timeout)) that meets a lost host
  // waits for the server's word at most until its own deadline, not the
  // spare wait's 10 minutes.
  std::atomic<int> heard{-1};
  const absl::Time deadline = clock_.Now() + absl::Seconds(2);
  std::thread reader([&] {
    heard = session_->AwaitLoss(0, absl::Minutes(10), deadline) ? 1 : 0;
  });
  clock_.AwaitWaiters(1);
  clock_.Advance(absl::Seconds(2));
  reader.join();
  EXPECT_EQ(heard, 0);
}

TEST_F(ClientSessionTest, CloseEndsAWaitForWordOfALossAtOnce) {
  std::atomic<int> heard{-1};
  std::thread reader(
      [&] { heard = session_->AwaitLoss(0, absl::Hours(1)) ? 1 : 0; });
  clock_.AwaitWaiters(1);
  session_->Close();
  reader.join();
  EXPECT_EQ(heard, 0);
  EXPECT_EQ(data_path_.ended, 1);  // told, to wake its connections
  EXPECT_EQ(session_->state(), SessionState::kClosed);
  EXPECT_EQ(session_->CheckOpen().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace plexus
