#include "plexus/journal/journal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "plexus/journal/internal/record.h"
#include "plexus/journal/internal/sqlite_store.h"
#include "plexus/journal/internal/store.h"

namespace plexus::journal {
namespace {

using internal::JournalStore;
using internal::StoredRecord;
using ::testing::HasSubstr;

// A fresh directory per test, removed after it.
class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/journal_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/journal.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Journal> OpenOrDie(Replay* replay, Clock* clock = nullptr) {
    JournalOptions options;
    options.path = path_;
    if (clock != nullptr) options.clock = clock;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(options, replay);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *std::move(j) : nullptr;
  }

  // Runs `sql` on the closed journal's file, as a person with the sqlite3
  // shell would.
  void Edit(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error),
              SQLITE_OK)
        << (error ? error : "");
    sqlite3_free(error);
    sqlite3_close(db);
  }

  std::string dir_;
  std::string path_;
};

std::string Payload(uint64_t seq) { return absl::StrCat("record-", seq); }

TEST_F(JournalTest, ReplaysWhatWasDurableInOrder) {
  Replay replay;
  {
    auto j = OpenOrDie(&replay);
    EXPECT_TRUE(replay.records.empty());
    EXPECT_TRUE(replay.tail.ok());
    for (uint64_t seq = 1; seq <= 100; ++seq) {
      absl::StatusOr<uint64_t> got = j->Append(1 + seq % 3, Payload(seq));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, seq);
    }
    EXPECT_TRUE(j->AwaitDurable(100, absl::InfiniteFuture()).ok());
    EXPECT_EQ(j->durable_seq(), 100u);
  }
  auto j = OpenOrDie(&replay);
  ASSERT_EQ(replay.records.size(), 100u);
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    EXPECT_EQ(replay.records[seq - 1].seq, seq);
    EXPECT_EQ(replay.records[seq - 1].type, 1 + seq % 3);
    EXPECT_EQ(replay.records[seq - 1].payload, Payload(seq));
  }
  EXPECT_TRUE(replay.tail.ok());
  EXPECT_EQ(j->durable_seq(), 100u);
  EXPECT_EQ(*j->Append(1, "next"), 101u);
}

TEST_F(JournalTest, RejectsTheSnapshotTypeAndUnknownSeqs) {
  Replay replay;
  auto j = OpenOrDie(&replay);
  EXPECT_EQ(j->Append(kSnapshotType, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(j->AwaitDurable(5, absl::InfiniteFuture()).message(),
              HasSubstr("record 5 was never appended (last is 0)"));
}

TEST_F(JournalTest, ASecondOpenOfTheSamePathFails) {
  Replay replay;
  auto j = OpenOrDie(&replay);
  JournalOptions options;
  options.path = path_;
  Replay other;
  absl::StatusOr<std::unique_ptr<Journal>> second =
      Journal::Open(options, &other);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(path_));
}

TEST_F(JournalTest, AFileThatIsNotAJournalIsAClearError) {
  std::ofstream(path_) << std::string(8192, 'x');
  JournalOptions options;
  options.path = path_;
  Replay replay;
  absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(options, &replay);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(j.status().message(), HasSubstr(path_));
  EXPECT_THAT(j.status().message(), HasSubstr("not a database"));
}

TEST_F(JournalTest, DurableCallbacksRunOnceInOrderOffTheCaller) {
  Replay replay;
  std::vector<uint64_t> seen;
  absl::Notification all;
  const std::thread::id caller = std::this_thread::get_id();
  {
    auto j = OpenOrDie(&replay);
    for (uint64_t seq = 1; seq <= 50; ++seq) {
      ASSERT_TRUE(j->Append(1, Payload(seq)).ok());
      j->OnDurable(seq, [&, seq](absl::Status s) {
        EXPECT_TRUE(s.ok()) << s;
        EXPECT_NE(std::this_thread::get_id(), caller);
        seen.push_back(seq);  // one notification thread: no lock needed
        if (seq == 50) all.Notify();
      });
    }
    all.WaitForNotification();
    j->OnDurable(3, [&](absl::Status s) { seen.push_back(s.ok() ? 1000 : 0); });
  }  // the destructor runs what was posted
  ASSERT_EQ(seen.size(), 51u);
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i + 1);
  EXPECT_EQ(seen[50], 1000u);
}

// A store whose writes wait until the test opens the gate, and which fails
// every write once told to: group commit and errors, deterministically.
class GatedStore : public JournalStore {
 public:
  struct Control {
    absl::Mutex mu;
    int writes_started ABSL_GUARDED_BY(mu) = 0;
    int gate_opens ABSL_GUARDED_BY(mu) = 0;  // writes allowed to finish
    bool fail ABSL_GUARDED_BY(mu) = false;
    std::vector<size_t> batch_sizes ABSL_GUARDED_BY(mu);
  };
  explicit GatedStore(Control* control) : c_(control) {}
  absl::Status Write(absl::Span<const StoredRecord> records) override {
    absl::MutexLock lock(&c_->mu);
    const int mine = ++c_->writes_started;
    c_->batch_sizes.push_back(records.size());
    auto open = [this, mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_->mu) {
      return c_->gate_opens >= mine;
    };
    c_->mu.Await(absl::Condition(&open));
    if (c_->fail) return absl::InternalError("journal /gated: fsync: EIO");
    return absl::OkStatus();
  }
  absl::Status Scan(
      absl::FunctionRef<bool(uint64_t, absl::string_view)>) override {
    return absl::OkStatus();
  }
  absl::Status ReplacePrefix(const StoredRecord&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> DiscardFrom(uint64_t) override { return 0; }

 private:
  Control* const c_;
};

std::unique_ptr<Journal> OpenGated(GatedStore::Control* control,
                                   Clock* clock = Clock::Real()) {
  JournalOptions options;
  options.path = "/gated";
  options.clock = clock;
  Replay replay;
  return *Journal::OpenWithStore(options, std::make_unique<GatedStore>(control),
                                 &replay);
}

void AwaitWritesStarted(GatedStore::Control* c, int n) {
  absl::MutexLock lock(&c->mu);
  auto started = [c, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
    return c->writes_started >= n;
  };
  c->mu.Await(absl::Condition(&started));
}

void OpenGate(GatedStore::Control* c, int writes) {
  absl::MutexLock lock(&c->mu);
  c->gate_opens = writes;
}

TEST(GroupCommitTest, RecordsAppendedDuringASyncShareTheNextOne) {
  GatedStore::Control control;
  auto j = OpenGated(&control);
  ASSERT_TRUE(j->Append(1, "first").ok());
  AwaitWritesStarted(&control, 1);  // record 1's write is in progress
  for (int i = 0; i < 99; ++i) ASSERT_TRUE(j->Append(1, "more").ok());
  EXPECT_EQ(j->durable_seq(), 0u);
  OpenGate(&control, 2);
  EXPECT_TRUE(j->AwaitDurable(100, absl::InfiniteFuture()).ok());
  EXPECT_EQ(j->stats().synced_batches, 2u);
  absl::MutexLock lock(&control.mu);
  EXPECT_THAT(control.batch_sizes, ::testing::ElementsAre(1, 99));
}

TEST(GroupCommitTest, AwaitDurableEndsAtItsDeadlineOnTheInjectedClock) {
  GatedStore::Control control;
  FakeClock clock;
  auto j = OpenGated(&control, &clock);
  ASSERT_TRUE(j->Append(1, "x").ok());
  absl::Status result;
  std::thread waiter(
      [&] { result = j->AwaitDurable(1, clock.Now() + absl::Seconds(5)); });
  clock.AwaitWaiters(1);
  clock.Advance(absl::Seconds(6));
  waiter.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(result.message(),
              HasSubstr("record 1 not durable by the deadline (durable up "
                        "to 0)"));
  OpenGate(&control, 1);
}

TEST(GroupCommitTest, AFailedSyncStopsTheJournalAndEveryWaiterHearsIt) {
  GatedStore::Control control;
  auto j = OpenGated(&control);
  ASSERT_TRUE(j->Append(1, "ok").ok());
  OpenGate(&control, 1);
  ASSERT_TRUE(j->AwaitDurable(1, absl::InfiniteFuture()).ok());
  ASSERT_TRUE(j->Append(1, "lost").ok());
  absl::Notification called;
  absl::Status from_callback;
  j->OnDurable(2, [&](absl::Status s) {
    from_callback = s;
    called.Notify();
  });
  {
    absl::MutexLock lock(&control.mu);
    control.fail = true;
    control.gate_opens = 2;
  }
  absl::Status s = j->AwaitDurable(2, absl::InfiniteFuture());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("journal /gated: fsync: EIO (the journal "
                                     "stopped: records after 1 are not "
                                     "durable)"));
  called.WaitForNotification();
  EXPECT_EQ(from_callback, s);
  EXPECT_EQ(j->Append(1, "refused").status(), s);
  EXPECT_EQ(j->durable_seq(), 1u);
}

TEST_F(JournalTest, CompactionReplacesThePrefixBySnapshot) {
  Replay replay;
  {
    auto j = OpenOrDie(&replay);
    for (uint64_t seq = 1; seq <= 10; ++seq)
      ASSERT_TRUE(j->Append(1, Payload(seq)).ok());
    EXPECT_TRUE(j->Compact(6, "state after 6").ok());
    EXPECT_EQ(j->Compact(6, "again").code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(j->Compact(11, "future").message(),
                HasSubstr("cannot compact up to record 11"));
    for (uint64_t seq = 11; seq <= 13; ++seq)
      ASSERT_TRUE(j->Append(2, Payload(seq)).ok());
    EXPECT_TRUE(j->AwaitDurable(13, absl::InfiniteFuture()).ok());
  }
  auto j = OpenOrDie(&replay);
  EXPECT_TRUE(replay.tail.ok()) << replay.tail;
  ASSERT_EQ(replay.records.size(), 8u);
  EXPECT_EQ(replay.records[0].seq, 6u);
  EXPECT_EQ(replay.records[0].type, kSnapshotType);
  EXPECT_EQ(replay.records[0].payload, "state after 6");
  for (size_t i = 1; i < 8; ++i) {
    EXPECT_EQ(replay.records[i].seq, 6 + i);
    EXPECT_EQ(replay.records[i].payload, Payload(6 + i));
  }
  EXPECT_EQ(j->Compact(5, "older").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(j->Compact(13, "state after 13").ok());
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

TEST_F(JournalTest, ItsSizeStaysBoundedWhenCompactedOverALongRun) {
  Replay replay;
  auto j = OpenOrDie(&replay);
  const std::string record(200, 'r');
  std::vector<int64_t> sizes;
  for (int round = 0; round < 30; ++round) {
    for (int i = 0; i < 500; ++i) ASSERT_TRUE(j->Append(1, record).ok());
    ASSERT_TRUE(j->Compact(j->last_seq(), std::string(4096, 's')).ok());
    sizes.push_back(FileSize(path_) + FileSize(path_ + "-wal"));
  }
  // 15000 records of 218 bytes went through it (3.3 MB); what stays is
  // one round's worth, whose pages are reused.
  EXPECT_LE(sizes.back(), sizes[2] + 64 * 1024)
      << "sizes after rounds 3 and 30: " << sizes[2] << ", " << sizes.back();
  EXPECT_LT(sizes.back(), 1 << 20);
}

TEST_F(JournalTest, ACorruptRecordEndsTheReplayThereAndSaysWhy) {
  Replay replay;
  {
    auto j = OpenOrDie(&replay);
    for (uint64_t seq = 1; seq <= 20; ++seq)
      ASSERT_TRUE(j->Append(1, Payload(seq)).ok());
  }
  // The last byte of record 15 overwritten on disk.
  Edit(
      "UPDATE records SET record = CAST(substr(record, 1, length(record) - "
      "1) || x'00' AS BLOB) WHERE seq = 15");
  {
    auto j = OpenOrDie(&replay);
    ASSERT_EQ(replay.records.size(), 14u);
    EXPECT_EQ(replay.records.back().payload, Payload(14));
    EXPECT_EQ(replay.tail.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(replay.tail.message(),
                HasSubstr(absl::StrCat("journal ", path_,
                                       ": replay stopped after record 14: "
                                       "record 15: checksum mismatch")));
    EXPECT_THAT(replay.tail.message(),
                HasSubstr("6 record(s) from 15 on moved aside"));
    EXPECT_EQ(replay.discarded, 6u);
    EXPECT_EQ(*j->Append(1, "after the repair"), 15u);
  }
  auto j = OpenOrDie(&replay);
  EXPECT_TRUE(replay.tail.ok()) << replay.tail;
  ASSERT_EQ(replay.records.size(), 15u);
  EXPECT_EQ(replay.records.back().payload, "after the repair");
}

TEST_F(JournalTest, ATornRecordEndsTheReplayThere) {
  Replay replay;
  {
    auto j = OpenOrDie(&replay);
    for (uint64_t seq = 1; seq <= 20; ++seq)
      ASSERT_TRUE(j->Append(1, Payload(seq)).ok());
  }
  Edit("UPDATE records SET record = substr(record, 1, 25) WHERE seq = 20");
  OpenOrDie(&replay);
  EXPECT_EQ(replay.records.size(), 19u);
  EXPECT_THAT(replay.tail.message(),
              HasSubstr("record 20: torn: its length field says 9 payload "
                        "bytes, the store holds 7"));
}

TEST_F(JournalTest, AMissingRecordEndsTheReplayAtTheGap) {
  Replay replay;
  {
    auto j = OpenOrDie(&replay);
    for (uint64_t seq = 1; seq <= 20; ++seq)
      ASSERT_TRUE(j->Append(1, Payload(seq)).ok());
  }
  Edit("DELETE FROM records WHERE seq = 8");
  OpenOrDie(&replay);
  EXPECT_EQ(replay.records.size(), 7u);
  EXPECT_THAT(replay.tail.message(),
              HasSubstr("record 9: a gap after record 7 (missing 8)"));
  EXPECT_EQ(replay.discarded, 12u);
}

}  // namespace
}  // namespace plexus::journal
