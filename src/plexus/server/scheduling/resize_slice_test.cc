// ClusterState::ResizeSlice driven directly: the new map, the moves and
// releases it routes, the note for the client, and refusals that change
// nothing.
#include <limits>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {
namespace {

class ResizeSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int h = 0; h < 4; ++h) {
      workers_.push_back(
          state_.AddWorker(Host("host" + std::to_string(h), 1), absl::Now())
              .id);
    }
    client_ = state_.AddClient("test").id;
  }
  proto::SliceInfo Slice(int n, std::vector<int32_t> mesh = {},
                         std::vector<std::string> hosts = {}) {
    proto::SliceRequest req;
    req.set_num_devices(n);
    req.set_placement(proto::PLACEMENT_SPREAD);
    for (int32_t m : mesh) req.add_mesh_shape(m);
    for (const auto& h : hosts) req.add_hosts(h);
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
    proto::Recovery reput;
    EXPECT_TRUE(state_.RoutePut(client_, put, &ops, &reput).ok());
    return put.buffer_id();
  }
  absl::StatusOr<SliceResized> Resize(uint64_t slice, int n, int axis = 0) {
    proto::SliceResize req;
    req.set_slice_id(slice);
    req.set_num_devices(n);
    req.set_axis(axis);
    return state_.ResizeSlice(client_, req);
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
};

const ArgSpec kRows{{DType::kF32, {8, 2}}, Sharding::Split(0)};
const ArgSpec kWhole{{DType::kF32, {3}}, Sharding::Replicated()};

TEST_F(ResizeSliceTest, AShrinkKeepsTheFirstDevicesAndMovesEveryValue) {
  const proto::SliceInfo s = Slice(4);
  const uint64_t rows = Put(s.slice_id(), kRows);
  const uint64_t whole = Put(s.slice_id(), kWhole);
  auto r = Resize(s.slice_id(), 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Workers(r->slice),
            (std::vector<int64_t>{Workers(s)[0], Workers(s)[1]}));
  EXPECT_EQ(r->slice.generation(), s.generation() + 1);
  EXPECT_EQ(r->slice.resizes(), 1u);
  EXPECT_TRUE(r->freed_devices);
  EXPECT_EQ(r->values_moved, 2);
  EXPECT_EQ(r->bytes_moved, 8 * 2 * 4 + 3 * 4 * 2);
  // The note: not a loss; each value's new id; the new map.
  EXPECT_TRUE(r->note.resized());
  ASSERT_EQ(r->note.old_ids_size(), 2);
  EXPECT_EQ(
      std::set<uint64_t>(r->note.old_ids().begin(), r->note.old_ids().end()),
      (std::set<uint64_t>{rows, whole}));
  ASSERT_EQ(r->note.remapped_size(), 1);
  EXPECT_EQ(r->note.remapped(0).devices_size(), 2);
  // One unit per move (a call), then the releases of the old copies on
  // every host of the old map, the two it left among them.
  ASSERT_EQ(r->work.size(), 3u);
  EXPECT_NE(r->work[0].first, 0u);
  EXPECT_NE(r->work[1].first, 0u);
  EXPECT_EQ(r->work[2].first, 0u);
  std::set<int64_t> released_on;
  for (const auto& [w, ops] : r->work[2].second) {
    for (const auto& op : ops) {
      if (op.has_release()) released_on.insert(w);
    }
  }
  EXPECT_EQ(released_on, std::set<int64_t>(workers_.begin(), workers_.end()));
  // The split value's rows 4..7 come from the hosts the slice left.
  const uint64_t split_move = r->note.old_ids(0) == rows ? 0 : 1;
  int transfers_from_left = 0;
  for (const auto& [w, ops] : r->work[split_move].second) {
    for (const auto& op : ops) {
      if (op.has_transfer() && (w == Workers(s)[2] || w == Workers(s)[3])) {
        transfers_from_left++;
      }
    }
  }
  EXPECT_EQ(transfers_from_left, 2);
  // The old ids now name the new values: a release of one reaches them.
  EXPECT_EQ(state_.slices().at(s.slice_id()).devices.size(), 2u);
}

TEST_F(ResizeSliceTest, AGrowthTakesHostsTheSliceIsNotOn) {
  const proto::SliceInfo s = Slice(2, {}, {"host0", "host1"});
  Put(s.slice_id(), kRows);
  auto r = Resize(s.slice_id(), 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->freed_devices);
  const std::vector<int64_t> now = Workers(r->slice);
  ASSERT_EQ(now.size(), 4u);
  EXPECT_EQ(now[0], Workers(s)[0]);
  EXPECT_EQ(now[1], Workers(s)[1]);
  EXPECT_EQ(std::set<int64_t>(now.begin(), now.end()).size(), 4u);
  // No more devices than the cluster has.
  auto more = Resize(s.slice_id(), 8);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("4 devices more to grow"),
            std::string::npos)
      << more.status();
}

TEST_F(ResizeSliceTest, AValueTheNewSizeDoesNotDivideIsRefusedAndNothingMoves) {
  const proto::SliceInfo s = Slice(2);
  const ArgSpec six{{DType::kF32, {6, 2}}, Sharding::Split(0)};
  const uint64_t id = Put(s.slice_id(), six);
  auto r = Resize(s.slice_id(), 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find(absl::StrCat("buffer ", id)), std::string::npos) << msg;
  EXPECT_NE(msg.find("that would: 1, 2, 3, 6"), std::string::npos) << msg;
  const SliceRecord& after = state_.slices().at(s.slice_id());
  EXPECT_EQ(after.devices.size(), 2u);
  EXPECT_EQ(after.generation, s.generation());
  EXPECT_EQ(after.resizes, 0u);
}

TEST_F(ResizeSliceTest, AMeshKeepsItsOtherAxes) {
  const proto::SliceInfo s = Slice(4, {2, 2});
  auto odd = Resize(s.slice_id(), 3);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("a multiple of 2"), std::string::npos)
      << odd.status();
  EXPECT_FALSE(Resize(s.slice_id(), 2, /*axis=*/2).ok());
  // Along axis 1: the devices of column 0, rows 0 and 1 (virtual 0 and 2).
  auto r = Resize(s.slice_id(), 2, /*axis=*/1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Workers(r->slice),
            (std::vector<int64_t>{Workers(s)[0], Workers(s)[2]}));
  EXPECT_EQ(std::vector<int32_t>(r->slice.mesh_shape().begin(),
                                 r->slice.mesh_shape().end()),
            (std::vector<int32_t>{2, 1}));
}

TEST_F(ResizeSliceTest, AnXlaProgramCompiledForTheOldMapIsRefusedAfter) {
  const proto::SliceInfo s = Slice(2);
  proto::RegisterProgram reg;
  reg.set_program_id(ClientMadeId(client_, 100));
  reg.mutable_program()->set_name("step");
  reg.mutable_program()->set_kernel("xla");
  reg.mutable_program()->mutable_xla()->set_module("m");
  for (int64_t w : Workers(s)) {
    auto* island = reg.mutable_program()->mutable_xla()->add_islands();
    island->add_devices(0);
    island->add_workers(w);
  }
  *reg.mutable_program()->add_inputs() = ToProto(kWhole);
  *reg.mutable_program()->add_outputs() = ToProto(kWhole);
  ASSERT_TRUE(state_.RegisterProgram(client_, reg).ok());
  const uint64_t x = Put(s.slice_id(), kWhole);
  ASSERT_TRUE(Resize(s.slice_id(), 4).ok());
  proto::Call call;
  call.set_call_id(ClientMadeId(client_, 200));
  call.set_slice_id(s.slice_id());
  call.set_program_id(reg.program_id());
  call.add_output_ids(ClientMadeId(client_, 201));
  auto* in = call.add_inputs();
  in->set_buffer_id(x);  // its old id: the server reads the moved value
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(kWhole);
  WorkerOps ops;
  absl::Status routed = state_.RouteCall(client_, call, &ops);
  ASSERT_FALSE(routed.ok());
  EXPECT_EQ(routed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(routed.message().find("before its resize to 4 devices"),
            std::string::npos)
      << routed;
}

// Each map of a slice has its own shard layout: after a resize, the first
// own-shards call tells every host of the new map its part under a new id
// (an Execute naming the old one would run the old shards).
TEST_F(ResizeSliceTest, TheNewMapsHostsAreToldANewShardLayout) {
  const proto::SliceInfo s = Slice(2);
  proto::RegisterProgram reg;
  reg.set_program_id(ClientMadeId(client_, 100));
  reg.mutable_program()->set_name("copy");
  reg.mutable_program()->set_kernel("identity");
  *reg.mutable_program()->add_inputs() = ToProto(kWhole);
  *reg.mutable_program()->add_outputs() = ToProto(kWhole);
  ASSERT_TRUE(state_.RegisterProgram(client_, reg).ok());
  const uint64_t x = Put(s.slice_id(), kWhole);
  auto call = [&](uint64_t n) {
    proto::Call c;
    c.set_call_id(ClientMadeId(client_, n));
    c.set_slice_id(s.slice_id());
    c.set_program_id(reg.program_id());
    c.add_output_ids(ClientMadeId(client_, n + 1));
    auto* in = c.add_inputs();
    in->set_buffer_id(x);  // after the resize: the moved value
    in->set_slice_id(s.slice_id());
    *in->mutable_arg() = ToProto(kWhole);
    return c;
  };
  // The layout ops told, by worker: (layout id, its shards).
  auto told = [&] {
    std::map<int64_t, std::pair<uint64_t, std::vector<int32_t>>> out;
    for (auto& [w, list] : state_.TakePeerOps()) {
      for (const proto::WorkerOp& op : list) {
        if (!op.has_shard_layout()) continue;
        out[w] = {op.shard_layout().layout_id(),
                  {op.shard_layout().shards().begin(),
                   op.shard_layout().shards().end()}};
      }
    }
    return out;
  };
  (void)state_.TakePeerOps();
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call(200), &ops).ok());
  auto before = told();
  ASSERT_EQ(before.size(), 2u);
  const uint64_t old_id = before.begin()->second.first;

  auto resized = Resize(s.slice_id(), 4);
  ASSERT_TRUE(resized.ok()) << resized.status();
  (void)state_.TakePeerOps();
  ASSERT_TRUE(state_.RouteCall(client_, call(300), &ops).ok());
  auto after = told();
  ASSERT_EQ(after.size(), 4u);
  const std::vector<int64_t> now = Workers(resized->slice);
  for (size_t j = 0; j < now.size(); ++j) {
    ASSERT_EQ(after.count(now[j]), 1u) << "worker " << now[j];
    EXPECT_NE(after[now[j]].first, old_id);
    EXPECT_EQ(after[now[j]].first, after.begin()->second.first);
    EXPECT_EQ(after[now[j]].second,
              std::vector<int32_t>{static_cast<int32_t>(j)});
  }
}

TEST_F(ResizeSliceTest, HostileSizesAreRefusedAtOnce) {
  // A size far past the cluster is refused before anything of its size is
  // made; a dimension with no small divisor past 127 (2^49 - 1 = 127 *
  // 4432676798593) is refused after a bounded search for the sizes that
  // would fit (it counted up to the dimension itself).
  const proto::SliceInfo s = Slice(1);
  auto huge = Resize(s.slice_id(), std::numeric_limits<int32_t>::max());
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  const ArgSpec tall{{DType::kI8, {(int64_t{1} << 49) - 1}},
                     Sharding::Split(0)};
  Put(s.slice_id(), tall);
  auto r = Resize(s.slice_id(), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("that would: 1, 127 ("),
            std::string::npos)
      << r.status();
}

TEST_F(ResizeSliceTest, OnlyItsClientResizesASlice) {
  const proto::SliceInfo s = Slice(2);
  const uint64_t other = state_.AddClient("other").id;
  proto::SliceResize req;
  req.set_slice_id(s.slice_id());
  req.set_num_devices(1);
  auto r = state_.ResizeSlice(other, req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.slices().at(s.slice_id()).devices.size(), 2u);
}

}  // namespace
}  // namespace plexus
