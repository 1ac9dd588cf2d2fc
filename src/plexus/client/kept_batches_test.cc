// KeptBatches driven directly: the order a resume sends kept calls in is
// the order they left the queue, not the order the session's threads kept
// them in.
#include "plexus/client/kept_batches.h"

#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

proto::ClientToServer Batch(std::vector<uint64_t> call_ids) {
  proto::ClientToServer b;
  for (uint64_t id : call_ids) b.add_ops()->mutable_call()->set_call_id(id);
  return b;
}

std::vector<uint64_t> CallIds(const KeptBatches& kept) {
  std::vector<uint64_t> ids;
  kept.ForEach([&](const proto::ClientToServer& b) {
    for (const proto::ClientOp& op : b.ops())
      ids.push_back(op.call().call_id());
  });
  return ids;
}

// The sender was writing batch 1 when the stream ended; the reader kept
// what was still queued (batch 2) before the sender's write returned and
// it kept batch 1. A resume sends batch 1's calls first: batch 2's read
// their outputs. Kept in arrival order, they went 2 then 1.
TEST(KeptBatchesTest, BatchesKeptOutOfOrderGoInTheOrderTheyLeftTheQueue) {
  KeptBatches kept(100);
  kept.Keep(Batch({1, 2}), /*seq=*/0);
  kept.Keep(Batch({5, 6}), /*seq=*/2);  // the reader, first
  kept.Keep(Batch({3, 4}), /*seq=*/1);  // the sender, once its write ended
  kept.Keep(Batch({7}), /*seq=*/3);
  EXPECT_EQ(CallIds(kept), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(kept.ops(), 7u);
}

TEST(KeptBatchesTest, PastItsBoundTheOldestGoButNeverTheLast) {
  KeptBatches kept(3);
  kept.Keep(Batch({1, 2}), 0);
  kept.Keep(Batch({3, 4}), 1);  // 4 ops: the oldest goes
  EXPECT_EQ(CallIds(kept), (std::vector<uint64_t>{3, 4}));
  kept.Keep(Batch({5, 6, 7, 8}), 2);  // alone past the bound: kept
  EXPECT_EQ(CallIds(kept), (std::vector<uint64_t>{5, 6, 7, 8}));
  kept.Clear();
  EXPECT_EQ(kept.ops(), 0u);
  EXPECT_EQ(kept.batches(), 0u);
}

}  // namespace
}  // namespace plexus
