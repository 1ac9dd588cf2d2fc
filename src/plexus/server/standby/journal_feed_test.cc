// JournalFeed driven directly: records in order with their counts, the
// standby's sync awaited, and every way a wait ends (the sync, the
// deadline, a standby that stopped reading, a close).
#include "plexus/server/standby/journal_feed.h"

#include <thread>

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(JournalFeedTest, RecordsGoInOrderWithTheCountAfterThem) {
  JournalFeed feed(/*base=*/7, /*max_queued=*/16, Clock::Real());
  feed.Push("a");
  feed.Push("b");
  std::vector<std::string> records;
  uint64_t last = 0;
  ASSERT_TRUE(feed.Take(&records, &last, absl::InfiniteFuture()));
  EXPECT_EQ(records, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(last, 9u);
  records.clear();
  // Nothing queued: a keepalive's wait ends at its deadline, empty.
  ASSERT_TRUE(feed.Take(&records, &last, absl::InfinitePast()));
  EXPECT_TRUE(records.empty());
  EXPECT_EQ(last, 9u);
}

TEST(JournalFeedTest, AChangeWaitsUntilTheStandbyHasSyncedIt) {
  JournalFeed feed(0, 16, Clock::Real());
  feed.Push("a");
  feed.Push("b");
  std::thread standby([&] {
    std::vector<std::string> records;
    uint64_t last = 0;
    ASSERT_TRUE(feed.Take(&records, &last, absl::InfiniteFuture()));
    feed.Synced(last);
  });
  EXPECT_TRUE(feed.AwaitSynced(2, absl::InfiniteFuture()).ok());
  standby.join();
  EXPECT_EQ(feed.synced(), 2u);
  // Past the deadline, unsynced: says both counts.
  feed.Push("c");
  absl::Status late = feed.AwaitSynced(3, absl::InfinitePast());
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.message().find("synced 2 of the journal's 3"),
            std::string::npos)
      << late;
  // A count the standby claims past what was sent is not taken.
  feed.Synced(99);
  EXPECT_EQ(feed.synced(), 2u);
}

TEST(JournalFeedTest, AStandbyThatStopsReadingIsCutOffNotWaitedFor) {
  JournalFeed feed(0, /*max_queued=*/2, Clock::Real());
  feed.Push("a");
  feed.Push("b");
  feed.Push("c");  // the third waiting: cut off
  EXPECT_EQ(feed.closed().code(), absl::StatusCode::kResourceExhausted);
  std::vector<std::string> records;
  uint64_t last = 0;
  EXPECT_FALSE(feed.Take(&records, &last, absl::InfiniteFuture()));
  absl::Status s = feed.AwaitSynced(2, absl::InfiniteFuture());  // at once
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cut off"), std::string::npos) << s;
}

TEST(JournalFeedTest, CloseEndsEveryWaitWithItsReason) {
  JournalFeed feed(0, 16, Clock::Real());
  feed.Push("a");
  std::vector<std::string> records;
  uint64_t last = 0;
  ASSERT_TRUE(feed.Take(&records, &last, absl::InfiniteFuture()));
  std::thread sender([&] {  // waits for a record, or the close
    std::vector<std::string> more;
    uint64_t count = 0;
    EXPECT_FALSE(feed.Take(&more, &count, absl::InfiniteFuture()));
  });
  std::thread closer([&] {
    feed.Close(absl::UnavailableError("the standby's stream ended"));
  });
  absl::Status s = feed.AwaitSynced(1, absl::InfiniteFuture());
  closer.join();
  sender.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "the standby's stream ended");
  feed.Push("b");  // nothing once closed
  EXPECT_EQ(feed.pushed(), 1u);
}

}  // namespace
}  // namespace plexus
