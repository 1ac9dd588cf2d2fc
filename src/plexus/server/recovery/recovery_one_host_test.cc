// Recovery of slices on one host (a pipeline stage's, an RL stage's): their
// values, replicated or not, have no copy on another host, so they keep
// their lineage or a snapshot on another host of the cluster; a loss no
// spare takes fails whatever depended on the host, on every slice; a spare
// takes the place of a lost host that held no slice.
#include <cstdint>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/recovery/recovery_test_util.h"

namespace plexus {
namespace {

// Slice A: one device on host0 (worker 1); a spare (worker 3) stands by.
class OneHostRecoveryTest : public RecoveryTest {
 protected:
  void SetUp() override {
    RecoveryTest::SetUp();
    a_ = SliceOn(1, "host0").slice_id();
    Register(Id(1), "scale", kReplicated, kReplicated);
    Put(Id(10), a_, kReplicated);
    first_ = Route(MakeCall(Id(1), a_, Id(10), kReplicated, Id(11)));
    second_ = Route(MakeCall(Id(1), a_, Id(11), kReplicated, Id(12)));
    Done(first_);
    Done(second_);
    // Only the end of the chain is the client's: X11 goes once nothing
    // holds it.
    Release(Id(11), a_);
  }
  ClientRecovery LoseHost0() {
    WorkerLoss loss = state_.LoseWorker(1, "killed");
    EXPECT_EQ(loss.spare, spare_);
    return state_.RecoverClient(client_, loss, {});
  }

  uint64_t a_ = 0;
  uint64_t first_ = 0;
  uint64_t second_ = 0;
};

TEST_F(OneHostRecoveryTest, AReplicatedValueOnOneHostKeepsItsLineage) {
  // Replicated over one device is no copy: both calls hold their inputs
  // (on a slice over two hosts, they let go: a shard survives there).
  ASSERT_NE(CallOf(first_), nullptr);
  ASSERT_NE(CallOf(second_), nullptr);
  EXPECT_TRUE(CallOf(first_)->holding);
  EXPECT_TRUE(CallOf(second_)->holding);
  ClientRecovery rec = LoseHost0();
  EXPECT_EQ(rec.note.lost_ids_size(), 0);
  // X12 is made again from X11, made again from the put (which the
  // client puts again).
  ASSERT_NE(CallMaking(rec, Renamed(rec.note)[Id(12)]), nullptr);
  EXPECT_EQ(state_.recovery_counters().calls_recomputed(), 2);
  EXPECT_EQ(state_.recovery_counters().shards_reput(), 1);
  EXPECT_EQ(state_.recovery_counters().buffers_failed(), 0);
}

TEST_F(OneHostRecoveryTest, ASnapshotOfAOneHostValueIsKeptOnAnotherHost) {
  WorkerOps ops;
  state_.RouteSnapshot(client_, Id(12), &ops);
  uint64_t copy = 0;
  int64_t holder = 0;
  for (const auto& [w, list] : ops) {
    for (const auto& op : list) {
      if (!op.has_expect()) continue;
      copy = op.expect().buffer_id();
      holder = w;
    }
  }
  EXPECT_EQ(holder, 2);  // host1: the next live host that is not a spare
  EXPECT_EQ(state_.recovery_counters().snapshots_taken(), 1);
  WorkerOps releases;
  state_.CopyArrived(copy, &releases);
  // Complete: the chain lets go of its inputs (the put stays the
  // client's; X11 goes).
  EXPECT_FALSE(CallOf(second_) != nullptr && CallOf(second_)->holding);
  ClientRecovery rec = LoseHost0();
  EXPECT_EQ(rec.note.lost_ids_size(), 0);
  for (const RoutedWork& w : rec.work) EXPECT_EQ(w.call_seq, 0u);
  auto restores = Ops(rec, [&](const proto::WorkerOp& op) {
    return op.has_transfer() && op.transfer().buffer_id() == copy;
  });
  ASSERT_EQ(restores.size(), 1u);
  EXPECT_EQ(restores[0].first, 2);
  EXPECT_EQ(restores[0].second.transfer().dst_buffer_id(), Id(12));
  EXPECT_EQ(restores[0].second.transfer().dst_worker_id(), spare_);
  EXPECT_EQ(state_.recovery_counters().shards_from_snapshots(), 1);
  // The value's release takes the copy on host1, outside its slice, too.
  WorkerOps released = Release(Id(12), a_);
  ASSERT_TRUE(released.count(2));
  EXPECT_TRUE(Released(released).count(copy));
}

TEST_F(OneHostRecoveryTest, PastTheServersLastIdNothingIsRecomputedOrCopied) {
  // The server's ids in its clients' namespaces count in 39 bits
  // (common/ids.h); past the last, one would be the next client's. A
  // snapshot is not taken (the value keeps its lineage)...
  state_.set_next_server_id(kMaxIdCount + 1);  // none left
  WorkerOps ops;
  state_.RouteSnapshot(client_, Id(12), &ops);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(state_.recovery_counters().snapshots_taken(), 0);
  // ... and a call that would run again under new ids fails its outputs
  // instead, naming what ran out; so does a call that reads them.
  ClientRecovery rec = LoseHost0();
  const std::set<uint64_t> lost(rec.note.lost_ids().begin(),
                                rec.note.lost_ids().end());
  EXPECT_EQ(lost, (std::set<uint64_t>{Id(11), Id(12)}));
  EXPECT_EQ(rec.note.status().code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(absl::StrContains(rec.note.status().message(),
                                "the server's ids in its clients' namespaces "
                                "(for recovery's recomputations and "
                                "snapshots) ran out"))
      << rec.note.status().message();
  EXPECT_TRUE(rec.note.new_ids().empty());
  absl::Status st = state_.RouteCall(
      client_, MakeCall(Id(1), a_, Id(12), kReplicated, Id(13)), &ops);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "ran out")) << st;
}

TEST_F(RecoveryTest, ASpareTakesThePlaceOfALostHostThatHeldNoSlice) {
  WorkerLoss loss = state_.LoseWorker(2, "killed");
  EXPECT_TRUE(loss.remapped.empty());
  EXPECT_EQ(loss.promoted, spare_);
  EXPECT_FALSE(state_.workers().at(spare_).info.spare());
  // New slices are placed on it now.
  proto::SliceInfo s = Slice(4, proto::PLACEMENT_SPREAD);
  std::set<int64_t> on;
  for (const auto& d : s.devices()) on.insert(d.worker_id());
  EXPECT_EQ(on, (std::set<int64_t>{1, spare_}));
}

TEST_F(RecoveryTest, ALostSpareIsReplacedByNothing) {
  WorkerLoss loss = state_.LoseWorker(spare_, "killed");
  EXPECT_EQ(loss.promoted, 0);
}

// Without a spare: slice A on host0, slice B on host1.
class NoSpareTest : public ClusterStateTest {};

TEST_F(NoSpareTest, ACopyThatNoRecoveryCouldReadIsNotMade) {
  // No spare ever joined: a lost host breaks its slices for good, so a
  // snapshot (a pipeline asks for one each step) would only cost memory.
  proto::SliceRequest req;
  req.set_num_devices(1);
  req.add_hosts("host0");
  const uint64_t a = state_.CreateSlice(client_, req)->slice_id();
  proto::PutDecl put;
  put.set_buffer_id(Id(10));
  put.set_slice_id(a);
  *put.mutable_arg() = ToProto(kReplicated);
  WorkerOps ops;
  ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());
  WorkerOps snapshot_ops;
  state_.RouteSnapshot(client_, Id(10), &snapshot_ops);
  EXPECT_TRUE(snapshot_ops.empty());
}

TEST_F(NoSpareTest, ALossNoSpareTakesFailsWhatDependsOnItOnEverySliceAtOnce) {
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.add_hosts("host0");
  const uint64_t a = state_.CreateSlice(client_, req)->slice_id();
  req.set_hosts(0, "host1");
  const uint64_t b = state_.CreateSlice(client_, req)->slice_id();
  Register(Id(1), "scale", kReplicated, kReplicated);
  auto call = [&](uint64_t slice, uint64_t in, uint64_t in_slice,
                  uint64_t out) {
    return OneInputCall(Id(1), slice, in, in_slice, out);
  };
  proto::PutDecl put;
  put.set_buffer_id(Id(10));
  put.set_slice_id(a);
  *put.mutable_arg() = ToProto(kReplicated);
  WorkerOps ops;
  ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());
  // On A: U = f(X), done. On B: Y = f(X), Z = f(Y), T = f(U), not done;
  // W = f(V) of B's own put, done.
  uint64_t seq = 0;
  ASSERT_TRUE(
      state_.RouteCall(client_, call(a, Id(10), a, Id(15)), &ops, &seq).ok());
  state_.CallDone(seq, false, &ops);
  ASSERT_TRUE(state_.RouteCall(client_, call(b, Id(10), a, Id(11)), &ops).ok());
  ASSERT_TRUE(state_.RouteCall(client_, call(b, Id(11), b, Id(12)), &ops).ok());
  ASSERT_TRUE(state_.RouteCall(client_, call(b, Id(15), a, Id(16)), &ops).ok());
  put.set_buffer_id(Id(20));
  put.set_slice_id(b);
  ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());
  ASSERT_TRUE(
      state_.RouteCall(client_, call(b, Id(20), b, Id(21)), &ops, &seq).ok());
  state_.CallDone(seq, false, &ops);

  WorkerLoss loss = state_.LoseWorker(1, "killed [host host0, pid 7]");
  ASSERT_EQ(loss.broken, (std::set<uint64_t>{a}));
  proto::Recovery note = state_.LoseOnBrokenSlices(client_, loss);
  const std::set<uint64_t> lost(note.lost_ids().begin(), note.lost_ids().end());
  EXPECT_EQ(lost, (std::set<uint64_t>{Id(10), Id(11), Id(12), Id(15), Id(16)}));
  EXPECT_EQ(note.status().code(),
            static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(note.status().message(), "host0"))
      << note.status().message();
  // It names the values on the lost host that the failing calls read, and
  // what made each (NameOfBuffer, as the spare path names what it cannot
  // recompute).
  EXPECT_TRUE(
      absl::StrContains(note.status().message(),
                        absl::StrCat("no spare took its place: buffer ", Id(10),
                                     " (put by its client), buffer ", Id(15),
                                     " (output 0 of program 'scale', call ",
                                     Id(15), ") were on a slice of it")))
      << note.status().message();
  // A call that reads a lost value is refused naming why, and its output
  // is lost in turn.
  absl::Status st = state_.RouteCall(client_, call(b, Id(12), b, Id(13)), &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "host0")) << st;
  st = state_.RouteCall(client_, call(b, Id(13), b, Id(14)), &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  // B's own values are not touched.
  EXPECT_TRUE(state_.RouteCall(client_, call(b, Id(21), b, Id(22)), &ops).ok());
}

TEST_F(ClusterStateTest, ClientIdsAreNeverGivenTwice) {
  // They are 24 bits of every buffer id, and a session's credential
  // derives from its id: past the last, sessions are refused, never given
  // the server's own id (its transfer temporaries') or a used one.
  EXPECT_TRUE(state_.CheckClientIdsLeft().ok());
  state_.set_next_client_id(kServerClientId - 1);
  ASSERT_TRUE(state_.CheckClientIdsLeft().ok());
  EXPECT_EQ(state_.AddClient("last").id, kServerClientId - 1);
  absl::Status s = state_.CheckClientIdsLeft();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("16777214 client ids"), std::string::npos) << s;
}

}  // namespace
}  // namespace plexus
