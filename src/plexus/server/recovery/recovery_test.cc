// Recovery from a lost host (ClusterState::LoseWorker, RecoverClient),
// driven directly on the server's records: what a recovery does with the
// client's values and work (copied, put again, recomputed or lost; calls
// run again, work at admission routed again) and the ops and notes it
// makes. Which host takes the lost one's place: recovery_spare_test.cc;
// a second loss after a recovery: recovery_lineage_test.cc; snapshots:
// recovery_snapshot_test.cc; the records on their own: job_records_test.cc.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/job_records.h"
#include "plexus/server/recovery/recovery_test_util.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

// The client's two slices: `wide` spread over host0 and host1 (Spread4),
// `narrow` of `narrow_devices` on host0 alone; a value on each (Id(10),
// Id(20)) and a call of program Id(1) ("scale") reading each, making
// Id(11) and Id(21): their seqs.
struct TwoSliceCalls {
  uint64_t wide = 0, narrow = 0, on_wide = 0, on_narrow = 0;
};

class TwoSlicesTest : public RecoveryTest {
 protected:
  TwoSliceCalls RouteOnTwoSlices(int narrow_devices) {
    TwoSliceCalls t;
    t.wide = Spread4();
    t.narrow = SliceOn(narrow_devices, "host0").slice_id();
    Register(Id(1), "scale", kReplicated, kReplicated);
    Put(Id(10), t.wide, kReplicated);
    Put(Id(20), t.narrow, kReplicated);
    t.on_wide = Route(MakeCall(Id(1), t.wide, Id(10), kReplicated, Id(11)));
    t.on_narrow = Route(MakeCall(Id(1), t.narrow, Id(20), kReplicated, Id(21)));
    return t;
  }
};

TEST_F(RecoveryTest, AReplicatedValueIsCopiedFromASurvivingShard) {
  const uint64_t s = Spread4();
  Register(Id(1), "scale", kReplicated, kReplicated);
  Put(Id(10), s, kReplicated);
  const uint64_t seq = Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  Done(seq);
  ClientRecovery rec = LoseHost1();
  ASSERT_EQ(rec.note.remapped_size(), 1);
  EXPECT_EQ(rec.note.remapped(0).generation(), 1u);
  EXPECT_EQ(rec.note.worker_id(), 2);
  EXPECT_EQ(rec.note.old_ids_size(), 0);
  EXPECT_EQ(rec.note.lost_ids_size(), 0);
  EXPECT_EQ(rec.note.reput_ids_size(), 0);
  for (uint64_t id : {Id(10), Id(11)}) {
    auto transfers = Ops(rec, [&](const proto::WorkerOp& op) {
      return op.has_transfer() && op.transfer().buffer_id() == id;
    });
    auto expects = Ops(rec, [&](const proto::WorkerOp& op) {
      return op.has_expect() && op.expect().buffer_id() == id;
    });
    ASSERT_EQ(transfers.size(), 2u) << id;
    ASSERT_EQ(expects.size(), 2u) << id;
    for (int k = 0; k < 2; ++k) {
      const auto& [from, t] = transfers[k];
      EXPECT_EQ(from, 1);  // the surviving host
      EXPECT_LT(t.transfer().shard(), 2);
      EXPECT_EQ(t.transfer().dst_worker_id(), spare_);
      EXPECT_EQ(t.transfer().dst_buffer_id(), id);
      EXPECT_EQ(t.transfer().dst_shard(), 2 + k);
      EXPECT_EQ(t.transfer().dst_device(), k);
      const auto& [to, e] = expects[k];
      EXPECT_EQ(to, spare_);
      EXPECT_EQ(e.expect().shard(), 2 + k);
      EXPECT_TRUE(e.expect().owned());
      EXPECT_EQ(e.expect().src_worker_id(), 1);
      EXPECT_EQ(e.expect().device(), k);
    }
  }
  // Nothing ran again.
  for (const RoutedWork& w : rec.work) EXPECT_EQ(w.call_seq, 0u);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.buffers_restored(), 2);
  EXPECT_EQ(c.calls_recomputed(), 0);
  EXPECT_EQ(c.buffers_failed(), 0);
}

TEST_F(RecoveryTest, APutsLostShardsAreDeclaredOnTheSpareAndPutAgain) {
  const uint64_t s = Spread4();
  Put(Id(10), s, kSplit);
  Put(Id(12), SliceOn(2, "host0").slice_id(), kSplit);  // not on the lost host
  ClientRecovery rec = LoseHost1();
  auto declares =
      Ops(rec, [](const proto::WorkerOp& op) { return op.has_declare(); });
  ASSERT_EQ(declares.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(declares[k].first, spare_);
    EXPECT_EQ(declares[k].second.declare().buffer_id(), Id(10));
    EXPECT_EQ(declares[k].second.declare().shard(), 2 + k);
    EXPECT_EQ(declares[k].second.declare().device(), k);
  }
  EXPECT_EQ(std::vector<uint64_t>(rec.note.reput_ids().begin(),
                                  rec.note.reput_ids().end()),
            (std::vector<uint64_t>{Id(10), Id(10)}));
  EXPECT_EQ(std::vector<int32_t>(rec.note.reput_shards().begin(),
                                 rec.note.reput_shards().end()),
            (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(state_.recovery_counters().shards_reput(), 2);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 0);
}

// A put declared by the map from before a remap (the client put its
// shards while the host was being lost, and the server routed the put
// after the recovery): the client is asked to put every shard again, to
// where the map says now; a put by the current map is not.
TEST_F(RecoveryTest, APutByAMapOlderThanTheSlicesIsPutAgain) {
  const uint64_t s = Spread4();
  LoseHost1();
  proto::PutDecl put;
  put.set_slice_id(s);
  *put.mutable_arg() = ToProto(kSplit);
  for (uint64_t generation : {0, 1}) {
    put.set_buffer_id(Id(40 + generation));
    put.set_slice_generation(generation);
    WorkerOps ops;
    proto::Recovery reput;
    ASSERT_TRUE(state_.RoutePut(client_, put, &ops, &reput).ok());
    // Declared on the current map either way: the spare holds 2 and 3.
    ASSERT_TRUE(ops.count(spare_));
    EXPECT_EQ(ops.at(spare_).size(), 2u);
    if (generation == 0) {
      EXPECT_EQ(reput.reput_ids_size(), 4);
      EXPECT_EQ(std::vector<int32_t>(reput.reput_shards().begin(),
                                     reput.reput_shards().end()),
                (std::vector<int32_t>{0, 1, 2, 3}));
    } else {
      EXPECT_EQ(reput.reput_ids_size(), 0);
    }
  }
}

TEST_F(RecoveryTest, ASplitValueIsRecomputedUnderNewIds) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  const proto::Call first = MakeCall(Id(1), s, Id(10), kReplicated, Id(11));
  const uint64_t seq = Route(first);
  Done(seq);
  ClientRecovery rec = LoseHost1();
  const auto renamed = Renamed(rec.note);
  ASSERT_EQ(renamed.size(), 1u);
  ASSERT_EQ(renamed.count(Id(11)), 1u);
  const uint64_t fresh = renamed.at(Id(11));
  EXPECT_NE(fresh, Id(11));
  EXPECT_EQ(ClientOfBuffer(fresh), client_);  // in the client's namespace
  EXPECT_EQ(rec.note.lost_ids_size(), 0);
  // The producer runs again, after its input was copied to the spare.
  const RoutedWork* again = CallMaking(rec, fresh);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->call_seq, seq);
  const proto::WorkerOp& exec = again->ops.at(spare_).back();
  ASSERT_TRUE(exec.has_execute());
  EXPECT_NE(exec.execute().call_id(), first.call_id());
  EXPECT_EQ(exec.execute().tasks_size(), 2);
  EXPECT_TRUE(again->ops.count(1));
  size_t copy_at = rec.work.size(), call_at = rec.work.size();
  for (size_t i = 0; i < rec.work.size(); ++i) {
    for (const auto& [w, list] : rec.work[i].ops) {
      for (const auto& op : list) {
        if (op.has_transfer() && op.transfer().buffer_id() == Id(10)) {
          copy_at = std::min(copy_at, i);
        }
      }
    }
    if (&rec.work[i] == again) call_at = i;
  }
  EXPECT_LT(copy_at, call_at);
  // The old value's record and bytes go; the new one is the call's. Its
  // entries stay until the client releases the old id (a read of it that
  // has not heard of the new one finds them).
  EXPECT_EQ(Released(rec).count(Id(11)), 0u);
  EXPECT_EQ(CallOf(seq), nullptr);
  ASSERT_NE(BufferOf(fresh), nullptr);
  EXPECT_EQ(BufferOf(fresh)->producer, again->call_seq);
  EXPECT_EQ(BufferOf(Id(11)), nullptr);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.calls_recomputed(), 1);
  EXPECT_EQ(c.buffers_restored(), 1);  // the replicated put
  EXPECT_EQ(c.buffers_failed(), 0);

  // A new spare joins (as the embedded cluster starts one): the cluster
  // can recover again, so lineage is kept again.
  state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now());
  // A later call that names the old id reads the new one.
  WorkerOps ops;
  const uint64_t later =
      Route(MakeCall(Id(2), s, Id(11), kSplit, Id(12)), &ops);
  int pieces = 0;
  for (const auto& [w, list] : ops) {
    for (const auto& op : list) {
      if (!op.has_execute()) continue;
      for (const auto& task : op.execute().tasks()) {
        for (const auto& piece : task.inputs(0).pieces()) {
          EXPECT_EQ(piece.buffer_id(), fresh);
          ++pieces;
        }
      }
    }
  }
  EXPECT_EQ(pieces, 4);
  // And its release releases the new one, once nothing holds it (the old
  // id's entries go now).
  EXPECT_EQ(Released(Release(Id(11), s)),
            (std::set<uint64_t>{Id(11)}));     // the call reads the new one
  EXPECT_TRUE(Released(Done(later)).empty());  // Id(12) is rebuilt from it
  EXPECT_EQ(Released(Release(Id(12), s)), (std::set<uint64_t>{Id(12), fresh}));
}

TEST_F(TwoSlicesTest, ACallNotDoneOnTheRemappedSliceRunsAgain) {
  const TwoSliceCalls t = RouteOnTwoSlices(1);
  const uint64_t seq = t.on_wide, untouched = t.on_narrow;
  ClientRecovery rec = LoseHost1();
  const auto renamed = Renamed(rec.note);
  EXPECT_EQ(renamed.size(), 1u);
  ASSERT_EQ(renamed.count(Id(11)), 1u);
  const RoutedWork* again = CallMaking(rec, renamed.at(Id(11)));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(CallOf(seq), nullptr);
  ASSERT_NE(CallOf(again->call_seq), nullptr);
  EXPECT_FALSE(CallOf(again->call_seq)->done);
  // A call that needs nothing of the lost host is left alone.
  EXPECT_NE(CallOf(untouched), nullptr);
  EXPECT_EQ(CallMaking(rec, Id(21)), nullptr);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 1);
}

TEST_F(RecoveryTest, AFailedCallRunsAgainLikeOneNotDone) {
  const uint64_t s = Spread4();
  Register(Id(1), "scale", kReplicated, kReplicated);
  Put(Id(10), s, kReplicated);
  const uint64_t seq = Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  Done(seq, /*failed=*/true);
  ClientRecovery rec = LoseHost1();
  ASSERT_EQ(Renamed(rec.note).count(Id(11)), 1u);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 1);
  EXPECT_EQ(CallOf(seq), nullptr);
}

TEST_F(RecoveryTest, AValueThatCannotBeRecomputedIsLost) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  // Its input has no record (its bytes are gone): nothing to rebuild from.
  const uint64_t seq = Route(MakeCall(Id(1), s, Id(9), kReplicated, Id(11)));
  Done(seq);
  ClientRecovery rec = LoseHost1();
  ASSERT_EQ(rec.note.lost_ids_size(), 1);
  EXPECT_EQ(rec.note.lost_ids(0), Id(11));
  EXPECT_EQ(rec.note.status().code(),
            static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(rec.note.status().message(),
                                absl::StrCat("buffer ", Id(11))))
      << rec.note.status().message();
  EXPECT_TRUE(absl::StrContains(rec.note.status().message(), "worker 2"));
  EXPECT_EQ(rec.note.old_ids_size(), 0);
  EXPECT_EQ(state_.recovery_counters().buffers_failed(), 1);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 0);
  // A call that reads it fails with DATA_LOSS, and nothing reaches a worker.
  WorkerOps ops;
  absl::Status st = state_.RouteCall(
      client_, MakeCall(Id(2), s, Id(11), kSplit, Id(12)), &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "cannot be recomputed")) << st;
  EXPECT_TRUE(ops.empty());
}
// After a client releases everything and every call is done, the server
// holds no record of it (and its releases reached the workers).
TEST_F(RecoveryTest, NothingIsLeftAfterEverythingIsReleased) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  const uint64_t a = Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  const uint64_t b = Route(MakeCall(Id(2), s, Id(11), kSplit, Id(12)));
  std::set<uint64_t> released;
  for (uint64_t id : {Id(10), Id(11)}) {
    for (uint64_t r : Released(Release(id, s))) released.insert(r);
  }
  EXPECT_TRUE(released.empty());  // both still read
  for (uint64_t seq : {a, b}) {
    for (uint64_t r : Released(Done(seq))) released.insert(r);
  }
  EXPECT_TRUE(released.empty());  // Id(12) can only be rebuilt from them
  for (uint64_t r : Released(Release(Id(12), s))) released.insert(r);
  EXPECT_EQ(released, (std::set<uint64_t>{Id(10), Id(11), Id(12)}));
  EXPECT_TRUE(state_.records().calls().empty());
  EXPECT_TRUE(state_.records().buffers().empty());
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);
  EXPECT_EQ(state_.TakeReleasedPuts(),
            (std::map<uint64_t, std::vector<uint64_t>>{{client_, {Id(10)}}}));
}

// The same after a recovery that copied, recomputed, restored from a
// snapshot and ran again a call not done.
TEST_F(RecoveryTest, NothingIsLeftAfterARecoveryEither) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Register(Id(2), "identity", kSplit, kSplit);
  Put(Id(10), s, kReplicated);
  Put(Id(20), s, kSplit);
  const uint64_t a = Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  const uint64_t b = Route(MakeCall(Id(2), s, Id(20), kSplit, Id(21)));
  Route(MakeCall(Id(2), s, Id(21), kSplit, Id(22)));  // not done
  Done(a);
  Done(b);
  WorkerOps ops;
  state_.RouteSnapshot(client_, Id(21), &ops);
  uint64_t copy = 0;
  for (const auto& [w, list] : ops) {
    for (const auto& op : list) {
      if (op.has_expect()) copy = op.expect().buffer_id();
    }
  }
  for (int i = 0; i < 4; ++i) state_.CopyArrived(copy, &ops);
  ClientRecovery rec = LoseHost1();
  EXPECT_EQ(Renamed(rec.note).size(), 2u);  // Id(11) and Id(22)
  // The workers report what runs now.
  std::vector<uint64_t> seqs;
  for (const auto& [seq, call] : state_.records().calls()) {
    if (!call.done) seqs.push_back(seq);
  }
  EXPECT_EQ(seqs.size(), 2u);
  for (uint64_t seq : seqs) Done(seq);
  std::set<uint64_t> released = Released(rec);
  for (uint64_t id : {Id(10), Id(11), Id(20), Id(21), Id(22)}) {
    for (uint64_t r : Released(Release(id, s))) released.insert(r);
  }
  EXPECT_TRUE(state_.records().calls().empty());
  EXPECT_TRUE(state_.records().buffers().empty());
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);
  const auto renamed = Renamed(rec.note);
  for (uint64_t id :
       {Id(10), Id(20), Id(21), renamed.at(Id(11)), renamed.at(Id(22)), copy}) {
    EXPECT_EQ(released.count(id), 1u) << id;
  }
}

// A call not done whose output its client had already released (and
// nothing read) runs again under a new output id: nobody will release
// that one, so recovery must.
TEST_F(RecoveryTest, AReleasedOutputOfACallRunAgainIsReleasedToo) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Put(Id(10), s, kReplicated);
  Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  EXPECT_EQ(Released(Release(Id(11), s)), (std::set<uint64_t>{Id(11)}));
  ClientRecovery rec = LoseHost1();
  const auto renamed = Renamed(rec.note);
  ASSERT_EQ(renamed.count(Id(11)), 1u);
  const uint64_t fresh = renamed.at(Id(11));
  const RoutedWork* again = CallMaking(rec, fresh);
  ASSERT_NE(again, nullptr);
  std::set<uint64_t> released = Released(rec);
  for (uint64_t r : Released(Done(again->call_seq))) released.insert(r);
  EXPECT_EQ(released.count(fresh), 1u);
  for (uint64_t r : Released(Release(Id(10), s))) released.insert(r);
  EXPECT_TRUE(state_.records().calls().empty());
  EXPECT_TRUE(state_.records().buffers().empty())
      << state_.records().buffers().size();
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);
}

// Recovery of one client leaves another's work alone.
TEST_F(RecoveryTest, AnotherClientsWorkIsNotRecovered) {
  const uint64_t s = Spread4();
  Register(Id(1), "identity", kReplicated, kSplit);
  Put(Id(10), s, kReplicated);
  Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  const uint64_t other = state_.AddClient("other").id;
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.add_hosts("host1");
  auto os = state_.CreateSlice(other, req);
  ASSERT_TRUE(os.ok()) << os.status();
  WorkerLoss loss = state_.LoseWorker(2, "killed");
  EXPECT_EQ(loss.clients, (std::set<uint64_t>{client_, other}));
  ClientRecovery mine = state_.RecoverClient(client_, loss, {});
  EXPECT_EQ(mine.note.remapped_size(), 1);
  EXPECT_EQ(mine.note.remapped(0).slice_id(), s);
  ClientRecovery theirs = state_.RecoverClient(other, loss, {});
  ASSERT_EQ(theirs.note.remapped_size(), 1);
  EXPECT_EQ(theirs.note.remapped(0).slice_id(), os->slice_id());
  EXPECT_EQ(theirs.note.old_ids_size(), 0);
  EXPECT_TRUE(theirs.work.empty());
}

// Work still at admission when the host was lost is routed again on the
// new map under its own ids, after the recovery's own work; the program
// loads it carried are sent again.
TEST_F(RecoveryTest, WorkThatHadNotReachedTheWorkersIsRoutedAgainOnTheNewMap) {
  const uint64_t s = Spread4();
  Register(Id(1), "scale", kReplicated, kReplicated);
  Put(Id(10), s, kReplicated);
  WorkerOps first;
  const uint64_t seq =
      Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)), &first);
  ASSERT_TRUE(first.at(1).front().has_load());
  TakenWork taken;
  taken.call_seq = seq;
  taken.unsent_loads.emplace_back(1, Id(1));
  taken.unsent_loads.emplace_back(2, Id(1));
  WorkerLoss loss = state_.LoseWorker(2, "killed");
  std::vector<TakenWork> work;
  work.push_back(std::move(taken));
  ClientRecovery rec = state_.RecoverClient(client_, loss, std::move(work));
  EXPECT_EQ(rec.note.old_ids_size(), 0);  // not run twice, not renamed
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 0);
  const RoutedWork* again = CallMaking(rec, Id(11));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(&rec.work.back(), again);  // after the copies of Id(10)
  EXPECT_NE(again->call_seq, seq);
  EXPECT_EQ(CallOf(seq), nullptr);
  ASSERT_NE(CallOf(again->call_seq), nullptr);
  EXPECT_EQ(again->ops.count(2), 0u);  // nothing for the lost host
  for (int64_t w : {int64_t{1}, spare_}) {
    ASSERT_TRUE(again->ops.count(w)) << w;
    EXPECT_TRUE(again->ops.at(w).front().has_load()) << w;
    EXPECT_TRUE(again->ops.at(w).back().has_execute()) << w;
  }
  ASSERT_NE(BufferOf(Id(11)), nullptr);
  EXPECT_EQ(BufferOf(Id(11))->producer, again->call_seq);
}

// The same where the call's own slice keeps its map (the loss remapped
// another slice of the client): routing's cache of the programs every
// host of that map has loaded must not hide a load that never reached
// its host (SliceRecord::RouteCache; it failed before the epoch).
TEST_F(RecoveryTest, ALoadTakenBackIsSentAgainOnASliceTheLossDidNotRemap) {
  const uint64_t a = SliceOn(2, "host0").slice_id();
  const uint64_t b = SliceOn(2, "host1").slice_id();
  Register(Id(1), "scale", kReplicated, kReplicated);
  Put(Id(10), a, kReplicated);
  Put(Id(20), b, kReplicated);
  WorkerOps first;
  const uint64_t seq =
      Route(MakeCall(Id(1), a, Id(10), kReplicated, Id(11)), &first);
  ASSERT_TRUE(first.at(1).front().has_load());
  WorkerOps second;
  Route(MakeCall(Id(1), a, Id(11), kReplicated, Id(12)), &second);
  ASSERT_FALSE(second.at(1).front().has_load());  // loaded once
  TakenWork taken;
  taken.call_seq = seq;
  taken.unsent_loads.emplace_back(1, Id(1));
  WorkerLoss loss = state_.LoseWorker(2, "killed");  // b moves to the spare
  std::vector<TakenWork> work;
  work.push_back(std::move(taken));
  ClientRecovery rec = state_.RecoverClient(client_, loss, std::move(work));
  const RoutedWork* again = CallMaking(rec, Id(11));
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->ops.count(1));
  EXPECT_TRUE(again->ops.at(1).front().has_load());
  EXPECT_TRUE(again->ops.at(1).back().has_execute());
}

// A release the records held while a call read the value goes, once the
// call is done, as the value's id for every live host of a slice over
// several hosts when the caller gathers them (the server: one op encoded
// for all), and as an op per host for a slice on one host.
TEST_F(TwoSlicesTest, ReleasesLetGoOnAWideSliceAreGatheredBySlice) {
  const TwoSliceCalls t = RouteOnTwoSlices(2);
  const uint64_t wide = t.wide, narrow = t.narrow, a = t.on_wide,
                 b = t.on_narrow;
  EXPECT_TRUE(Released(Release(Id(10), wide)).empty());  // held: read
  // On one host the input is kept while its output lives (lineage): the
  // output goes first here (at once: nothing reads it).
  Release(Id(21), narrow);
  EXPECT_TRUE(Released(Release(Id(20), narrow)).empty());
  WorkerOps ops;
  SharedReleases shared;
  state_.CallDone(a, false, &ops, &shared);
  state_.CallDone(b, false, &ops, &shared);
  ASSERT_TRUE(shared.count(wide));
  EXPECT_EQ(shared.at(wide).hosts, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(shared.at(wide).ids, (std::vector<uint64_t>{Id(10)}));
  EXPECT_TRUE(!shared.count(narrow) || shared.at(narrow).ids.empty());
  EXPECT_EQ(Released(ops), (std::set<uint64_t>{Id(20)}));
  EXPECT_EQ(ops.count(2), 0u);  // the narrow slice's release: host0 only
}

}  // namespace
}  // namespace plexus
