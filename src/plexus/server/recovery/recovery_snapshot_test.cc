// Snapshots (client.snapshot): a copy of each shard on the next shard's
// host, complete when every copy is reported arrived; what a loss restores
// from one, and what it makes again.
#include <algorithm>
#include <cstdint>
#include <map>

#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/recovery/recovery_test_util.h"

namespace plexus {
namespace {

// Snapshots X (split, four shards on two hosts) and reports `arrived` of
// its shard copies. Returns the copy's id.
class RecoverySnapshotTest : public RecoveryTest {
 protected:
  void SetUp() override {
    RecoveryTest::SetUp();
    s_ = Spread4();
    Register(Id(1), "identity", kReplicated, kSplit);
    Put(Id(10), s_, kReplicated);
    seq_ = Route(MakeCall(Id(1), s_, Id(10), kReplicated, Id(11)));
    Done(seq_);
  }
  uint64_t Snapshot(int arrived) {
    WorkerOps ops;
    state_.RouteSnapshot(client_, Id(11), &ops);
    uint64_t copy = 0;
    std::map<int, int64_t> holders;  // shard -> worker of its copy
    for (const auto& [w, list] : ops) {
      for (const auto& op : list) {
        if (!op.has_expect()) continue;
        copy = op.expect().buffer_id();
        EXPECT_TRUE(op.expect().report());
        EXPECT_TRUE(op.expect().owned());
        holders[op.expect().shard()] = w;
      }
    }
    // Each shard's copy is on another host than the shard.
    EXPECT_EQ(holders,
              (std::map<int, int64_t>{{0, 2}, {1, 2}, {2, 1}, {3, 1}}));
    EXPECT_EQ(state_.recovery_counters().snapshots_taken(), 1);
    for (int i = 0; i < arrived; ++i) {
      WorkerOps releases;
      state_.CopyArrived(copy, &releases);
    }
    return copy;
  }

  uint64_t s_ = 0;
  uint64_t seq_ = 0;
};

TEST_F(RecoverySnapshotTest, ACompleteSnapshotIsRestoredNotRecomputed) {
  const uint64_t copy = Snapshot(4);
  // Its producer need not hold its input for it any more.
  ASSERT_NE(CallOf(seq_), nullptr);
  EXPECT_FALSE(CallOf(seq_)->holding);
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(rec.note.old_ids_size(), 0);
  EXPECT_EQ(rec.note.lost_ids_size(), 0);
  for (const RoutedWork& w : rec.work) EXPECT_EQ(w.call_seq, 0u);
  // Shards 2 and 3 come from their copies on host0 (worker 1).
  auto restores = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_transfer() && op.transfer().buffer_id() == copy;
  });
  ASSERT_EQ(restores.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(restores[k].first, 1);
    EXPECT_EQ(restores[k].second.transfer().shard(), 2 + k);
    EXPECT_EQ(restores[k].second.transfer().dst_buffer_id(), Id(11));
    EXPECT_EQ(restores[k].second.transfer().dst_worker_id(), spare_);
    EXPECT_EQ(restores[k].second.transfer().dst_shard(), 2 + k);
  }
  // The copies of shards 0 and 1 were on the lost host: made again, now
  // on the spare.
  auto recopies = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_transfer() && op.transfer().buffer_id() == Id(11);
  });
  ASSERT_EQ(recopies.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(recopies[k].first, 1);
    EXPECT_EQ(recopies[k].second.transfer().shard(), k);
    EXPECT_EQ(recopies[k].second.transfer().dst_buffer_id(), copy);
    EXPECT_EQ(recopies[k].second.transfer().dst_worker_id(), spare_);
  }
  // Until they arrive, those two shards have one copy: the spare reports
  // them (a loss in that window would find no copy).
  auto expects = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_expect() && op.expect().buffer_id() == copy;
  });
  ASSERT_EQ(expects.size(), 2u);
  for (const auto& [w, op] : expects) EXPECT_TRUE(op.expect().report());
  EXPECT_EQ(state_.SnapshotRecopiesPending(), 2);
  WorkerOps arrived;
  state_.CopyArrived(copy, &arrived);
  EXPECT_EQ(state_.SnapshotRecopiesPending(), 1);
  state_.CopyArrived(copy, &arrived);
  EXPECT_EQ(state_.SnapshotRecopiesPending(), 0);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.shards_from_snapshots(), 2);
  EXPECT_EQ(c.buffers_restored(), 2);  // the put (replicated) and X
  EXPECT_EQ(c.calls_recomputed(), 0);
  EXPECT_EQ(c.buffers_failed(), 0);
}

TEST_F(RecoverySnapshotTest, AnIncompleteSnapshotIsNotRestoredFrom) {
  const uint64_t copy = Snapshot(3);
  ASSERT_NE(CallOf(seq_), nullptr);
  EXPECT_TRUE(CallOf(seq_)->holding);
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(Renamed(rec.note).count(Id(11)), 1u);
  auto restores = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_transfer() && op.transfer().buffer_id() == copy;
  });
  EXPECT_TRUE(restores.empty());
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.shards_from_snapshots(), 0);
  EXPECT_EQ(c.calls_recomputed(), 1);
  EXPECT_EQ(c.buffers_restored(), 1);  // the put
}

// A snapshot still being made when its value's host is lost is made again,
// of the value recomputed under its new id, after the call that makes it;
// once that copy is complete, a second loss restores from it. Found by the
// elastic example's chaos test: the copy from the lost host never came, so
// the snapshot stayed incomplete and the next loss recomputed the value
// from a lineage its producer had let go of.
TEST_F(RecoverySnapshotTest,
       ASnapshotBeingMadeIsMadeAgainOfTheRecomputedValue) {
  const uint64_t old_copy = Snapshot(2);
  EXPECT_EQ(state_.SnapshotsIncomplete(), 1);
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(state_.SnapshotsIncomplete(), 1);  // the new copy
  const uint64_t fresh = Renamed(rec.note).at(Id(11));
  const RoutedWork* call = CallMaking(rec, fresh);
  ASSERT_NE(call, nullptr);
  // The old copy goes; each shard of the new value is copied to the next
  // shard's host, after the call.
  EXPECT_EQ(Released(rec).count(old_copy), 1u);
  auto copies = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_transfer() && op.transfer().buffer_id() == fresh;
  });
  ASSERT_EQ(copies.size(), 4u);
  size_t call_at = rec.work.size(), copy_at = rec.work.size();
  for (size_t i = 0; i < rec.work.size(); ++i) {
    if (&rec.work[i] == call) call_at = i;
    for (const auto& [w, list] : rec.work[i].ops) {
      for (const auto& op : list) {
        if (op.has_transfer() && op.transfer().buffer_id() == fresh) {
          copy_at = std::min(copy_at, i);
        }
      }
    }
  }
  EXPECT_LT(call_at, copy_at);
  const uint64_t copy = copies[0].second.transfer().dst_buffer_id();
  EXPECT_NE(copy, old_copy);
  std::map<int, int64_t> holders;  // shard -> worker of its copy
  for (const auto& [w, op] : copies) {
    EXPECT_EQ(op.transfer().dst_buffer_id(), copy);
    holders[op.transfer().shard()] = op.transfer().dst_worker_id();
  }
  EXPECT_EQ(holders,
            (std::map<int, int64_t>{{0, spare_}, {1, spare_}, {2, 1}, {3, 1}}));
  // A late arrival of the old copy counts for nothing.
  WorkerOps ops;
  state_.CopyArrived(old_copy, &ops);
  Done(call->call_seq);
  for (int k = 0; k < 4; ++k) state_.CopyArrived(copy, &ops);
  EXPECT_EQ(state_.SnapshotsIncomplete(), 0);
  // Complete: a second loss (of the spare) restores it, recomputing nothing.
  ClientRecovery second = LoseSpareToANewOne("killed too");
  EXPECT_EQ(second.note.lost_ids_size(), 0) << second.note.status().message();
  EXPECT_EQ(second.note.old_ids_size(), 0);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.calls_recomputed(), 1);  // the first loss's
  EXPECT_EQ(c.shards_from_snapshots(), 2);
  EXPECT_EQ(c.buffers_failed(), 0);
}

// A snapshot being made of a value the client released (held back while a
// call that reads it runs): recovery lets the call go and the release goes
// with it, taking the snapshot; nothing is asked for again. (The server
// read a snapshot record that the release had erased: SIGILL.)
TEST_F(RecoverySnapshotTest, ASnapshotOfAReleasedValueIsNotMadeAgain) {
  Register(Id(2), "identity", kSplit, kSplit);
  const uint64_t old_copy = Snapshot(2);
  Route(MakeCall(Id(2), s_, Id(11), kSplit, Id(12)));
  Release(Id(11), s_);  // held: the call reads it
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(rec.note.lost_ids_size(), 0) << rec.note.status().message();
  EXPECT_EQ(Released(rec).count(old_copy), 1u);
  EXPECT_EQ(state_.SnapshotsIncomplete(), 0);
  EXPECT_EQ(state_.recovery_counters().snapshots_taken(), 1);
}

// A buffer snapshotted twice: a loss after the second request still finds
// the value. The first copy was complete, so its producer let go of its
// input (which its client then released); the second request used to drop
// that copy while a new one was made, and the value was lost (DATA_LOSS).
TEST_F(RecoverySnapshotTest, ASecondSnapshotOfABufferKeepsItRecoverable) {
  Snapshot(4);
  EXPECT_TRUE(Released(Release(Id(10), s_)).count(Id(10)));
  WorkerOps ops;
  state_.RouteSnapshot(client_, Id(11), &ops);
  // The complete copy is the same value: it stays, and no other is made.
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(state_.recovery_counters().snapshots_taken(), 1);
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(rec.note.lost_ids_size(), 0) << rec.note.status().message();
  EXPECT_EQ(state_.recovery_counters().buffers_failed(), 0);
  EXPECT_EQ(state_.recovery_counters().shards_from_snapshots(), 2);
}

}  // namespace
}  // namespace plexus
