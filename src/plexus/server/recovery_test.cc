// Recovery from a lost host (ClusterState::LoseWorker, RecoverClient),
// driven directly on the server's records: which slices move onto which
// spare, what is copied, recomputed or lost, and the ops and notes a
// recovery makes. Snapshots: recovery_snapshot_test.cc; the records on
// their own: job_records_test.cc.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "plexus/server/cluster_state.h"
#include "plexus/server/job_records.h"
#include "plexus/server/recovery_test_util.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

TEST_F(RecoveryTest, ALostHostsSlicesMoveOntoTheSpareInPlace) {
  const uint64_t wide = Spread4();
  const uint64_t narrow = SliceOn(1, "host1").slice_id();
  const int32_t narrow_device = state_.slices().at(narrow).devices[0].device;
  const uint64_t other = SliceOn(2, "host0").slice_id();
  EXPECT_EQ(state_.workers().at(spare_).slices_mapped, 0);
  WorkerLoss loss = state_.LoseWorker(2, "killed");
  EXPECT_EQ(loss.worker_id, 2);
  EXPECT_EQ(loss.spare, spare_);
  EXPECT_EQ(loss.remapped, (std::set<uint64_t>{wide, narrow}));
  EXPECT_TRUE(loss.broken.empty());
  EXPECT_EQ(loss.clients, (std::set<uint64_t>{client_}));
  // Same virtual order; the spare's devices of the same indices.
  const SliceRecord& w = state_.slices().at(wide);
  EXPECT_EQ(w.devices,
            (std::vector<DeviceRef>{{1, 0}, {1, 1}, {spare_, 0}, {spare_, 1}}));
  EXPECT_EQ(w.generation, 1u);
  EXPECT_TRUE(w.broken.empty());
  const SliceRecord& n = state_.slices().at(narrow);
  EXPECT_EQ(n.devices, (std::vector<DeviceRef>{{spare_, narrow_device}}));
  EXPECT_EQ(n.generation, 1u);
  EXPECT_EQ(state_.slices().at(other).generation, 0u);  // not on it
  proto::SliceInfo info = state_.DescribeSlice(w);
  EXPECT_EQ(info.generation(), 1u);
  EXPECT_EQ(info.devices(2).host_name(), "spare0");
  EXPECT_FALSE(state_.workers().at(2).alive);
  EXPECT_EQ(state_.workers().at(2).down_reason, "killed");
  // The spare is a host like the others now, and carries the load.
  EXPECT_FALSE(state_.workers().at(spare_).info.spare());
  EXPECT_EQ(state_.workers().at(spare_).slices_mapped, 2);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.hosts_lost(), 1);
  EXPECT_EQ(c.slices_remapped(), 2);
  EXPECT_EQ(c.slices_broken(), 0);
  // Losing it again changes nothing.
  EXPECT_TRUE(state_.LoseWorker(2, "again").remapped.empty());
  EXPECT_EQ(state_.recovery_counters().hosts_lost(), 1);
}

TEST_F(RecoveryTest, AHostStartedAsASpareIsPreferredToAFreeHost) {
  const int64_t free_host = state_.AddWorker(Host("host2", 2), absl::Now()).id;
  const uint64_t s = SliceOn(2, "host0").slice_id();
  WorkerLoss loss = state_.LoseWorker(1, "killed");
  EXPECT_EQ(loss.spare, spare_);  // not the older host2
  EXPECT_EQ(state_.slices().at(s).devices[0].worker_id, spare_);
  EXPECT_EQ(state_.workers().at(free_host).slices_mapped, 0);
}

// Two hosts of two devices, neither started as a spare.
class RecoveryWithoutSpareTest : public ClusterStateTest {};

TEST_F(RecoveryWithoutSpareTest, AHostInNoSliceTakesALostHostsSlice) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_ONE_HOST);
  const int64_t lost = s.devices(0).worker_id();
  const int64_t free_host = lost == 1 ? 2 : 1;
  WorkerLoss loss = state_.LoseWorker(lost, "killed");
  EXPECT_EQ(loss.spare, free_host);
  EXPECT_EQ(loss.remapped, (std::set<uint64_t>{s.slice_id()}));
  EXPECT_EQ(state_.slices().at(s.slice_id()).devices,
            (std::vector<DeviceRef>{{free_host, 0}, {free_host, 1}}));
}

TEST_F(RecoveryWithoutSpareTest, WithoutASpareALostHostsSliceBreaks) {
  proto::SliceInfo s = Slice(4, proto::PLACEMENT_SPREAD);
  WorkerLoss loss = state_.LoseWorker(1, "killed");
  EXPECT_EQ(loss.spare, 0);
  EXPECT_TRUE(loss.remapped.empty());
  EXPECT_EQ(loss.broken, (std::set<uint64_t>{s.slice_id()}));
  EXPECT_EQ(state_.slices().at(s.slice_id()).broken, "killed");
  EXPECT_EQ(state_.slices().at(s.slice_id()).generation, 0u);
  EXPECT_EQ(state_.recovery_counters().slices_broken(), 1);
  EXPECT_EQ(state_.recovery_counters().slices_remapped(), 0);
  Register(Id(1), "scale", kReplicated, kReplicated);
  proto::Call call;
  call.set_slice_id(s.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(2));
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(kReplicated);
  call.add_output_ids(Id(3));
  WorkerOps ops;
  absl::Status st = state_.RouteCall(client_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "killed")) << st;
}

// A free host with fewer devices than the slice uses of the lost one
// cannot stand in for it.
TEST_F(RecoveryWithoutSpareTest, ASpareNeedsTheLostHostsDeviceIndices) {
  state_.AddWorker(Host("small", 1, /*spare=*/true), absl::Now());
  proto::SliceInfo s = Slice(4, proto::PLACEMENT_SPREAD);
  WorkerLoss loss = state_.LoseWorker(2, "killed");
  EXPECT_EQ(loss.spare, 0);
  EXPECT_EQ(loss.broken, (std::set<uint64_t>{s.slice_id()}));
}

TEST_F(RecoveryTest, SparesAreNotPlacedOnUnlessNamed) {
  proto::SliceRequest req;
  req.set_num_devices(6);
  auto big = state_.CreateSlice(client_, req);
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(
      absl::StrContains(big.status().message(), "4 live devices on 2 hosts"))
      << big.status();
  for (int i = 0; i < 4; ++i) {
    proto::SliceInfo s = Slice(1);
    EXPECT_NE(s.devices(0).worker_id(), spare_);
  }
  EXPECT_EQ(SliceOn(2, "spare0").devices(0).worker_id(), spare_);
}

TEST_F(RecoveryTest, XlaProgramsNameTheSpareInPlaceOfTheLostHost) {
  Spread4();
  proto::RegisterProgram reg;
  reg.set_program_id(Id(1));
  reg.mutable_program()->set_name("step");
  reg.mutable_program()->set_kernel("xla");
  reg.mutable_program()->mutable_xla()->set_module("module");
  for (int64_t w : {1, 2}) {
    auto* island = reg.mutable_program()->mutable_xla()->add_islands();
    island->add_devices(0);
    island->add_devices(1);
    island->add_workers(w);
  }
  ASSERT_TRUE(state_.RegisterProgram(client_, reg).ok());
  state_.LoseWorker(2, "killed");
  const auto& islands =
      state_.FindClient(client_)->programs.at(Id(1)).def.xla().islands();
  ASSERT_EQ(islands.size(), 2);
  EXPECT_EQ(islands[0].workers(0), 1);
  EXPECT_EQ(islands[1].workers(0), spare_);
}

// An XLA program with an island on devices 0 and 1 of each of `workers`.
proto::RegisterProgram XlaStep(uint64_t id, std::vector<int64_t> workers) {
  proto::RegisterProgram reg;
  reg.set_program_id(id);
  reg.mutable_program()->set_name("step");
  reg.mutable_program()->set_kernel("xla");
  reg.mutable_program()->mutable_xla()->set_module("module");
  for (int64_t w : workers) {
    auto* island = reg.mutable_program()->mutable_xla()->add_islands();
    island->add_devices(0);
    island->add_devices(1);
    island->add_workers(w);
  }
  return reg;
}

// The loads in `ops` for `worker`: program id -> stand_by.
std::map<uint64_t, bool> LoadsOf(const WorkerOps& ops, int64_t worker) {
  std::map<uint64_t, bool> loads;
  auto it = ops.find(worker);
  if (it == ops.end()) return loads;
  for (const auto& op : it->second) {
    if (op.has_load()) loads[op.load().program_id()] = op.load().stand_by();
  }
  return loads;
}

TEST_F(RecoveryTest, AProgramIsLoadedOntoItsHostsAndOntoTheSpareStandingBy) {
  Spread4();
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RegisterProgram(client_, XlaStep(Id(1), {1, 2}), &ops).ok());
  EXPECT_EQ(LoadsOf(ops, 1), (std::map<uint64_t, bool>{{Id(1), false}}));
  EXPECT_EQ(LoadsOf(ops, 2), (std::map<uint64_t, bool>{{Id(1), false}}));
  EXPECT_EQ(LoadsOf(ops, spare_), (std::map<uint64_t, bool>{{Id(1), true}}));
  // Once it has taken a place it stands by no more.
  EXPECT_TRUE(state_.StandsBy(state_.workers().at(spare_)));
  state_.LoseWorker(2, "killed");
  EXPECT_FALSE(state_.StandsBy(state_.workers().at(spare_)));
}

// A host declared down (SIGSTOP) that comes back registers as a fresh host,
// not as a spare; in no slice, it can take the next lost host's place, so
// it has the job's programs ahead as a spare does.
TEST_F(RecoveryTest, AHostThatRejoinsAfterItWasDeclaredDownStandsBy) {
  Spread4();
  ASSERT_TRUE(state_.RegisterProgram(client_, XlaStep(Id(1), {1, 2})).ok());
  state_.LoseWorker(2, "missed heartbeats");  // the spare takes its place
  const int64_t back = state_.AddWorker(Host("host1", 2), absl::Now()).id;
  EXPECT_TRUE(state_.StandsBy(state_.workers().at(back)));
  std::vector<proto::WorkerOp> loads = state_.LoadsForStandby(back);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].load().program_id(), Id(1));
  EXPECT_TRUE(loads[0].load().stand_by());
  // The program as it is now: its island names the spare, not host1's
  // old registration.
  EXPECT_EQ(loads[0].load().program().xla().islands(1).workers(0), spare_);
  EXPECT_TRUE(state_.LoadsForStandby(back).empty());  // marked loaded
  // And the next loss takes it.
  WorkerLoss loss = state_.LoseWorker(1, "killed");
  EXPECT_EQ(loss.spare, back);
}

TEST_F(RecoveryTest, AHostInASliceDoesNotStandBy) {
  Spread4();
  ASSERT_TRUE(state_.RegisterProgram(client_, XlaStep(Id(1), {1, 2})).ok());
  EXPECT_FALSE(state_.StandsBy(state_.workers().at(1)));
  EXPECT_TRUE(state_.LoadsForStandby(1).empty());
}

TEST_F(RecoveryTest, AHostWhoseSlicesAreReleasedStandsBy) {
  SliceOn(2, "host0");
  const uint64_t other = SliceOn(2, "host1").slice_id();
  WorkerOps ops;
  ASSERT_TRUE(state_.RegisterProgram(client_, XlaStep(Id(1), {1}), &ops).ok());
  EXPECT_TRUE(LoadsOf(ops, 2).empty());
  ASSERT_TRUE(state_.ReleaseSlice(client_, other).ok());
  WorkerOps standby;
  state_.LoadStandbys(&standby);
  EXPECT_EQ(LoadsOf(standby, 2), (std::map<uint64_t, bool>{{Id(1), true}}));
  EXPECT_TRUE(LoadsOf(standby, 1).empty());
  EXPECT_TRUE(LoadsOf(standby, spare_).empty());  // it has it already
}

TEST_F(RecoveryWithoutSpareTest, InAClusterNeverGivenASpareNoHostStandsBy) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_ONE_HOST);
  const int64_t used = s.devices(0).worker_id();
  const int64_t free_host = used == 1 ? 2 : 1;
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RegisterProgram(client_, XlaStep(Id(1), {used}), &ops).ok());
  EXPECT_TRUE(LoadsOf(ops, free_host).empty());
  EXPECT_FALSE(state_.StandsBy(state_.workers().at(free_host)));
  EXPECT_TRUE(state_.LoadsForStandby(free_host).empty());
}

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

TEST_F(RecoveryTest, ACallNotDoneOnTheRemappedSliceRunsAgain) {
  const uint64_t s = Spread4();
  const uint64_t elsewhere = SliceOn(1, "host0").slice_id();
  Register(Id(1), "scale", kReplicated, kReplicated);
  Put(Id(10), s, kReplicated);
  Put(Id(20), elsewhere, kReplicated);
  const uint64_t seq = Route(MakeCall(Id(1), s, Id(10), kReplicated, Id(11)));
  const uint64_t untouched =
      Route(MakeCall(Id(1), elsewhere, Id(20), kReplicated, Id(21)));
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

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

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

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

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

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

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
