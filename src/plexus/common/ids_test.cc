// The id layout (common/ids.h): an id names its client, and the ids the
// server makes never meet the client's own.
#include "plexus/common/ids.h"

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

static_assert(ClientOfBuffer(ClientMadeId(7, 1)) == 7);
static_assert(ClientOfBuffer(ServerMadeId(7, 1)) == 7);
static_assert(!IsServerMade(ClientMadeId(7, 1)));
static_assert(IsServerMade(ServerMadeId(7, 1)));
static_assert(ClientOfBuffer(ClientMadeId(kServerClientId, 3)) ==
              kServerClientId);

TEST(IdsTest, ClientAndServerMadeIdsOfOneClientNeverMeet) {
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t client : {uint64_t{1}, uint64_t{2}, kServerClientId - 1}) {
    for (uint64_t n = 1; n <= 1000; ++n) {
      EXPECT_TRUE(seen.insert(ClientMadeId(client, n)).second);
      EXPECT_TRUE(seen.insert(ServerMadeId(client, n)).second);
      EXPECT_EQ(ClientOfBuffer(ClientMadeId(client, n)), client);
      EXPECT_EQ(ClientOfBuffer(ServerMadeId(client, n)), client);
    }
  }
}

// An earlier server's temporaries are behind the floor; the floor's own,
// those after it, and those of a counter that wrapped past the layout's end
// since are not.
static_assert(IsEarlierTemporary(1, 2));
static_assert(IsEarlierTemporary(5, 1 << 20));
static_assert(!IsEarlierTemporary(1 << 20, 1 << 20));
static_assert(!IsEarlierTemporary((1 << 20) + 1, 1 << 20));
static_assert(IsEarlierTemporary(kMaxIdCount, 3));   // before the wrap
static_assert(!IsEarlierTemporary(3, kMaxIdCount));  // after the wrap
static_assert(!IsEarlierTemporary(1, 1));

static_assert(!IsServerMade(ClientMadeId(7, kMaxIdCount)));
static_assert(ClientOfBuffer(ClientMadeId(7, kMaxIdCount)) == 7);
static_assert(ClientOfBuffer(ServerMadeId(7, kMaxIdCount)) == 7);

TEST(IdsTest, ACounterRefusesTheIdsPastTheLayoutsLimit) {
  // The last id of each half still names its client and its half; the
  // next would be one of the server's (a client's count) or one made
  // before (the server's), and further on the next client's: refused,
  // naming what ran out.
  EXPECT_EQ(ClientMadeId(7, kMaxIdCount + 1), ServerMadeId(7, 0));
  EXPECT_EQ(ServerMadeId(7, kMaxIdCount + 2), ServerMadeId(7, 1));
  EXPECT_EQ(ClientOfBuffer(ClientMadeId(4, uint64_t{1} << 40)), 5u);
  EXPECT_TRUE(CheckIdsLeft("x", 1).ok());
  EXPECT_TRUE(CheckIdsLeft("x", kMaxIdCount).ok());
  EXPECT_TRUE(CheckIdsLeft("x", kMaxIdCount - 2, 3).ok());
  absl::Status s = CheckIdsLeft("this client's ids", kMaxIdCount + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "this client's ids ran out: an id counts at most 549755813887 of "
            "them (common/ids.h), and 549755813887 were given; ids past that "
            "would be another's");
  // A batch that would cross the limit is refused whole, and no count
  // wraps around to look small.
  EXPECT_TRUE(absl::IsResourceExhausted(CheckIdsLeft("x", kMaxIdCount, 2)));
  EXPECT_TRUE(absl::IsResourceExhausted(CheckIdsLeft("x", 2, ~uint64_t{0})));
  EXPECT_TRUE(absl::IsResourceExhausted(CheckIdsLeft("x", ~uint64_t{0})));
  EXPECT_TRUE(absl::IsResourceExhausted(CheckIdsLeft("x", 0)));
}

TEST(IdsTest, AShardKeyHashesAndComparesByBufferAndShard) {
  absl::flat_hash_set<ShardKey> keys = {{1, 0}, {1, 1}, {2, 0}};
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_TRUE(keys.contains(ShardKey{1, 1}));
  EXPECT_FALSE(keys.contains(ShardKey{2, 1}));
}

}  // namespace
}  // namespace plexus
