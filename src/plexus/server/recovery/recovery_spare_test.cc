// Recovery from a lost host (ClusterState::LoseWorker), driven directly on
// the server's records: which host takes a lost host's place (a spare, a
// free host, or none: the slice breaks), and the programs a host that
// stands by holds ahead. What a recovery does with the client's values
// and work: recovery_test.cc.
#include <map>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/recovery/recovery_test_util.h"

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

// --- A loss no spare can take at once, in a cluster given spares: its
// slices wait for a host (AwaitedLoss) instead of breaking.

constexpr absl::Duration kWait = absl::Seconds(10);

TEST_F(RecoveryTest, WithTheSpareTakenASliceWaitsForAHostThenMovesOntoIt) {
  const uint64_t s = Spread4();
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  // The spare is taken by a slice of its own (a host in a slice stands in
  // for nobody).
  const uint64_t on_spare = SliceOn(1, "spare0").slice_id();
  WorkerLoss loss = state_.LoseWorker(2, "killed", t0, kWait);
  EXPECT_EQ(loss.spare, 0);
  EXPECT_TRUE(loss.remapped.empty());
  EXPECT_TRUE(loss.broken.empty());
  EXPECT_EQ(loss.awaiting, (std::set<uint64_t>{s}));
  const SliceRecord& slice = state_.slices().at(s);
  EXPECT_EQ(slice.awaiting, "killed");
  EXPECT_EQ(slice.awaiting_until, t0 + kWait);
  EXPECT_TRUE(slice.broken.empty());
  EXPECT_TRUE(state_.Awaiting(client_));
  ASSERT_EQ(state_.awaited().size(), 1u);
  // Nothing to take it yet, and its wait is not over.
  EXPECT_TRUE(state_.ResumeAwaited().empty());
  EXPECT_TRUE(state_.EndAwaited(t0 + kWait - absl::Milliseconds(1)).empty());
  // A host joins (a replacement, a host that rejoins): the slice moves onto
  // it as onto a spare, in place of the lost host.
  const int64_t fresh =
      state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now()).id;
  std::vector<WorkerLoss> resumed = state_.ResumeAwaited();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].worker_id, 2);
  EXPECT_EQ(resumed[0].spare, fresh);
  EXPECT_EQ(resumed[0].remapped, (std::set<uint64_t>{s}));
  EXPECT_TRUE(resumed[0].awaiting.empty());
  EXPECT_EQ(resumed[0].clients, (std::set<uint64_t>{client_}));
  EXPECT_EQ(state_.slices().at(s).devices,
            (std::vector<DeviceRef>{{1, 0}, {1, 1}, {fresh, 0}, {fresh, 1}}));
  EXPECT_EQ(state_.slices().at(s).generation, 1u);
  EXPECT_TRUE(state_.slices().at(s).awaiting.empty());
  EXPECT_FALSE(state_.Awaiting(client_));
  EXPECT_TRUE(state_.awaited().empty());
  EXPECT_EQ(state_.slices().at(on_spare).generation, 0u);
  const proto::RecoveryCounters& c = state_.recovery_counters();
  EXPECT_EQ(c.losses_awaited(), 1);
  EXPECT_EQ(c.losses_resumed(), 1);
  EXPECT_EQ(c.slices_remapped(), 1);
  EXPECT_EQ(c.slices_broken(), 0);
}

TEST_F(RecoveryTest, ASliceThatWaitsInVainBreaksAtItsDeadlineSayingSo) {
  const uint64_t s = Spread4();
  SliceOn(1, "spare0");
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  state_.LoseWorker(2, "killed", t0, kWait);
  std::vector<WorkerLoss> ended = state_.EndAwaited(t0 + kWait);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].broken, (std::set<uint64_t>{s}));
  EXPECT_TRUE(ended[0].awaiting.empty());
  const std::string& broken = state_.slices().at(s).broken;
  EXPECT_TRUE(absl::StrContains(broken, "killed")) << broken;
  EXPECT_TRUE(absl::StrContains(broken, "no host took its place")) << broken;
  EXPECT_TRUE(absl::StrContains(broken, "within 10s")) << broken;
  EXPECT_EQ(ended[0].reason, broken);
  EXPECT_FALSE(state_.Awaiting(client_));
  EXPECT_EQ(state_.recovery_counters().slices_broken(), 1);
  // A host that comes later takes nothing: the slice stays broken.
  state_.AddWorker(Host("spare1", 2, /*spare=*/true), absl::Now());
  EXPECT_TRUE(state_.ResumeAwaited().empty());
  EXPECT_EQ(state_.slices().at(s).generation, 0u);
}

TEST_F(RecoveryTest, ASliceWaitingForAHostThatLosesAnotherBreaks) {
  const uint64_t s = Spread4();
  SliceOn(1, "spare0");
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  state_.LoseWorker(2, "killed", t0, kWait);
  // Host0 goes too: the waiting loss ends, then the new one finds its
  // slice broken and does not wait.
  std::vector<WorkerLoss> ended = state_.EndAwaited(t0, /*lost=*/1);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(
      absl::StrContains(ended[0].reason, "before the slice lost another"))
      << ended[0].reason;
  WorkerLoss second = state_.LoseWorker(1, "stopped", t0, kWait);
  EXPECT_TRUE(second.awaiting.empty());
  EXPECT_EQ(second.broken, (std::set<uint64_t>{s}));
  EXPECT_TRUE(state_.awaited().empty());
}

TEST_F(RecoveryWithoutSpareTest, OnlyAClusterGivenSparesWaitsForAHost) {
  proto::SliceInfo s = Slice(4, proto::PLACEMENT_SPREAD);
  WorkerLoss loss = state_.LoseWorker(1, "killed", absl::Now(), kWait);
  EXPECT_TRUE(loss.awaiting.empty());
  EXPECT_EQ(loss.broken, (std::set<uint64_t>{s.slice_id()}));
}

TEST_F(RecoveryTest, AWaitingSliceReleasedOrItsClientGoneWaitsNoMore) {
  const uint64_t s = Spread4();
  SliceOn(1, "spare0");
  state_.LoseWorker(2, "killed", absl::Now(), kWait);
  ASSERT_EQ(state_.awaited().size(), 1u);
  ASSERT_TRUE(state_.ReleaseSlice(client_, s).ok());
  EXPECT_TRUE(state_.awaited().empty());
  EXPECT_FALSE(state_.Awaiting(client_));
}

}  // namespace
}  // namespace plexus
