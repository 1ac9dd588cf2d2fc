#include "plexus/journal/internal/record.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace plexus::journal::internal {
namespace {

using ::testing::HasSubstr;

TEST(RecordTest, DecodesWhatItEncodes) {
  std::string value = EncodeRecord(7, 3, "hello");
  EXPECT_EQ(value.size(), kHeaderBytes + 5);
  absl::StatusOr<JournalRecord> r = DecodeRecord(7, value);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->seq, 7u);
  EXPECT_EQ(r->type, 3);
  EXPECT_EQ(r->payload, "hello");
}

TEST(RecordTest, EveryFlippedBitIsCaught) {
  const std::string good = EncodeRecord(42, 9, "payload bytes");
  for (size_t i = 0; i < good.size() * 8; ++i) {
    std::string bad = good;
    bad[i / 8] = static_cast<char>(bad[i / 8] ^ (1 << (i % 8)));
    absl::StatusOr<JournalRecord> r = DecodeRecord(42, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "bit " << i;
  }
}

TEST(RecordTest, SaysWhyARecordIsNotTrusted) {
  const std::string good = EncodeRecord(5, 1, "abcdef");
  EXPECT_THAT(DecodeRecord(5, good.substr(0, 10)).status().message(),
              HasSubstr("record 5: truncated: 10 bytes"));
  EXPECT_THAT(
      DecodeRecord(5, good.substr(0, good.size() - 2)).status().message(),
      HasSubstr("record 5: torn: its length field says 6 payload "
                "bytes, the store holds 4"));
  std::string flipped = good;
  flipped.back() ^= 1;
  EXPECT_THAT(DecodeRecord(5, flipped).status().message(),
              HasSubstr("record 5: checksum mismatch (stored 0x"));
  EXPECT_THAT(DecodeRecord(6, good).status().message(),
              HasSubstr("record 6: misplaced: it says it is record 5"));
}

TEST(ReplayReaderTest, ReadsAContiguousJournal) {
  ReplayReader reader("/j");
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    EXPECT_TRUE(reader.Add(seq, EncodeRecord(seq, 1, "x")));
  }
  Replay replay = reader.Finish(0);
  EXPECT_TRUE(replay.tail.ok());
  ASSERT_EQ(replay.records.size(), 3u);
  EXPECT_EQ(replay.records[2].seq, 3u);
}

TEST(ReplayReaderTest, ASnapshotStartsAJournal) {
  ReplayReader reader("/j");
  EXPECT_TRUE(reader.Add(10, EncodeRecord(10, kSnapshotType, "state")));
  EXPECT_TRUE(reader.Add(11, EncodeRecord(11, 1, "x")));
  EXPECT_FALSE(reader.Add(12, EncodeRecord(12, kSnapshotType, "again")));
  Replay replay = reader.Finish(1);
  EXPECT_EQ(replay.records.size(), 2u);
  EXPECT_THAT(replay.tail.message(),
              HasSubstr("record 12: a snapshot after record 11"));
}

TEST(ReplayReaderTest, StopsAtAGapAndSaysWhere) {
  ReplayReader reader("/data/j.db");
  EXPECT_TRUE(reader.Add(1, EncodeRecord(1, 1, "a")));
  EXPECT_TRUE(reader.Add(2, EncodeRecord(2, 1, "b")));
  EXPECT_FALSE(reader.Add(4, EncodeRecord(4, 1, "d")));
  EXPECT_FALSE(reader.Add(5, EncodeRecord(5, 1, "e")));  // after the stop
  EXPECT_EQ(reader.first_bad_key(), 4u);
  EXPECT_EQ(reader.last_seq(), 2u);
  Replay replay = reader.Finish(2);
  EXPECT_EQ(replay.records.size(), 2u);
  EXPECT_EQ(replay.tail.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(replay.tail.message(),
            "journal /data/j.db: replay stopped after record 2: record 4: a "
            "gap after record 2 (missing 3); 2 record(s) from 4 on moved "
            "aside, not replayed");
}

TEST(ReplayReaderTest, AJournalMustStartAtOneOrWithASnapshot) {
  ReplayReader reader("/j");
  EXPECT_FALSE(reader.Add(3, EncodeRecord(3, 1, "c")));
  EXPECT_THAT(reader.Finish(1).tail.message(),
              HasSubstr("record 3: the journal starts there"));
}

}  // namespace
}  // namespace plexus::journal::internal
