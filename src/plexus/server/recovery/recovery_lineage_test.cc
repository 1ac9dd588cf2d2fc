// Recovery from a second lost host after a first recovery, driven directly
// on the server's records: the lineage a first recovery leaves (kept until
// the next spare joins, through the new ids of what it recomputed) lets the
// next one rebuild what it loses. One loss: recovery_test.cc.
#include <set>

#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/job_records.h"
#include "plexus/server/recovery/recovery_test_util.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

// Between a spare taking a lost host's place and the next spare joining,
// a call that finishes keeps its inputs for its split output: a loss
// after the next spare joined rebuilds that output from them. Found by
// the elastic example's chaos test (two hosts lost in consecutive steps):
// with lineage dropped while no spare was registered, the momentum made
// in that window was lost (DATA_LOSS, "its input buffer ... is gone too").
TEST_F(RecoveryTest, LineageIsKeptUntilTheNextSpareJoins) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  Done(Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11))));
  ClientRecovery first = LoseHost1();  // spare0 takes host1's place
  const uint64_t once = Renamed(first.note).at(Id(11));
  Done(CallMaking(first, once)->call_seq);
  // No spare now. The next value is made from it, which the client then
  // drops (as a training loop drops last step's momentum).
  const uint64_t next = Route(MakeCall(Id(2), s, Id(11), kSplit, Id(12)));
  // Held (the call is not done): only the old id's entries go.
  EXPECT_EQ(Released(Release(Id(11), s)), (std::set<uint64_t>{Id(11)}));
  Done(next);
  EXPECT_TRUE(state_.records().keep_lineage());
  ASSERT_NE(BufferOf(once), nullptr);  // held for Id(12)'s lineage
  ClientRecovery second = LoseSpareToANewOne("killed too");
  EXPECT_EQ(second.note.lost_ids_size(), 0) << second.note.status().message();
  EXPECT_EQ(state_.recovery_counters().buffers_failed(), 0);
  // Id(12) from `once`, `once` from the put (replicated: a surviving copy).
  const auto renamed = Renamed(second.note);
  EXPECT_EQ(renamed.count(Id(12)), 1u);
  EXPECT_EQ(renamed.count(once), 1u);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 3);
}

// A value recomputed after one loss and lost again with the next host is
// recomputed again; its first id reads the newest.
TEST_F(RecoveryTest, AValueLostTwiceIsRecomputedTwice) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  Done(Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11))));
  ClientRecovery first = LoseHost1();
  const uint64_t once = Renamed(first.note).at(Id(11));
  Done(CallMaking(first, once)->call_seq);
  const int64_t spare1 =
      state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now()).id;
  WorkerLoss loss = state_.LoseWorker(spare_, "killed too");
  EXPECT_EQ(loss.spare, spare1);
  EXPECT_EQ(state_.slices().at(s).generation, 2u);
  ClientRecovery second = state_.RecoverClient(client_, loss, {});
  const auto renamed = Renamed(second.note);
  ASSERT_EQ(renamed.count(once), 1u);
  const uint64_t twice = renamed.at(once);
  EXPECT_EQ(second.note.lost_ids_size(), 0);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 2);
  ASSERT_NE(CallMaking(second, twice), nullptr);
  Done(CallMaking(second, twice)->call_seq);
  WorkerOps ops;
  const uint64_t later =
      Route(MakeCall(Id(2), s, Id(11), kSplit, Id(12)), &ops);
  for (const auto& [w, list] : ops) {
    EXPECT_NE(w, spare_);
    for (const auto& op : list) {
      if (!op.has_execute()) continue;
      for (const auto& task : op.execute().tasks()) {
        for (const auto& piece : task.inputs(0).pieces()) {
          EXPECT_EQ(piece.buffer_id(), twice);
        }
      }
    }
  }
  // Everything goes in the end.
  Done(later);
  Release(Id(11), s);
  Release(Id(12), s);
  Release(Id(10), s);
  EXPECT_TRUE(state_.records().calls().empty());
  EXPECT_TRUE(state_.records().buffers().empty());
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);
}

// A done call on another slice read a value that a first loss recomputed
// under a new id; a second loss, of the host of that call's output, finds
// the output's lineage through the new id. Found here: the call still held
// the old id (whose record recovery erased), so the new one was released
// under it and the output was lost (DATA_LOSS); and recovery ordered the
// work by routing order, in which the value's new producer comes after the
// call that reads it.
TEST_F(RecoveryTest, ALineageThroughARecomputedValueSurvivesASecondLoss) {
  const uint64_t s = Spread4();
  const uint64_t t = SliceOn(2, "host0").slice_id();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  Done(Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11))));
  proto::Call on_t = MakeCall(Id(2), t, Id(11), kSplit, Id(12));
  on_t.mutable_inputs(0)->set_slice_id(s);
  Done(Route(on_t));
  ClientRecovery first = LoseHost1();
  const auto renamed = Renamed(first.note);
  EXPECT_EQ(renamed.size(), 1u);  // Id(12) was not on host1
  Done(CallMaking(first, renamed.at(Id(11)))->call_seq);
  // The client lets go of Id(11): Id(12) may still need it, under its new
  // id, which stays (the old id's entries go).
  EXPECT_EQ(Released(Release(Id(11), s)), (std::set<uint64_t>{Id(11)}));
  const int64_t spare1 =
      state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now()).id;
  WorkerLoss loss = state_.LoseWorker(1, "killed too");
  EXPECT_EQ(loss.spare, spare1);
  ClientRecovery second = state_.RecoverClient(client_, loss, {});
  EXPECT_EQ(second.note.lost_ids_size(), 0) << second.note.status().message();
  const auto again = Renamed(second.note);
  ASSERT_EQ(again.count(Id(12)), 1u);
  const uint64_t newest = again.at(renamed.at(Id(11)));
  // Id(12)'s producer runs after the call that makes its input again, and
  // reads it under its newest id.
  const RoutedWork* input = CallMaking(second, newest);
  const RoutedWork* output = CallMaking(second, again.at(Id(12)));
  ASSERT_NE(input, nullptr);
  ASSERT_NE(output, nullptr);
  EXPECT_LT(input, output);
  for (const auto& [w, list] : output->ops) {
    for (const auto& op : list) {
      if (!op.has_execute()) continue;
      for (const auto& task : op.execute().tasks()) {
        for (const auto& piece : task.inputs(0).pieces()) {
          if (ClientOfBuffer(piece.buffer_id()) == client_) {
            EXPECT_EQ(piece.buffer_id(), newest);
          }
        }
      }
    }
  }
  // And everything goes in the end.
  Done(input->call_seq);
  Done(output->call_seq);
  Release(Id(12), t);
  Release(Id(10), s);
  EXPECT_TRUE(state_.records().calls().empty());
  EXPECT_TRUE(state_.records().buffers().empty());
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);
}

}  // namespace
}  // namespace plexus
