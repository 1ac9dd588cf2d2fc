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

TEST(IdsTest, AShardKeyHashesAndComparesByBufferAndShard) {
  absl::flat_hash_set<ShardKey> keys = {{1, 0}, {1, 1}, {2, 0}};
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_TRUE(keys.contains(ShardKey{1, 1}));
  EXPECT_FALSE(keys.contains(ShardKey{2, 1}));
}

}  // namespace
}  // namespace plexus
