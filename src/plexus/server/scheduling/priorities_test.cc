// Priorities (TenantPolicy::priority), driven on ClusterState directly: a
// higher-priority slice takes its devices from elastic lower-priority
// slices, which shrink off them with every value moved and grow back once
// they free; what does not yield, and why.
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {
namespace {

const ArgSpec kWhole{{DType::kF32, {3}}, Sharding::Replicated()};
const ArgSpec kRows{{DType::kF32, {12, 2}}, Sharding::Split(0)};

// Four hosts of one device each; tenant "prod" has priority 10, "batch"
// the default 0.
class PrioritiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tenants = TenantTable::FromJson(
        R"({"tenants": {"prod": {"priority": 10}, "batch": {}}})");
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    state_.SetTenants(*tenants);
    for (int h = 0; h < 4; ++h) {
      state_.AddWorker(Host("host" + std::to_string(h), 1), absl::Now());
    }
    low_ = state_.AddClient("trainer", "batch").id;
    high_ = state_.AddClient("urgent", "prod").id;
  }
  proto::SliceInfo Slice(uint64_t client, int n, proto::LossPolicy policy,
                         int min = 0, bool grow = false) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.set_placement(proto::PLACEMENT_SPREAD);
    req.set_on_loss(policy);
    req.set_min_devices(min);
    req.set_grow(grow);
    auto s = state_.CreateSlice(client, req);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : proto::SliceInfo();
  }
  // A request for all four hosts, with `preempt` as its preemption policy.
  static proto::SliceRequest SpreadOver4(proto::PreemptPolicy preempt) {
    proto::SliceRequest req;
    req.set_num_devices(4);
    req.set_placement(proto::PLACEMENT_SPREAD);
    req.set_on_preempt(preempt);
    return req;
  }
  uint64_t Put(uint64_t client, uint64_t slice, const ArgSpec& spec) {
    proto::PutDecl put;
    put.set_buffer_id(ClientMadeId(client, next_++));
    put.set_slice_id(slice);
    put.set_slice_resizes(state_.slices().at(slice).resizes);
    *put.mutable_arg() = ToProto(spec);
    WorkerOps ops;
    EXPECT_TRUE(state_.RoutePut(client, put, &ops).ok());
    return put.buffer_id();
  }
  std::set<int64_t> Hosts(uint64_t slice) const {
    std::set<int64_t> hosts;
    for (const DeviceRef& d : state_.slices().at(slice).devices) {
      hosts.insert(d.worker_id);
    }
    return hosts;
  }

  ClusterState state_;
  uint64_t low_ = 0, high_ = 0;
  uint64_t next_ = 1;
};

TEST_F(PrioritiesTest, AHigherPriorityTakesTwoHostsAndGivesThemBack) {
  const proto::SliceInfo low =
      Slice(low_, 4, proto::LOSS_SHRINK, /*min=*/2, /*grow=*/true);
  Put(low_, low.slice_id(), kRows);   // split: re-split over 2, not lost
  Put(low_, low.slice_id(), kWhole);  // replicated
  const proto::SliceInfo high = Slice(high_, 2, proto::LOSS_WAIT);
  std::map<uint64_t, std::string> why_not;
  auto yielded = state_.YieldToPriorities(&why_not);
  ASSERT_EQ(yielded.size(), 1u);
  EXPECT_TRUE(why_not.empty());
  const auto& [owner, resized] = yielded[0];
  EXPECT_EQ(owner, low_);
  EXPECT_EQ(resized.slice.devices_size(), 2);
  EXPECT_EQ(resized.values_moved, 2);
  EXPECT_EQ(resized.note.lost_ids_size(), 0) << "a yield loses nothing";
  EXPECT_FALSE(resized.work.empty()) << "the moves";
  EXPECT_NE(resized.why.find("shrank from 4 to 2 devices: it gave 2 to slice " +
                             std::to_string(high.slice_id()) +
                             " of tenant 'prod' (priority 10, over 0)"),
            std::string::npos)
      << resized.why;
  // The two slices no longer share a host.
  for (int64_t h : Hosts(high.slice_id())) {
    EXPECT_EQ(Hosts(low.slice_id()).count(h), 0u) << "host " << h;
  }
  EXPECT_EQ(state_.recovery_counters().slices_yielded(), 1);
  // Nothing more to yield, and no growth onto the high slice's devices.
  EXPECT_TRUE(state_.YieldToPriorities().empty());
  std::map<uint64_t, std::string> no_growth;
  EXPECT_TRUE(state_.GrowSlices(&no_growth).empty());
  // The high one leaves: the low one grows back to 4.
  ASSERT_TRUE(state_.ReleaseSlice(high_, high.slice_id()).ok());
  auto grown = state_.GrowSlices();
  ASSERT_EQ(grown.size(), 1u);
  EXPECT_EQ(grown[0].second.slice.devices_size(), 4);
  EXPECT_EQ(grown[0].second.note.lost_ids_size(), 0);
}

TEST_F(PrioritiesTest, ASuspendingSliceWaitsOutAHigherPriorityWhereItIs) {
  const proto::SliceRequest req = SpreadOver4(proto::PREEMPT_SUSPEND);
  auto low = state_.CreateSlice(low_, req);
  ASSERT_TRUE(low.ok()) << low.status();
  const uint64_t sid = low->slice_id();
  const std::set<int64_t> before = Hosts(sid);
  const uint64_t rows = Put(low_, sid, kRows);
  // A batch with a call on it routes as usual while nothing claims it.
  google::protobuf::RepeatedPtrField<proto::ClientOp> batch;
  batch.Add()->mutable_call()->set_slice_id(sid);
  EXPECT_FALSE(state_.HeldByPreemption(low_, batch).has_value());

  const proto::SliceInfo high = Slice(high_, 2, proto::LOSS_WAIT);
  std::map<uint64_t, std::string> why_not;
  auto yielded = state_.YieldToPriorities(&why_not);
  ASSERT_EQ(yielded.size(), 1u)
      << (why_not.empty() ? "" : why_not.begin()->second);
  const auto& [owner, suspended] = yielded[0];
  EXPECT_EQ(owner, low_);
  EXPECT_TRUE(suspended.slice.suspended());
  EXPECT_NE(suspended.slice.preempted().find(
                "for slice " + std::to_string(high.slice_id()) +
                " of tenant 'prod' (priority 10, over 0)"),
            std::string::npos)
      << suspended.slice.preempted();
  EXPECT_TRUE(suspended.work.empty()) << "nothing moves: values stay put";
  ASSERT_EQ(suspended.note.remapped_size(), 1);
  EXPECT_EQ(suspended.note.remapped(0).preempted(),
            suspended.slice.preempted());
  EXPECT_EQ(state_.recovery_counters().slices_preempted(), 1);
  // The value is still there, and the map is the same.
  EXPECT_NE(state_.records().FindBuffer(rows), nullptr);
  EXPECT_EQ(Hosts(sid), before);
  // Its client's calls and puts on it wait (not refused); other ops, and
  // those after a resume of it in the same batch, do not.
  auto held = state_.HeldByPreemption(low_, batch);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->slice_id, sid);
  EXPECT_NE(held->why.find("its calls and puts wait at the server"),
            std::string::npos)
      << held->why;
  google::protobuf::RepeatedPtrField<proto::ClientOp> resumed_first;
  auto* resume = resumed_first.Add()->mutable_slice_resize();
  resume->set_slice_id(sid);
  resume->set_resume(true);
  resumed_first.Add()->mutable_call()->set_slice_id(sid);
  EXPECT_FALSE(state_.HeldByPreemption(low_, resumed_first).has_value());
  google::protobuf::RepeatedPtrField<proto::ClientOp> release;
  release.Add()->mutable_release()->set_buffer_id(rows);
  EXPECT_FALSE(state_.HeldByPreemption(low_, release).has_value());
  EXPECT_FALSE(state_.HeldByPreemption(high_, batch).has_value())
      << "another client's ops name a slice it does not hold";
  // Its client's resume is refused while the devices are held (it comes
  // back where it was only), saying why.
  auto early = state_.ResumeSlice(low_, sid);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("suspended by the server for slice"),
            std::string::npos)
      << early.status();
  // Nothing to resume while the high slice holds its devices.
  std::map<uint64_t, std::string> still;
  EXPECT_TRUE(state_.GrowSlices(&still).empty());
  EXPECT_NE(still[sid].find("stays suspended while another slice holds"),
            std::string::npos)
      << still[sid];
  // It leaves: the slice resumes on its own devices, nothing moved.
  ASSERT_TRUE(state_.ReleaseSlice(high_, high.slice_id()).ok());
  auto back = state_.GrowSlices();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].first, low_);
  EXPECT_FALSE(back[0].second.slice.suspended());
  EXPECT_TRUE(back[0].second.slice.preempted().empty());
  EXPECT_TRUE(back[0].second.work.empty());
  EXPECT_NE(back[0].second.why.find("resumed on its own devices"),
            std::string::npos)
      << back[0].second.why;
  EXPECT_EQ(Hosts(sid), before);
  EXPECT_FALSE(state_.HeldByPreemption(low_, batch).has_value());
  EXPECT_EQ(state_.recovery_counters().slices_preempt_resumed(), 1);
}

// on_preempt park: preempted as a suspend, its values parked in files
// (a park call each, whose token the server releases as the park ends: no
// client waits on it) and released from the workers; when the high slice
// leaves, it resumes on its own devices and reads every value back under
// a new id. Without a park directory it is suspended in memory, saying so.
TEST_F(PrioritiesTest, AParkingSliceGoesToFilesAndComesBackWhereItWas) {
  const proto::SliceRequest req = SpreadOver4(proto::PREEMPT_PARK);
  auto no_dir = state_.CreateSlice(low_, req);
  ASSERT_TRUE(no_dir.ok()) << no_dir.status();
  const proto::SliceInfo high = Slice(high_, 2, proto::LOSS_WAIT);
  auto in_memory = state_.YieldToPriorities();
  ASSERT_EQ(in_memory.size(), 1u);
  EXPECT_TRUE(in_memory[0].second.work.empty());
  EXPECT_NE(in_memory[0].second.why.find("the server has no park directory"),
            std::string::npos)
      << in_memory[0].second.why;
  ASSERT_TRUE(state_.ReleaseSlice(high_, high.slice_id()).ok());
  ASSERT_EQ(state_.GrowSlices().size(), 1u);
  ASSERT_TRUE(state_.ReleaseSlice(low_, no_dir->slice_id()).ok());

  state_.set_park_dir("/park");
  auto low = state_.CreateSlice(low_, req);
  ASSERT_TRUE(low.ok()) << low.status();
  const uint64_t sid = low->slice_id();
  const std::set<int64_t> before = Hosts(sid);
  const uint64_t rows = Put(low_, sid, kRows);
  const uint64_t whole = Put(low_, sid, kWhole);
  const proto::SliceInfo urgent = Slice(high_, 2, proto::LOSS_WAIT);
  auto yielded = state_.YieldToPriorities();
  ASSERT_EQ(yielded.size(), 1u);
  const SliceResized& parked = yielded[0].second;
  EXPECT_TRUE(parked.slice.suspended());
  EXPECT_NE(parked.why.find("its values are parked in files of /park"),
            std::string::npos)
      << parked.why;
  ASSERT_EQ(parked.work.size(), 2u);  // a park call per value
  EXPECT_EQ(parked.values_moved, 2);
  // The parks end: each value leaves the workers, and each token is
  // released with it (nothing of the server's suspend is left behind).
  WorkerOps ops;
  for (const auto& [seq, unit] : parked.work) state_.CallDone(seq, false, &ops);
  int releases = 0;
  for (const auto& [worker, list] : ops) {
    for (const proto::WorkerOp& op : list) {
      releases += op.has_release() ? op.release().buffer_ids_size() : 0;
    }
  }
  EXPECT_EQ(releases, 4 * 4) << "2 values and 2 tokens, on 4 hosts";
  EXPECT_EQ(state_.records().FindBuffer(rows), nullptr);
  EXPECT_EQ(state_.records().FindBuffer(whole), nullptr);
  ASSERT_EQ(parked.wait_ids.size(), 2u);
  for (uint64_t token : parked.wait_ids) {
    const BufferRecord* b = state_.records().FindBuffer(token);
    EXPECT_TRUE(b == nullptr || b->released) << token;
  }
  EXPECT_EQ(state_.slices().at(sid).parked.size(), 2u);
  auto notes = state_.TakeParkedNotes();
  ASSERT_EQ(notes.count(low_), 1u);
  EXPECT_EQ(notes[low_].lost_ids_size(), 2);
  // The high slice leaves: resumed where it was, every value read back.
  ASSERT_TRUE(state_.ReleaseSlice(high_, urgent.slice_id()).ok());
  auto back = state_.GrowSlices();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_FALSE(back[0].second.slice.suspended());
  EXPECT_EQ(back[0].second.values_moved, 2);
  EXPECT_EQ(back[0].second.note.new_ids_size(), 2);
  EXPECT_EQ(Hosts(sid), before);
  EXPECT_FALSE(state_.slices().at(sid).on_files);
}

TEST_F(PrioritiesTest, APreemptionPolicyIsChecked) {
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.set_on_preempt(static_cast<proto::PreemptPolicy>(9));
  auto bad = state_.CreateSlice(low_, req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("preemption policy 9"),
            std::string::npos)
      << bad.status();
  // A sharing slice never yields, even where it shrinks on a loss.
  req.set_on_preempt(proto::PREEMPT_SHARE);
  req.set_on_loss(proto::LOSS_SHRINK);
  req.set_num_devices(4);
  req.set_placement(proto::PLACEMENT_SPREAD);
  auto shares = state_.CreateSlice(low_, req);
  ASSERT_TRUE(shares.ok()) << shares.status();
  Slice(high_, 2, proto::LOSS_WAIT);
  EXPECT_TRUE(state_.YieldToPriorities().empty());
  EXPECT_EQ(state_.slices().at(shares->slice_id()).devices.size(), 4u);
}

TEST_F(PrioritiesTest, ASliceAtItsMinimumOrNotElasticTimeShares) {
  const proto::SliceInfo at_min = Slice(low_, 2, proto::LOSS_SHRINK, 2);
  const proto::SliceInfo fixed = Slice(low_, 2, proto::LOSS_WAIT);
  Slice(high_, 4, proto::LOSS_WAIT);
  std::map<uint64_t, std::string> why_not;
  EXPECT_TRUE(state_.YieldToPriorities(&why_not).empty());
  ASSERT_EQ(why_not.count(at_min.slice_id()), 1u);
  EXPECT_NE(why_not[at_min.slice_id()].find(
                "at its minimum of 2 devices (min_devices): it time-shares"),
            std::string::npos)
      << why_not[at_min.slice_id()];
  EXPECT_EQ(why_not.count(fixed.slice_id()), 0u) << "it never offered";
  EXPECT_EQ(state_.slices().at(at_min.slice_id()).devices.size(), 2u);
  EXPECT_EQ(state_.slices().at(fixed.slice_id()).devices.size(), 2u);
}

TEST_F(PrioritiesTest, AValueTheSmallerSizeDoesNotDivideKeepsItWhole) {
  const proto::SliceInfo low = Slice(low_, 4, proto::LOSS_SHRINK, 1);
  Put(low_, low.slice_id(), {{DType::kF32, {4}}, Sharding::Split(0)});
  Slice(high_, 1, proto::LOSS_WAIT);  // 4 -> 3 would not divide 4 rows
  std::map<uint64_t, std::string> why_not;
  EXPECT_TRUE(state_.YieldToPriorities(&why_not).empty());
  EXPECT_NE(why_not[low.slice_id()].find("which 3 devices do not divide"),
            std::string::npos)
      << why_not[low.slice_id()];
  EXPECT_EQ(state_.slices().at(low.slice_id()).devices.size(), 4u);
}

TEST_F(PrioritiesTest, OnePriorityYieldsNothingAndLowerRequestsAvoidHigher) {
  // Two clients of one tenant: no yields.
  const uint64_t other = state_.AddClient("peer", "batch").id;
  Slice(low_, 4, proto::LOSS_SHRINK, 1, true);
  Slice(other, 2, proto::LOSS_WAIT);
  EXPECT_TRUE(state_.YieldToPriorities().empty());
  // A lower-priority request lands off the hosts a higher one holds.
  ClusterState fresh;
  auto tenants =
      TenantTable::FromJson(R"({"tenants": {"prod": {"priority": 10}}})");
  ASSERT_TRUE(tenants.ok());
  fresh.SetTenants(*tenants);
  for (int h = 0; h < 4; ++h) {
    fresh.AddWorker(Host("host" + std::to_string(h), 1), absl::Now());
  }
  const uint64_t hi = fresh.AddClient("urgent", "prod").id;
  const uint64_t lo = fresh.AddClient("trainer").id;
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.set_placement(proto::PLACEMENT_SPREAD);
  auto h = fresh.CreateSlice(hi, req);
  auto l = fresh.CreateSlice(lo, req);
  ASSERT_TRUE(h.ok() && l.ok());
  std::set<int64_t> high_hosts;
  for (const auto& d : h->devices()) high_hosts.insert(d.worker_id());
  for (const auto& d : l->devices()) {
    EXPECT_EQ(high_hosts.count(d.worker_id()), 0u) << d.worker_id();
  }
}

}  // namespace
}  // namespace plexus
