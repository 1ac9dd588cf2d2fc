// A lost host with no spare free, for slices that shrink on a loss
// (SliceRequest.on_loss = LOSS_SHRINK), driven on ClusterState directly:
// the smaller map, what moves and what is lost (and why), the minimum,
// the break policy, and the growth back as hosts join.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/common/status_proto.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {
namespace {

const ArgSpec kWhole{{DType::kF32, {3}}, Sharding::Replicated()};
const ArgSpec kRows{{DType::kF32, {12, 2}}, Sharding::Split(0)};

// Four hosts of one device each (workers 1..4), no spare.
class ShrinkOnLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int h = 0; h < 4; ++h) {
      workers_.push_back(
          state_.AddWorker(Host("host" + std::to_string(h), 1), absl::Now())
              .id);
    }
    client_ = state_.AddClient("test").id;
  }
  proto::SliceInfo Slice(int n, proto::LossPolicy policy, int min = 0,
                         bool grow = false) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.set_placement(proto::PLACEMENT_SPREAD);
    req.set_on_loss(policy);
    req.set_min_devices(min);
    req.set_grow(grow);
    auto s = state_.CreateSlice(client_, req);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : proto::SliceInfo();
  }
  uint64_t Put(uint64_t slice, const ArgSpec& spec) {
    proto::PutDecl put;
    put.set_buffer_id(ClientMadeId(client_, next_++));
    put.set_slice_id(slice);
    put.set_slice_resizes(state_.slices().at(slice).resizes);
    *put.mutable_arg() = ToProto(spec);
    WorkerOps ops;
    EXPECT_TRUE(state_.RoutePut(client_, put, &ops).ok());
    return put.buffer_id();
  }
  // A call of a built-in elementwise program reading `in`: its output, the
  // call's sequence number in `*seq`.
  uint64_t Negate(uint64_t slice, uint64_t in, uint64_t* seq) {
    if (negate_ == 0) {
      negate_ = ClientMadeId(client_, next_++);
      proto::RegisterProgram reg;
      reg.set_program_id(negate_);
      reg.mutable_program()->set_name("scale");
      reg.mutable_program()->set_kernel("scale");
      *reg.mutable_program()->add_inputs() = ToProto(kWhole);
      *reg.mutable_program()->add_outputs() = ToProto(kWhole);
      EXPECT_TRUE(state_.RegisterProgram(client_, reg).ok());
    }
    proto::Call call;
    call.set_call_id(ClientMadeId(client_, next_++));
    call.set_slice_id(slice);
    call.set_program_id(negate_);
    auto* i = call.add_inputs();
    i->set_buffer_id(in);
    i->set_slice_id(slice);
    *i->mutable_arg() = ToProto(kWhole);
    const uint64_t out = ClientMadeId(client_, next_++);
    call.add_output_ids(out);
    WorkerOps ops;
    EXPECT_TRUE(state_.RouteCall(client_, call, &ops, seq).ok());
    return out;
  }
  // The workers report a resize's moves done.
  void Settle(const SliceResized& r) {
    for (const auto& [seq, ops] : r.work) {
      WorkerOps releases;
      if (seq != 0) state_.CallDone(seq, false, &releases);
    }
  }
  void Settle(const WorkerLoss& loss) {
    for (const auto& [sid, r] : loss.shrunk) Settle(r);
  }
  static std::vector<int64_t> Workers(const proto::SliceInfo& s) {
    std::vector<int64_t> w;
    for (const auto& d : s.devices()) w.push_back(d.worker_id());
    return w;
  }

  ClusterState state_;
  std::vector<int64_t> workers_;
  uint64_t client_ = 0;
  uint64_t next_ = 1;
  uint64_t negate_ = 0;
};

TEST_F(ShrinkOnLossTest, ASliceShrinksOffTheLostHostAndSaysWhatItLost) {
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK);
  const uint64_t whole = Put(s.slice_id(), kWhole);
  const uint64_t rows = Put(s.slice_id(), kRows);
  uint64_t done_seq = 0, running_seq = 0;
  const uint64_t computed = Negate(s.slice_id(), whole, &done_seq);
  WorkerOps none;
  state_.CallDone(done_seq, false, &none);
  const uint64_t running = Negate(s.slice_id(), whole, &running_seq);
  uint64_t failed_seq = 0;
  const uint64_t failed = Negate(s.slice_id(), whole, &failed_seq);
  state_.CallDone(failed_seq, /*failed=*/true, &none);

  const int64_t lost = Workers(s)[2];
  WorkerLoss loss = state_.LoseWorker(lost, "killed");
  EXPECT_TRUE(loss.broken.empty());
  EXPECT_TRUE(loss.awaiting.empty());
  ASSERT_EQ(loss.shrunk.count(s.slice_id()), 1u);
  const SliceResized& r = loss.shrunk.at(s.slice_id());
  // The lost host's position goes; the others keep their order.
  EXPECT_EQ(
      Workers(r.slice),
      (std::vector<int64_t>{Workers(s)[0], Workers(s)[1], Workers(s)[3]}));
  EXPECT_EQ(r.slice.mesh_shape(0), 3);
  EXPECT_EQ(r.slice.resizes(), 1u);
  EXPECT_TRUE(r.note.resized());
  EXPECT_EQ(r.note.worker_id(), lost);
  // Replicated values move, done or still running (each surviving device
  // computes its own copy: the server may not have heard a call is done
  // that its client already waited for); the split one and the one whose
  // call failed are lost, the status naming each and why.
  EXPECT_EQ(
      std::set<uint64_t>(r.note.old_ids().begin(), r.note.old_ids().end()),
      (std::set<uint64_t>{whole, computed, running}));
  EXPECT_EQ(
      std::set<uint64_t>(r.note.lost_ids().begin(), r.note.lost_ids().end()),
      (std::set<uint64_t>{rows, failed}));
  const absl::Status why = StatusFromProto(r.note.status());
  EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(why.message().find("shrank from 4 to 3 devices when worker " +
                               std::to_string(lost) + " was lost (killed)"),
            std::string::npos)
      << why;
  EXPECT_NE(why.message().find("split over the slice's devices"),
            std::string::npos)
      << why;
  EXPECT_NE(why.message().find("its call failed"), std::string::npos) << why;
  // Nothing is asked of the lost host, and every move reads a copy on its
  // own device (no transfer).
  for (const auto& [seq, ops] : r.work) {
    EXPECT_EQ(ops.count(lost), 0u);
    for (const auto& [w, list] : ops) {
      for (const auto& op : list) EXPECT_FALSE(op.has_transfer());
    }
  }
  EXPECT_EQ(state_.recovery_counters().slices_shrunk(), 1);
  EXPECT_EQ(state_.slices().at(s.slice_id()).devices.size(), 3u);
}

TEST_F(ShrinkOnLossTest, ALostPutFailsOnTheHostsLeftSoItsShardsInFlightEnd) {
  // A put declared on the 4 devices whose shards the client is still
  // sending (it has not heard of the shrink): the shards on their way to
  // the hosts left must fail at once, not wait there for a declaration.
  // Released alone, they waited 10 minutes (the elastic example hung).
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK);
  const uint64_t rows = Put(s.slice_id(), kRows);
  const int64_t lost = Workers(s)[3];
  WorkerLoss loss = state_.LoseWorker(lost, "killed");
  ASSERT_EQ(loss.shrunk.count(s.slice_id()), 1u);
  const SliceResized& r = loss.shrunk.at(s.slice_id());
  ASSERT_EQ(r.note.lost_ids_size(), 1);
  ASSERT_EQ(r.note.lost_ids(0), rows);
  for (int64_t w : Workers(r.slice)) {
    bool released = false, failed_after = false;
    for (const auto& [seq, ops] : r.work) {
      auto it = ops.find(w);
      if (it == ops.end()) continue;
      for (const proto::WorkerOp& op : it->second) {
        if (op.has_release() &&
            std::count(op.release().buffer_ids().begin(),
                       op.release().buffer_ids().end(), rows) > 0) {
          released = true;
        }
        if (op.has_fail() && released &&
            std::count(op.fail().buffer_ids().begin(),
                       op.fail().buffer_ids().end(), rows) > 0) {
          failed_after = true;
          const absl::Status why = StatusFromProto(op.fail().status());
          EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss);
          EXPECT_NE(why.message().find("shrank from 4 to 3 devices"),
                    std::string::npos)
              << why;
        }
      }
    }
    EXPECT_TRUE(released) << "worker " << w;
    EXPECT_TRUE(failed_after) << "worker " << w;
  }
  for (const auto& [seq, ops] : r.work) EXPECT_EQ(ops.count(lost), 0u);
}

TEST_F(ShrinkOnLossTest, UnderItsMinimumTheSliceBreaksSayingSo) {
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK, /*min=*/4);
  WorkerLoss loss = state_.LoseWorker(Workers(s)[0], "killed");
  EXPECT_TRUE(loss.shrunk.empty());
  EXPECT_EQ(loss.broken, std::set<uint64_t>{s.slice_id()});
  const std::string& broken = state_.slices().at(s.slice_id()).broken;
  EXPECT_NE(broken.find("it did not shrink: it would shrink to 3 devices, "
                        "under its minimum of 4"),
            std::string::npos)
      << broken;
}

TEST_F(ShrinkOnLossTest, ABreakingSliceDoesNotWaitForASpare) {
  // A cluster given spares waits for one; a slice that breaks does not.
  state_.AddWorker(Host("spare0", 1, /*spare=*/true), absl::Now());
  const proto::SliceInfo s = Slice(4, proto::LOSS_BREAK);
  // The spare takes the first loss; the second finds no host free.
  WorkerLoss first = state_.LoseWorker(Workers(s)[0], "killed", absl::Now(),
                                       absl::Seconds(60));
  EXPECT_NE(first.spare, 0);
  WorkerLoss second = state_.LoseWorker(Workers(s)[1], "killed", absl::Now(),
                                        absl::Seconds(60));
  EXPECT_TRUE(second.awaiting.empty());
  EXPECT_EQ(second.broken, std::set<uint64_t>{s.slice_id()});
}

TEST_F(ShrinkOnLossTest, AGrowingSliceGrowsBackAsHostsJoin) {
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK, 2, /*grow=*/true);
  const uint64_t whole = Put(s.slice_id(), kWhole);
  Settle(state_.LoseWorker(Workers(s)[3], "killed"));
  Settle(state_.LoseWorker(Workers(s)[2], "killed"));
  ASSERT_EQ(state_.slices().at(s.slice_id()).devices.size(), 2u);
  // A third loss would go under the minimum of 2: nothing grows without
  // a host.
  EXPECT_TRUE(state_.GrowSlices().empty());
  const int64_t joined = state_.AddWorker(Host("host4", 1), absl::Now()).id;
  std::map<uint64_t, std::string> why;
  auto grown = state_.GrowSlices(&why);
  ASSERT_EQ(grown.size(), 1u) << why[s.slice_id()];
  EXPECT_EQ(grown[0].first, client_);
  const SliceResized& r = grown[0].second;
  EXPECT_EQ(Workers(r.slice),
            (std::vector<int64_t>{Workers(s)[0], Workers(s)[1], joined}));
  EXPECT_EQ(r.values_moved, 1);
  EXPECT_TRUE(r.note.resized());
  EXPECT_EQ(r.note.worker_id(), -1);
  EXPECT_EQ(r.note.lost_ids_size(), 0);
  // The moved value was the put, renamed (through the alias of the first
  // move).
  EXPECT_EQ(r.note.old_ids_size(), 1);
  EXPECT_NE(r.note.new_ids(0), whole);
  Settle(r);
  state_.AddWorker(Host("host5", 1), absl::Now());
  grown = state_.GrowSlices();
  ASSERT_EQ(grown.size(), 1u);
  EXPECT_EQ(grown[0].second.slice.devices_size(), 4);
  // Back to its size: no more growth.
  state_.AddWorker(Host("host6", 1), absl::Now());
  EXPECT_TRUE(state_.GrowSlices().empty());
  EXPECT_EQ(state_.recovery_counters().slices_grown(), 2);
}

TEST_F(ShrinkOnLossTest, AGrowthAValueDoesNotFitWaitsSayingWhy) {
  // 12 rows over 4, then 3 (a split value is lost on a shrink, so this one
  // is put after it); 12 rows do not fit 5 devices, but no slice is asked
  // past its size, so: 3 rows a device fit 4 again.
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK, 0, /*grow=*/true);
  state_.LoseWorker(Workers(s)[1], "killed");
  const ArgSpec odd{{DType::kF32, {9}}, Sharding::Split(0)};
  Put(s.slice_id(), odd);  // 9 rows: 3 devices divide them, 4 do not
  state_.AddWorker(Host("host4", 1), absl::Now());
  std::map<uint64_t, std::string> why;
  EXPECT_TRUE(state_.GrowSlices(&why).empty());
  ASSERT_EQ(why.count(s.slice_id()), 1u);
  EXPECT_NE(why[s.slice_id()].find("which 4 devices do not divide"),
            std::string::npos)
      << why[s.slice_id()];
  EXPECT_EQ(state_.slices().at(s.slice_id()).devices.size(), 3u);
}

TEST_F(ShrinkOnLossTest, APutCutForTheOldSizeIsRefused) {
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK);
  Settle(state_.LoseWorker(Workers(s)[0], "killed"));
  proto::PutDecl put;
  put.set_buffer_id(ClientMadeId(client_, next_++));
  put.set_slice_id(s.slice_id());
  put.set_slice_resizes(0);  // cut for the 4 devices
  *put.mutable_arg() = ToProto(kRows);
  WorkerOps ops;
  absl::Status refused = state_.RoutePut(client_, put, &ops);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("was resized (to 3 devices)"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(ops.empty());
  // Its shards may already wait at the three live workers of the old map
  // for a declaration: the buffer fails there, with the refusal.
  state_.FailRefusedPut(client_, put, refused, &ops);
  ASSERT_EQ(ops.size(), 3u);
  for (int64_t w : Workers(s)) {
    if (w == Workers(s)[0]) {
      EXPECT_EQ(ops.count(w), 0u) << "the lost worker";
      continue;
    }
    ASSERT_EQ(ops[w].size(), 1u);
    EXPECT_EQ(ops[w][0].fail().buffer_ids(0), put.buffer_id());
    EXPECT_NE(ops[w][0].fail().status().message().find("was resized"),
              std::string::npos);
  }
  // Not for a buffer of another client.
  WorkerOps none;
  put.set_buffer_id(ClientMadeId(client_ + 1, 1));
  state_.FailRefusedPut(client_, put, refused, &none);
  EXPECT_TRUE(none.empty());
}

TEST_F(ShrinkOnLossTest, ARefusedPutFailsOnTheWorkersAResizeDropped) {
  const proto::SliceInfo s = Slice(4, proto::LOSS_SHRINK);
  const std::vector<int64_t> before = Workers(s);
  proto::SliceResize resize;
  resize.set_slice_id(s.slice_id());
  resize.set_num_devices(2);
  ASSERT_TRUE(state_.ResizeSlice(client_, resize).ok());
  proto::PutDecl put;
  put.set_buffer_id(ClientMadeId(client_, next_++));
  put.set_slice_id(s.slice_id());
  put.set_slice_resizes(0);
  *put.mutable_arg() = ToProto(kRows);
  WorkerOps ops;
  absl::Status refused = state_.RoutePut(client_, put, &ops);
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  state_.FailRefusedPut(client_, put, refused, &ops);
  // The two kept and the two handed back: a push cut for 4 went to each.
  for (int64_t w : before) EXPECT_TRUE(ops.count(w)) << "worker " << w;
  // So does a refused call's output: a client that has not heard of the
  // resize waits for it on the old map's hosts.
  proto::Call call;
  call.set_call_id(ClientMadeId(client_, next_++));
  call.set_slice_id(s.slice_id());
  call.add_output_ids(ClientMadeId(client_, next_++));
  WorkerOps failed;
  state_.FailCallOutputs(client_, call, refused, &failed);
  for (int64_t w : before) EXPECT_TRUE(failed.count(w)) << "worker " << w;
}

TEST_F(ShrinkOnLossTest, BadPoliciesAreRefusedNamingWhat) {
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.set_grow(true);
  auto s = state_.CreateSlice(client_, req);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("(on_loss or on_preempt shrink)"),
            std::string::npos);
  req.set_on_loss(proto::LOSS_SHRINK);
  req.set_elastic_axis(1);
  s = state_.CreateSlice(client_, req);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("elastic axis 1"), std::string::npos);
  req.set_elastic_axis(0);
  req.set_min_devices(3);
  s = state_.CreateSlice(client_, req);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("min_devices 3"), std::string::npos);
  req.set_min_devices(0);
  req.set_on_loss(static_cast<proto::LossPolicy>(7));
  s = state_.CreateSlice(client_, req);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("loss policy 7"), std::string::npos);
}

}  // namespace
}  // namespace plexus
