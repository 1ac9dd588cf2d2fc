// Placement and call routing, driven directly on ClusterState.
#include "plexus/server/model/cluster_state.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state_test_util.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

using ::testing::ElementsAre;

TEST_F(ClusterStateTest, DefaultPlacementKeepsASliceThatFitsOnOneHost) {
  proto::SliceInfo s = Slice(2);
  EXPECT_EQ(s.devices(0).worker_id(), s.devices(1).worker_id());
}

TEST_F(ClusterStateTest, SpreadPlacementSpreadsOverHosts) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_SPREAD);
  EXPECT_NE(s.devices(0).worker_id(), s.devices(1).worker_id());
}

TEST_F(ClusterStateTest, OneHostPlacementStaysOnOneHost) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_ONE_HOST);
  EXPECT_EQ(s.devices(0).worker_id(), s.devices(1).worker_id());
}

TEST_F(ClusterStateTest, SmallSlicesFillTheLeastLoadedDevices) {
  std::set<std::pair<int64_t, int>> used;
  for (int i = 0; i < 4; ++i) {
    proto::SliceInfo s = Slice(1, proto::PLACEMENT_ONE_HOST);
    used.insert({s.devices(0).worker_id(), s.devices(0).device()});
  }
  EXPECT_EQ(used.size(), 4u);  // every device of both hosts, none twice
}

TEST_F(ClusterStateTest, TooLargeSliceNamesTheClusterSize) {
  proto::SliceRequest req;
  req.set_num_devices(5);
  auto s = state_.CreateSlice(client_, req);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("4 live devices on 2 hosts"),
            std::string::npos);
}

TEST_F(ClusterStateTest, CallBetweenSlicesOnDifferentHostsTransfers) {
  proto::SliceInfo a = Slice(1, proto::PLACEMENT_ONE_HOST);  // host0
  proto::SliceInfo b = Slice(1, proto::PLACEMENT_ONE_HOST);  // host1
  ASSERT_NE(a.devices(0).worker_id(), b.devices(0).worker_id());
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  proto::Call call;
  call.set_call_id(Id(2));
  call.set_slice_id(b.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(a.slice_id());
  *in->mutable_arg() = ToProto(arg);
  call.add_output_ids(Id(4));
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call, &ops).ok());
  const auto& src = ops[a.devices(0).worker_id()];
  const auto& dst = ops[b.devices(0).worker_id()];
  ASSERT_EQ(src.size(), 1u);
  EXPECT_TRUE(src[0].has_transfer());
  EXPECT_EQ(src[0].transfer().dst_worker_id(), b.devices(0).worker_id());
  ASSERT_EQ(dst.size(), 3u);  // expect, load, execute
  EXPECT_TRUE(dst[0].has_expect());
  EXPECT_TRUE(dst[1].has_load());
  const auto& piece = dst[2].execute().tasks(0).inputs(0).pieces(0);
  EXPECT_EQ(piece.buffer_id(), src[0].transfer().dst_buffer_id());
}

// A call's input that names no layout (InputRef.arg absent: protocol
// version 2, what a client sends when the value has the program's layout)
// is routed as one naming the program's layout; one naming another layout
// is moved to the program's.
TEST_F(ClusterStateTest, AnInputThatNamesNoLayoutHasTheProgramsLayout) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_SPREAD);
  ArgSpec split{{DType::kF32, {8}}, Sharding::Split(0)};
  ArgSpec replicated{{DType::kF32, {8}}, Sharding::Replicated()};
  Register(Id(1), "scale", split, split);
  auto route = [&](uint64_t call_id, const ArgSpec* layout) {
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(s.slice_id());
    call.set_program_id(Id(1));
    auto* in = call.add_inputs();
    in->set_buffer_id(Id(3));
    in->set_slice_id(s.slice_id());
    if (layout != nullptr) *in->mutable_arg() = ToProto(*layout);
    call.add_output_ids(call_id + 1);
    WorkerOps ops;
    absl::Status routed = state_.RouteCall(client_, call, &ops);
    EXPECT_TRUE(routed.ok()) << routed;
    // Each shard's input binding, as the worker reads it.
    std::vector<std::string> bindings;
    for (auto& [worker, list] : ops) {
      for (const proto::WorkerOp& op : list) {
        if (!op.has_execute()) continue;
        for (const proto::ShardTask& task : op.execute().tasks()) {
          bindings.push_back(task.inputs(0).SerializeAsString());
        }
      }
    }
    return bindings;
  };
  const std::vector<std::string> none = route(Id(10), nullptr);
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(none, route(Id(20), &split));
  // A replicated value read as split: each shard's piece from a whole copy.
  EXPECT_NE(none, route(Id(30), &replicated));
}

// A worker is told of a peer as the first op that needs it is made
// (ClusterState::TellPeer), once, into TakePeerOps (which the server sends
// ahead of every unit not yet admitted): the source of a transfer of the
// destination; each rank of a collective of the others, once per map.
TEST_F(ClusterStateTest, AWorkerIsToldOfAPeerOnceAsAnOpNeedsIt) {
  proto::SliceInfo a = Slice(1, proto::PLACEMENT_ONE_HOST);  // host0
  proto::SliceInfo b = Slice(1, proto::PLACEMENT_ONE_HOST);  // host1
  const int64_t src = a.devices(0).worker_id();
  const int64_t dst = b.devices(0).worker_id();
  ASSERT_NE(src, dst);
  EXPECT_TRUE(state_.TakePeerOps().empty());  // registering told no one
  EXPECT_FALSE(state_.ToldPeer(src, dst));
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  auto call_on_b = [&](uint64_t call_id, uint64_t input) {
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(b.slice_id());
    call.set_program_id(Id(1));
    auto* in = call.add_inputs();
    in->set_buffer_id(input);
    in->set_slice_id(a.slice_id());
    *in->mutable_arg() = ToProto(arg);
    call.add_output_ids(call_id + 1);
    return call;
  };
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call_on_b(Id(10), Id(3)), &ops).ok());
  WorkerOps told = state_.TakePeerOps();
  ASSERT_EQ(told.size(), 1u);
  ASSERT_EQ(told[src].size(), 1u);
  EXPECT_EQ(told[src][0].peer().worker_id(), dst);
  EXPECT_EQ(told[src][0].peer().generation(),
            state_.FindWorker(dst)->generation);
  EXPECT_TRUE(state_.ToldPeer(src, dst));
  EXPECT_FALSE(state_.ToldPeer(dst, src));  // nothing goes that way
  // The next transfer between them tells nothing again.
  ASSERT_TRUE(state_.RouteCall(client_, call_on_b(Id(20), Id(4)), &ops).ok());
  EXPECT_TRUE(state_.TakePeerOps().empty());

  // A collective over both hosts: each is told of the other (and itself),
  // once for the slice's map.
  proto::SliceInfo both = Slice(2, proto::PLACEMENT_SPREAD);
  ASSERT_NE(both.devices(0).worker_id(), both.devices(1).worker_id());
  ArgSpec partial{{DType::kF32, {4}}, Sharding::Partial()};
  ArgSpec whole{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(30), "all_reduce", partial, whole);
  auto reduce = [&](uint64_t call_id) {
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(both.slice_id());
    call.set_program_id(Id(30));
    auto* in = call.add_inputs();
    in->set_buffer_id(call_id - 1);
    in->set_slice_id(both.slice_id());
    *in->mutable_arg() = ToProto(partial);
    call.add_output_ids(call_id + 1);
    return call;
  };
  ASSERT_TRUE(state_.RouteCall(client_, reduce(Id(41)), &ops).ok());
  told = state_.TakePeerOps();
  for (int64_t w : {src, dst}) {
    for (int64_t p : {src, dst}) {
      EXPECT_TRUE(state_.ToldPeer(w, p)) << w << " of " << p;
    }
  }
  // Only what was not told before: dst of src, each of itself (beside
  // them, each host's shard layout of the map: the next test's).
  int peer_ops = 0;
  for (const auto& [w, list] : told) {
    for (const proto::WorkerOp& op : list) peer_ops += op.has_peer() ? 1 : 0;
  }
  EXPECT_EQ(peer_ops, 3);
  ASSERT_TRUE(state_.RouteCall(client_, reduce(Id(51)), &ops).ok());
  EXPECT_TRUE(state_.TakePeerOps().empty());
}

// An own-shards call (each shard reads its own shard of each input) sends
// every host the same Execute naming the map's shard layout; each host is
// told its part once, into TakePeerOps (ahead of every unit not yet
// admitted), as the first such call on the map is routed.
TEST_F(ClusterStateTest, AMapsHostsAreToldTheirShardLayoutOnceAheadOfItsCalls) {
  proto::SliceInfo both = Slice(2, proto::PLACEMENT_SPREAD);
  const int64_t w0 = both.devices(0).worker_id();
  const int64_t w1 = both.devices(1).worker_id();
  ASSERT_NE(w0, w1);
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  auto call = [&](uint64_t call_id) {
    proto::Call c;
    c.set_call_id(call_id);
    c.set_slice_id(both.slice_id());
    c.set_program_id(Id(1));
    auto* in = c.add_inputs();
    in->set_buffer_id(call_id - 1);
    in->set_slice_id(both.slice_id());
    *in->mutable_arg() = ToProto(arg);
    c.add_output_ids(call_id + 1);
    return c;
  };
  EXPECT_TRUE(state_.TakePeerOps().empty());
  std::shared_ptr<CallExecutes> executes;
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, call(Id(10)), &ops, nullptr, &executes).ok());
  WorkerOps told = state_.TakePeerOps();
  uint64_t layout_id = 0;
  for (int j = 0; j < 2; ++j) {
    const int64_t w = both.devices(j).worker_id();
    ASSERT_EQ(told[w].size(), 1u) << "worker " << w;
    const proto::ShardLayout& layout = told[w][0].shard_layout();
    EXPECT_NE(layout.layout_id(), 0u);
    if (j == 0) layout_id = layout.layout_id();
    EXPECT_EQ(layout.layout_id(), layout_id);  // one id for the map
    EXPECT_EQ(layout.client_id(), client_);
    EXPECT_THAT(layout.devices(), ElementsAre(both.devices(j).device()));
    EXPECT_THAT(layout.shards(), ElementsAre(j));
  }
  // Every host's Execute is the same bytes, naming the layout...
  ASSERT_EQ(executes->hosts(), 2);
  std::string first(executes->WorkerOpSize(0), '\0');
  executes->WriteWorkerOp(0, reinterpret_cast<uint8_t*>(first.data()));
  std::string second(executes->WorkerOpSize(1), '\0');
  executes->WriteWorkerOp(1, reinterpret_cast<uint8_t*>(second.data()));
  EXPECT_EQ(first, second);
  proto::WorkerOp sent;
  ASSERT_TRUE(sent.ParseFromString(first));
  EXPECT_EQ(sent.execute().layout_id(), layout_id);
  // ...and read back (taken work, routed again) with each host's task.
  for (int h = 0; h < 2; ++h) {
    const proto::Execute exec = executes->Execute(h);
    EXPECT_EQ(exec.layout_id(), 0u);
    ASSERT_EQ(exec.tasks_size(), 1);
    const int j = executes->worker(h) == w0 ? 0 : 1;
    EXPECT_EQ(exec.tasks(0).shard(), j);
    EXPECT_EQ(exec.tasks(0).device(), both.devices(j).device());
    EXPECT_EQ(exec.tasks(0).inputs(0).pieces(0).shard(), j);
  }
  // The next call on the same map tells nothing again.
  ASSERT_TRUE(state_.RouteCall(client_, call(Id(20)), &ops).ok());
  EXPECT_TRUE(state_.TakePeerOps().empty());
}

TEST_F(ClusterStateTest, TransferTemporariesStartAgainAfterTheLayoutsLast) {
  proto::SliceInfo a = Slice(1, proto::PLACEMENT_ONE_HOST);  // host0
  proto::SliceInfo b = Slice(1, proto::PLACEMENT_ONE_HOST);  // host1
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  state_.set_next_transfer(kMaxIdCount);
  std::vector<uint64_t> temps;
  for (int k = 0; k < 2; ++k) {
    proto::Call call;
    call.set_call_id(Id(10 + 3 * k));
    call.set_slice_id(b.slice_id());
    call.set_program_id(Id(1));
    auto* in = call.add_inputs();
    in->set_buffer_id(Id(11 + 3 * k));
    in->set_slice_id(a.slice_id());
    *in->mutable_arg() = ToProto(arg);
    call.add_output_ids(Id(12 + 3 * k));
    WorkerOps ops;
    ASSERT_TRUE(state_.RouteCall(client_, call, &ops).ok());
    const auto& src = ops[a.devices(0).worker_id()];
    ASSERT_EQ(src.size(), 1u);
    ASSERT_TRUE(src[0].has_transfer());
    temps.push_back(src[0].transfer().dst_buffer_id());
  }
  // The last of the count, then the first again: both in the server's own
  // namespace, neither in its server-made half (before, the second was
  // ClientMadeId(kServerClientId, 2^39), which is ServerMadeId(..., 0)).
  EXPECT_EQ(temps[0], ClientMadeId(kServerClientId, kMaxIdCount));
  EXPECT_EQ(temps[1], ClientMadeId(kServerClientId, 1));
  for (uint64_t t : temps) {
    EXPECT_EQ(ClientOfBuffer(t), kServerClientId);
    EXPECT_FALSE(IsServerMade(t));
  }
}

TEST_F(ClusterStateTest, ResplitGathersOverlappingPieces) {
  proto::SliceInfo two = Slice(2);
  proto::SliceInfo one = Slice(1, proto::PLACEMENT_ONE_HOST);
  ArgSpec arg{{DType::kF32, {8, 3}}, Sharding::Split(0)};
  Register(Id(1), "identity", arg, arg);
  proto::Call call;
  call.set_call_id(Id(2));
  call.set_slice_id(one.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(two.slice_id());
  *in->mutable_arg() = ToProto(arg);
  call.add_output_ids(Id(4));
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call, &ops).ok());
  const auto& exec = ops[one.devices(0).worker_id()].back().execute();
  const auto& binding = exec.tasks(0).inputs(0);
  ASSERT_EQ(binding.pieces_size(), 2);
  EXPECT_EQ(binding.pieces(0).dst_offset(), 0);
  EXPECT_EQ(binding.pieces(1).dst_offset(), 4);
  EXPECT_EQ(binding.pieces(1).length(), 4);
}

TEST_F(ClusterStateTest, MismatchedArgumentNamesProgramAndShapes) {
  proto::SliceInfo s = Slice(1);
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  proto::Call call;
  call.set_slice_id(s.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(ArgSpec{{DType::kF32, {5}}, Sharding()});
  call.add_output_ids(Id(4));
  WorkerOps ops;
  absl::Status st = state_.RouteCall(client_, call, &ops);
  EXPECT_EQ(st.message(),
            "program 'scale' argument 0 is float32[5] replicated but the "
            "program was compiled for float32[4] replicated");
  EXPECT_TRUE(ops.empty());
}

TEST_F(ClusterStateTest, DeadHostBreaksItsSlices) {
  proto::SliceInfo s = Slice(2);
  auto clients = state_.MarkWorkerDown(s.devices(0).worker_id(), "killed");
  EXPECT_EQ(clients.count(client_), 1u);
  proto::Call call;
  call.set_slice_id(s.slice_id());
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", arg, arg);
  call.set_program_id(Id(1));
  WorkerOps ops;
  absl::Status st = state_.RouteCall(client_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("killed"), std::string::npos);
}

// Found by reading RouteCall while writing fuzz/client_batch_fuzz.cc: an
// empty array split over a slice of another layout divided by its zero
// rows per source shard (SIGFPE in the server).
TEST_F(ClusterStateTest, EmptySplitArrayMovesBetweenLayouts) {
  proto::SliceInfo four = Slice(4);
  proto::SliceInfo two = Slice(2);
  ArgSpec arg{{DType::kF32, {0, 3}}, Sharding::Split(0)};
  Register(Id(1), "relu", arg, arg);
  proto::Call call;
  call.set_call_id(1);
  call.set_slice_id(two.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(2));
  in->set_slice_id(four.slice_id());
  *in->mutable_arg() = ToProto(arg);
  call.add_output_ids(Id(3));
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call, &ops).ok());
}

// A mesh must name positive dimensions: [-1, -2] holds 2 devices by the
// product alone, and dimensions of 2^31 - 1 overflowed the product.
TEST_F(ClusterStateTest, MeshDimensionsArePositiveAndTheirProductIsChecked) {
  for (std::vector<int32_t> mesh :
       {std::vector<int32_t>{-1, -2}, std::vector<int32_t>{2, 0},
        std::vector<int32_t>(4, 2147483647)}) {
    proto::SliceRequest req;
    req.set_num_devices(2);
    for (int32_t m : mesh) req.add_mesh_shape(m);
    auto s = state_.CreateSlice(client_, req);
    ASSERT_FALSE(s.ok()) << mesh[0];
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("mesh shape ["), std::string::npos)
        << s.status();
  }
  EXPECT_TRUE(state_.slices().empty());
}

TEST_F(ClusterStateTest, OnlyTheOwnerReleasesABuffer) {
  proto::SliceInfo s = Slice(2, proto::PLACEMENT_SPREAD);
  const uint64_t other = state_.AddClient("other").id;
  proto::ReleaseRef release;
  release.set_slice_id(s.slice_id());
  release.set_buffer_id(Id(7));
  WorkerOps ops;
  state_.RouteRelease(other, release, &ops);
  EXPECT_TRUE(ops.empty()) << "another client released client " << client_
                           << "'s buffer";
  state_.RouteRelease(client_, release, &ops);
  EXPECT_EQ(ops.size(), 2u);  // both workers of the slice
}

// A call's record names each input's layout as the call sent it: its
// program's when that is the one named (the record points at it: no copy
// per call), else its own. The program registered again under its id, with
// other layouts, leaves them as they were: recovery routes the call again
// as it was sent.
TEST_F(ClusterStateTest,
       ACallRecordKeepsItsLayoutsWhenItsProgramIsRegisteredAgain) {
  proto::SliceInfo s = Slice(2);
  const ArgSpec split{{DType::kF32, {4}}, Sharding::Split(0)};
  const ArgSpec whole{{DType::kF32, {4}}, Sharding::Replicated()};
  Register(Id(1), "scale", split, split);
  auto call_reading = [&](uint64_t call_id, const ArgSpec& layout) {
    proto::Call call;
    call.set_call_id(Id(call_id));
    call.set_slice_id(s.slice_id());
    call.set_program_id(Id(1));
    auto* in = call.add_inputs();
    in->set_buffer_id(Id(call_id + 1));
    in->set_slice_id(s.slice_id());
    *in->mutable_arg() = ToProto(layout);
    call.add_output_ids(Id(call_id + 2));
    return call;
  };
  WorkerOps ops;
  uint64_t as_program = 0, relaid = 0;
  ASSERT_TRUE(
      state_.RouteCall(client_, call_reading(10, split), &ops, &as_program)
          .ok());
  ASSERT_TRUE(
      state_.RouteCall(client_, call_reading(20, whole), &ops, &relaid).ok());
  Register(Id(1), "scale", whole, whole);
  Register(Id(1), "scale", whole, whole);  // and again: each one stays
  const std::pair<uint64_t, ArgSpec> expected[] = {{as_program, split},
                                                   {relaid, whole}};
  for (const auto& [seq, layout] : expected) {
    const CallRecord* rec = state_.records().FindCall(seq);
    ASSERT_NE(rec, nullptr);
    auto arg = FromProto(rec->ToCall().inputs(0).arg());
    ASSERT_TRUE(arg.ok()) << arg.status();
    EXPECT_EQ(*arg, layout) << arg->ToString();
  }
}

// RouteCall reads a layout the call writes as its program was registered
// with without parsing it again (SameArgDef in route_call.cc compares every
// field). A field added to these messages must be compared there too.
TEST(LayoutProtoTest, ALayoutIsComparedByEveryFieldItHas) {
  EXPECT_EQ(proto::ArgDef::descriptor()->field_count(), 2);
  EXPECT_EQ(proto::TensorSpec::descriptor()->field_count(), 2);
  EXPECT_EQ(proto::Sharding::descriptor()->field_count(), 5);
  EXPECT_EQ(proto::IntList::descriptor()->field_count(), 1);
}

// Client B knows client A's ids (they are sequential, and `plexus status`
// shows client ids): naming them gets B nothing. Each attempt is refused
// with PERMISSION_DENIED naming what was refused, and no op reaches a
// worker.
class OwnershipTest : public ClusterStateTest {
 protected:
  void SetUp() override {
    ClusterStateTest::SetUp();
    a_slice_ = Slice(2);
    Register(Id(1), "scale", arg_, arg_);
    other_ = state_.AddClient("other").id;
    proto::SliceRequest req;
    req.set_num_devices(2);
    auto s = state_.CreateSlice(other_, req);
    ASSERT_TRUE(s.ok()) << s.status();
    b_slice_ = *s;
    proto::RegisterProgram reg;
    reg.set_program_id(B(1));
    reg.mutable_program()->set_name("b_scale");
    reg.mutable_program()->set_kernel("scale");
    *reg.mutable_program()->add_inputs() = ToProto(arg_);
    *reg.mutable_program()->add_outputs() = ToProto(arg_);
    ASSERT_TRUE(state_.RegisterProgram(other_, reg).ok());
  }
  uint64_t B(uint64_t n) { return ClientMadeId(other_, n); }
  // A call of B's program on B's slice, reading `input`.
  proto::Call BCall(uint64_t input) {
    proto::Call call;
    call.set_call_id(B(2));
    call.set_slice_id(b_slice_.slice_id());
    call.set_program_id(B(1));
    auto* in = call.add_inputs();
    in->set_buffer_id(input);
    in->set_slice_id(b_slice_.slice_id());
    *in->mutable_arg() = ToProto(arg_);
    call.add_output_ids(B(3));
    return call;
  }

  ArgSpec arg_{{DType::kF32, {4}}, Sharding::Replicated()};
  proto::SliceInfo a_slice_, b_slice_;
  uint64_t other_ = 0;
};

TEST_F(OwnershipTest, ACallReadsOnlyItsClientsBuffers) {
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(other_, BCall(B(5)), &ops).ok());
  ops.clear();
  absl::Status st = state_.RouteCall(other_, BCall(Id(5)), &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_EQ(st.message(),
            absl::StrCat("program 'b_scale' argument 0: buffer id ", Id(5),
                         " belongs to another client"));
  EXPECT_TRUE(ops.empty());
}

TEST_F(OwnershipTest, ACallWritesOnlyItsClientsBuffers) {
  proto::Call call = BCall(B(5));
  call.set_output_ids(0, Id(6));
  WorkerOps ops;
  absl::Status st = state_.RouteCall(other_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("output id"), std::string::npos) << st;
  EXPECT_TRUE(ops.empty());
  // The refused call's outputs fail on its workers, but never A's buffer.
  state_.FailCallOutputs(other_, call, st, &ops);
  EXPECT_TRUE(ops.empty());
  call.add_output_ids(B(7));  // B's own output does fail
  state_.FailCallOutputs(other_, call, st, &ops);
  ASSERT_FALSE(ops.empty());
  for (const auto& [w, list] : ops) {
    ASSERT_EQ(list.size(), 1u);
    ASSERT_EQ(list[0].fail().buffer_ids_size(), 1);
    EXPECT_EQ(list[0].fail().buffer_ids(0), B(7));
  }
}

// A relayed call (Call.relay: a client's round trip) is relayed in every
// op that decides its outputs on a worker: its Execute, and the
// FailBuffers of a refusal; another call's ops say nothing of it. Its
// Execute says too whether only shard 0 is relayed (relay_first_shard),
// which means nothing without relay.
TEST_F(OwnershipTest, ARelayedCallsOpsSayRelay) {
  for (bool relay : {true, false}) {
    for (bool first_shard : {true, false}) {
      proto::Call call = BCall(B(5));
      const uint64_t n = 30 + 4 * relay + 2 * first_shard;
      call.set_call_id(B(n));
      call.set_output_ids(0, B(n + 1));
      call.set_relay(relay);
      call.set_relay_first_shard(first_shard);
      WorkerOps ops;
      ASSERT_TRUE(state_.RouteCall(other_, call, &ops).ok());
      int executes = 0;
      for (const auto& [w, list] : ops) {
        for (const proto::WorkerOp& op : list) {
          if (!op.has_execute()) continue;
          EXPECT_EQ(op.execute().relay(), relay);
          EXPECT_EQ(op.execute().relay_first_shard(), relay && first_shard);
          ++executes;
        }
      }
      EXPECT_GT(executes, 0);
    }
    proto::Call refused = BCall(B(5));
    refused.set_relay(relay);
    refused.set_call_id(B(20));
    refused.set_output_ids(0, B(21));
    refused.set_program_id(B(99));  // never registered
    WorkerOps ops;
    const absl::Status st = state_.RouteCall(other_, refused, &ops);
    ASSERT_FALSE(st.ok());
    state_.FailCallOutputs(other_, refused, st, &ops);
    ASSERT_FALSE(ops.empty());
    for (const auto& [w, list] : ops) {
      ASSERT_EQ(list.size(), 1u);
      EXPECT_EQ(list[0].fail().relay(), relay);
    }
  }
}

TEST_F(OwnershipTest, AFailedCallFailsNothingOnAnotherClientsSlice) {
  proto::Call call = BCall(B(5));
  call.set_slice_id(a_slice_.slice_id());
  WorkerOps ops;
  absl::Status st = state_.RouteCall(other_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  state_.FailCallOutputs(other_, call, st, &ops);
  EXPECT_TRUE(ops.empty());
}

// A call the server refused makes nothing: a call that reads its output
// is refused at once (DATA_LOSS, in the refusal's words), and never sent to
// the workers to wait for a value no call will make. Seen: a plexus.jit
// step issued just before a resize, its gradient refused as compiled for
// the old size, its all_reduce queued on the workers forever.
TEST_F(OwnershipTest, ACallReadingARefusedCallsOutputIsRefusedInTurn) {
  proto::Call refused = BCall(B(5));
  refused.set_program_id(B(99));  // never registered
  WorkerOps ops;
  const absl::Status st = state_.RouteCall(other_, refused, &ops);
  ASSERT_FALSE(st.ok());
  state_.FailCallOutputs(other_, refused, st, &ops);
  ops.clear();
  proto::Call next = BCall(B(3));  // the refused call's output
  next.set_call_id(B(8));
  next.set_output_ids(0, B(9));
  const absl::Status next_st = state_.RouteCall(other_, next, &ops);
  EXPECT_TRUE(absl::IsDataLoss(next_st)) << next_st;
  EXPECT_NE(next_st.message().find(st.message()), std::string::npos) << next_st;
  EXPECT_TRUE(ops.empty());
  // And so on down the chain; a release of the id forgets it.
  ASSERT_NE(state_.LostStatus(B(9)), nullptr);
  proto::ReleaseRef release;
  release.set_buffer_id(B(3));
  release.set_slice_id(b_slice_.slice_id());
  state_.RouteRelease(other_, release, &ops);
  EXPECT_EQ(state_.LostStatus(B(3)), nullptr);
}

TEST_F(OwnershipTest, ACallRunsOnlyItsClientsPrograms) {
  proto::Call call = BCall(B(5));
  call.set_program_id(Id(1));  // A's program
  WorkerOps ops;
  absl::Status st = state_.RouteCall(other_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_EQ(st.message(),
            absl::StrCat("program ", Id(1), " belongs to another client"));
  EXPECT_TRUE(ops.empty());
}

TEST_F(OwnershipTest, AProgramIdNamesItsClient) {
  proto::RegisterProgram reg;
  reg.set_program_id(Id(9));  // A's id space
  reg.mutable_program()->set_name("sneaky");
  reg.mutable_program()->set_kernel("scale");
  *reg.mutable_program()->add_inputs() = ToProto(arg_);
  *reg.mutable_program()->add_outputs() = ToProto(arg_);
  absl::Status st = state_.RegisterProgram(other_, reg);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("program 'sneaky'"), std::string::npos) << st;
}

TEST_F(OwnershipTest, APutWritesOnlyItsClientsBuffers) {
  proto::PutDecl put;
  put.set_slice_id(b_slice_.slice_id());
  *put.mutable_arg() = ToProto(arg_);
  put.set_buffer_id(B(8));
  WorkerOps ops;
  ASSERT_TRUE(state_.RoutePut(other_, put, &ops).ok());
  ops.clear();
  put.set_buffer_id(Id(8));
  absl::Status st = state_.RoutePut(other_, put, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_EQ(st.message(), absl::StrCat("put: buffer id ", Id(8),
                                       " belongs to another client"));
  EXPECT_TRUE(ops.empty());
}

TEST_F(OwnershipTest, ASliceServesOnlyItsClient) {
  proto::Call call = BCall(B(5));
  call.mutable_inputs(0)->set_slice_id(a_slice_.slice_id());
  WorkerOps ops;
  absl::Status st = state_.RouteCall(other_, call, &ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("is not held by this client"), std::string::npos)
      << st;
  EXPECT_TRUE(ops.empty());
  EXPECT_FALSE(state_.ReleaseSlice(other_, a_slice_.slice_id()).ok());
  EXPECT_EQ(state_.slices().count(a_slice_.slice_id()), 1u);
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

// A tenant's max_bytes bounds the bytes of its client's live buffers, as
// routed: puts and call outputs count (every shard), releases give back.
TEST_F(ClusterStateTest, MaxBytesBoundsAClientsLiveBuffers) {
  auto tenants =
      TenantTable::FromJson(R"({"tenants": {"small": {"max_bytes": 64}}})");
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  state_.SetTenants(*tenants);
  const uint64_t small = state_.AddClient("q", "small").id;
  proto::SliceRequest req;
  req.set_num_devices(2);
  auto slice = state_.CreateSlice(small, req);
  ASSERT_TRUE(slice.ok()) << slice.status();
  auto id = [&](uint64_t n) { return ClientMadeId(small, n); };
  // 4 floats replicated on 2 devices: 32 bytes held.
  const ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  proto::PutDecl put;
  put.set_slice_id(slice->slice_id());
  *put.mutable_arg() = ToProto(arg);
  put.set_buffer_id(id(1));
  WorkerOps ops;
  ASSERT_TRUE(state_.RoutePut(small, put, &ops).ok());
  EXPECT_EQ(state_.FindClient(small)->live_bytes, 32);

  proto::RegisterProgram reg;
  reg.set_program_id(id(2));
  reg.mutable_program()->set_name("scale");
  reg.mutable_program()->set_kernel("scale");
  *reg.mutable_program()->add_inputs() = ToProto(arg);
  *reg.mutable_program()->add_outputs() = ToProto(arg);
  ASSERT_TRUE(state_.RegisterProgram(small, reg).ok());
  auto call = [&](uint64_t out) {
    proto::Call c;
    c.set_call_id(out);
    c.set_slice_id(slice->slice_id());
    c.set_program_id(id(2));
    auto* in = c.add_inputs();
    in->set_buffer_id(id(1));
    in->set_slice_id(slice->slice_id());
    *in->mutable_arg() = ToProto(arg);
    c.add_output_ids(out);
    return c;
  };
  ASSERT_TRUE(state_.RouteCall(small, call(id(3)), &ops).ok());
  EXPECT_EQ(state_.FindClient(small)->live_bytes, 64);
  ops.clear();
  absl::Status over = state_.RouteCall(small, call(id(4)), &ops);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("over its quota of 64 (max_bytes)"),
            std::string::npos)
      << over;
  EXPECT_NE(over.message().find("program 'scale'"), std::string::npos) << over;
  EXPECT_TRUE(ops.empty());
  // Another tenant's client is not bound by it.
  EXPECT_EQ(state_.FindClient(client_)->live_bytes, 0);

  proto::ReleaseRef release;
  release.set_slice_id(slice->slice_id());
  release.set_buffer_id(id(3));
  state_.RouteRelease(small, release, &ops);
  EXPECT_EQ(state_.FindClient(small)->live_bytes, 32);
  ops.clear();
  EXPECT_TRUE(state_.RouteCall(small, call(id(4)), &ops).ok());
}

// Every string a client sends is bounded as a name is (CheckName): a
// layout's mesh axis names (in a program's arguments, a put's, a call's
// inputs), an attribute's name and string value, an XLA program's
// platform. Each refusal names the field and its length.
TEST_F(ClusterStateTest, EveryStringAClientSendsIsBounded) {
  proto::SliceInfo s = Slice(4);
  TensorSpec t{DType::kF32, {4, 4}};
  const std::string huge(300, 'x');
  ArgSpec named{t, Sharding::Mesh({2, 2}, {huge, "y"}, {{0}, {1}})};
  auto refused = [](const absl::Status& st, const std::string& want) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
    EXPECT_LT(st.message().size(), 400u) << st;
  };
  const std::string axis =
      "a mesh axis name is at most 256 bytes; this one "
      "is 300";
  proto::PutDecl put;
  put.set_buffer_id(Id(3));
  put.set_slice_id(s.slice_id());
  *put.mutable_arg() = ToProto(named);
  WorkerOps ops;
  refused(state_.RoutePut(client_, put, &ops), axis);
  auto program = [&](const std::string& kernel) {
    proto::RegisterProgram reg;
    reg.set_program_id(Id(1));
    reg.mutable_program()->set_name("p");
    reg.mutable_program()->set_kernel(kernel);
    *reg.mutable_program()->add_inputs() = ToProto(ArgSpec{t, {}});
    *reg.mutable_program()->add_outputs() = ToProto(ArgSpec{t, {}});
    return reg;
  };
  proto::RegisterProgram reg = program("scale");
  *reg.mutable_program()->mutable_inputs(0) = ToProto(named);
  refused(state_.RegisterProgram(client_, reg),
          "program 'p' argument 0: " + axis);
  reg = program("scale");
  (*reg.mutable_program()->mutable_attrs())[huge].set_f(1.0);
  refused(state_.RegisterProgram(client_, reg),
          "program 'p': a program attribute name is at most 256 bytes; this "
          "one is 300");
  reg = program("scale");
  (*reg.mutable_program()->mutable_attrs())["factor"].set_s(huge);
  refused(state_.RegisterProgram(client_, reg),
          "program 'p': a string value (of attribute 'factor') is at most 256 "
          "bytes; this one is 300");
  reg = program("xla");
  reg.mutable_program()->mutable_xla()->set_module("m");
  reg.mutable_program()->mutable_xla()->add_islands()->add_devices(0);
  reg.mutable_program()->mutable_xla()->set_platform(huge);
  refused(state_.RegisterProgram(client_, reg),
          "program 'p': a platform name (of an XLA program) is at most 256 "
          "bytes; this one is 300");
  // A call's input layout as sent, when it is not the program's.
  Register(Id(1), "scale", ArgSpec{t, Sharding::Split(1)},
           ArgSpec{t, Sharding::Split(1)});
  proto::Call call;
  call.set_call_id(Id(2));
  call.set_slice_id(s.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(named);
  call.add_output_ids(Id(4));
  refused(state_.RouteCall(client_, call, &ops), axis);
}

// A value laid out P('x', 'y') over a 2x2 mesh (device k holds rows
// [2 * (k / 2), +2), columns [2 * (k % 2), +2) of a [4, 4] array) read by a
// program compiled for split(1) (device j takes column j): each input is
// two boxes of one column, from the two blocks that hold it.
TEST_F(ClusterStateTest, AnotherLayoutIsAssembledFromBoxesOfTheBlocks) {
  proto::SliceInfo s = Slice(4);
  TensorSpec t{DType::kF32, {4, 4}};
  ArgSpec mesh{t, Sharding::Mesh({2, 2}, {"x", "y"}, {{0}, {1}})};
  ArgSpec columns{t, Sharding::Split(1)};
  Register(Id(1), "scale", columns, columns);
  proto::Call call;
  call.set_call_id(Id(2));
  call.set_slice_id(s.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(mesh);
  call.add_output_ids(Id(4));
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, call, &ops).ok());
  std::map<int, const proto::ShardTask*> tasks;
  for (const auto& [worker, list] : ops) {
    for (const auto& op : list) {
      if (!op.has_execute()) continue;
      for (const auto& task : op.execute().tasks()) tasks[task.shard()] = &task;
    }
  }
  ASSERT_EQ(tasks.size(), 4u);
  for (int j = 0; j < 4; ++j) {
    const proto::InputBinding& b = tasks[j]->inputs(0);
    EXPECT_EQ(FromProto(b.local())->shape, (Shape{4, 1}));
    ASSERT_EQ(b.pieces_size(), 2) << j;
    for (int r = 0; r < 2; ++r) {  // rows [0, 2) then [2, 4)
      const proto::Piece& p = b.pieces(r);
      const int k = r * 2 + j / 2;  // the block holding them
      if (p.buffer_id() == Id(3)) EXPECT_EQ(p.shard(), k);
      EXPECT_EQ(Shape(p.src_shape().begin(), p.src_shape().end()),
                (Shape{2, 2}));
      EXPECT_EQ(Shape(p.src_start().begin(), p.src_start().end()),
                (Shape{0, j % 2}));
      EXPECT_EQ(Shape(p.dst_start().begin(), p.dst_start().end()),
                (Shape{2 * r, 0}));
      EXPECT_EQ(Shape(p.extent().begin(), p.extent().end()), (Shape{2, 1}));
    }
  }
}

TEST_F(ClusterStateTest, APartialValueIsNotRelaidOut) {
  proto::SliceInfo s = Slice(2);
  TensorSpec t{DType::kF32, {4}};
  Register(Id(1), "scale", {t, Sharding::Split(0)}, {t, Sharding::Split(0)});
  proto::Call call;
  call.set_slice_id(s.slice_id());
  call.set_program_id(Id(1));
  auto* in = call.add_inputs();
  in->set_buffer_id(Id(3));
  in->set_slice_id(s.slice_id());
  *in->mutable_arg() = ToProto(ArgSpec{t, Sharding::Partial()});
  call.add_output_ids(Id(4));
  WorkerOps ops;
  EXPECT_EQ(state_.RouteCall(client_, call, &ops).message(),
            "program 'scale' argument 0 is float32[4] partial but the "
            "program was compiled for float32[4] split(0)");
}

// Donation: the server lets a call's program write over a donated input's
// memory only where nothing else reads the buffer.
class DonationTest : public ClusterStateTest {
 protected:
  void SetUp() override {
    ClusterStateTest::SetUp();
    slice_ = Slice(2);
    ASSERT_TRUE(state_
                    .RegisterProgram(
                        client_, Donating(Id(1), "update", {arg_, arg_}, arg_))
                    .ok());
  }
  // An XLA program `name` of `inputs` and one output, input 0 donated to it.
  static proto::RegisterProgram Donating(uint64_t pid, const std::string& name,
                                         const std::vector<ArgSpec>& inputs,
                                         const ArgSpec& output) {
    proto::RegisterProgram reg;
    reg.set_program_id(pid);
    proto::ProgramDef* def = reg.mutable_program();
    def->set_name(name);
    def->set_kernel("xla");
    def->mutable_xla()->set_module("m");
    def->mutable_xla()->add_islands();
    for (const ArgSpec& in : inputs) *def->add_inputs() = ToProto(in);
    *def->add_outputs() = ToProto(output);
    def->mutable_xla()->add_donated_inputs(0);
    def->mutable_xla()->add_donated_outputs(0);
    return reg;
  }
  void Put(uint64_t id) {
    proto::PutDecl put;
    put.set_buffer_id(id);
    put.set_slice_id(slice_.slice_id());
    *put.mutable_arg() = ToProto(arg_);
    WorkerOps ops;
    ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());
  }
  // Routes update(a, b) -> out; whether each input's bindings say donate
  // (one answer per input: all shards agree).
  std::vector<bool> Route(uint64_t a, uint64_t b, uint64_t out,
                          uint64_t* seq = nullptr) {
    proto::Call call;
    call.set_call_id(out + 1000);
    call.set_slice_id(slice_.slice_id());
    call.set_program_id(Id(1));
    for (uint64_t id : {a, b}) {
      auto* in = call.add_inputs();
      in->set_buffer_id(id);
      in->set_slice_id(slice_.slice_id());
      *in->mutable_arg() = ToProto(arg_);
    }
    call.add_output_ids(out);
    WorkerOps ops;
    EXPECT_TRUE(state_.RouteCall(client_, call, &ops, seq).ok());
    std::vector<bool> donate(2, false);
    std::vector<int> seen(2, 0);
    for (const auto& [w, list] : ops) {
      for (const auto& op : list) {
        if (!op.has_execute()) continue;
        for (const auto& task : op.execute().tasks()) {
          for (int i = 0; i < 2; ++i) {
            if (seen[i]++ == 0) donate[i] = task.inputs(i).donate();
            EXPECT_EQ(task.inputs(i).donate(), donate[i]) << "input " << i;
          }
        }
      }
    }
    return donate;
  }
  const ArgSpec arg_{{DType::kF32, {8}}, Sharding::Split(0)};
  proto::SliceInfo slice_;
};

TEST_F(DonationTest, ASoleReaderMayWriteOverTheDonatedInputOnly) {
  Put(Id(10));
  Put(Id(11));
  EXPECT_EQ(Route(Id(10), Id(11), Id(12)), (std::vector<bool>{true, false}));
}

TEST_F(DonationTest, NotWhileAnotherCallReadsIt) {
  Put(Id(10));
  Put(Id(11));
  uint64_t first = 0;
  EXPECT_EQ(Route(Id(11), Id(10), Id(12), &first),
            (std::vector<bool>{true, false}));  // reads 10, not donated
  EXPECT_EQ(Route(Id(10), Id(11), Id(13)), (std::vector<bool>{false, false}));
  // Once the first call is done and let go of it, it may be given.
  WorkerOps ops;
  state_.CallDone(first, /*failed=*/false, &ops);
  EXPECT_EQ(Route(Id(10), Id(12), Id(14)), (std::vector<bool>{false, false}))
      << "the second call still holds it";
}

TEST_F(DonationTest, NotWhenTheCallNamesItTwiceOrItIsUnknown) {
  Put(Id(10));
  EXPECT_EQ(Route(Id(10), Id(10), Id(12)), (std::vector<bool>{false, false}));
  EXPECT_EQ(Route(Id(99), Id(10), Id(13)), (std::vector<bool>{false, false}));
}

TEST_F(DonationTest, NotWhereLineageMayNeedIt) {
  // A spare registered: calls hold their inputs to recompute their
  // outputs if a host is lost, so no input is written over.
  state_.AddWorker(Host("spare", 2, /*spare=*/true), absl::Now());
  Put(Id(10));
  Put(Id(11));
  EXPECT_EQ(Route(Id(10), Id(11), Id(12)), (std::vector<bool>{false, false}));
}

TEST_F(DonationTest, BadPairsAreRefusedAtRegistration) {
  absl::Status s = state_.RegisterProgram(
      client_, Donating(Id(2), "bad", {arg_}, ArgSpec{{DType::kF32, {8}}, {}}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("program 'bad': donation: input 0 is"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

// A call over 20 hosts of 2 devices each, the slice spread over them (a
// host's two shards apart in slice order): each host's Execute, encoded
// once for the call, holds its own shards' tasks in slice order, and the
// proto form of RouteCall reads the same.
TEST(WideCallTest, EachHostGetsItsShardsOnceInSliceOrder) {
  ClusterState state;
  for (int h = 0; h < 20; ++h) {
    state.AddWorker(Host(absl::StrCat("host", h), 2), absl::Now());
  }
  const uint64_t client = state.AddClient("test").id;
  proto::SliceRequest req;
  req.set_num_devices(40);
  req.set_placement(proto::PLACEMENT_SPREAD);
  auto slice = state.CreateSlice(client, req);
  ASSERT_TRUE(slice.ok()) << slice.status();
  const ArgSpec arg{{DType::kF32, {80}}, Sharding::Split(0)};
  proto::RegisterProgram reg;
  reg.set_program_id(ClientMadeId(client, 1));
  reg.mutable_program()->set_name("scale");
  reg.mutable_program()->set_kernel("scale");
  *reg.mutable_program()->add_inputs() = ToProto(arg);
  *reg.mutable_program()->add_outputs() = ToProto(arg);
  ASSERT_TRUE(state.RegisterProgram(client, reg).ok());
  auto call = [&](uint64_t n) {
    proto::Call c;
    c.set_call_id(ClientMadeId(client, n));
    c.set_slice_id(slice->slice_id());
    c.set_program_id(ClientMadeId(client, 1));
    proto::InputRef* in = c.add_inputs();
    in->set_buffer_id(ClientMadeId(client, n + 1));
    in->set_slice_id(slice->slice_id());
    *in->mutable_arg() = ToProto(arg);
    c.add_output_ids(ClientMadeId(client, n + 2));
    return c;
  };

  WorkerOps ops;
  std::shared_ptr<CallExecutes> executes;
  ASSERT_TRUE(state.RouteCall(client, call(10), &ops, nullptr, &executes).ok());
  ASSERT_EQ(executes->hosts(), 20);
  std::map<int64_t, std::vector<int>> shards_of;  // by the slice's map
  for (int j = 0; j < slice->devices_size(); ++j) {
    shards_of[slice->devices(j).worker_id()].push_back(j);
  }
  for (int h = 0; h < executes->hosts(); ++h) {
    const proto::Execute exec = executes->Execute(h);
    const std::vector<int>& shards = shards_of[executes->worker(h)];
    ASSERT_EQ(exec.tasks_size(), static_cast<int>(shards.size()));
    EXPECT_EQ(exec.num_shards(), 40);
    EXPECT_EQ(exec.output_ids(0), ClientMadeId(client, 12));
    for (int t = 0; t < exec.tasks_size(); ++t) {
      const int j = shards[t];
      EXPECT_EQ(exec.tasks(t).shard(), j);
      EXPECT_EQ(exec.tasks(t).device(), slice->devices(j).device());
      const proto::Piece& piece = exec.tasks(t).inputs(0).pieces(0);
      EXPECT_EQ(piece.buffer_id(), ClientMadeId(client, 11));
      EXPECT_EQ(piece.shard(), j);
      EXPECT_EQ(piece.length(), 2);
    }
  }
  // Each host's program load went first, as a proto op.
  EXPECT_EQ(ops.size(), 20u);

  WorkerOps proto_ops;
  ASSERT_TRUE(state.RouteCall(client, call(20), &proto_ops).ok());
  for (auto& [w, list] : proto_ops) {
    ASSERT_EQ(list.size(), 1u);  // loaded already: the Execute alone
    EXPECT_EQ(list[0].execute().tasks_size(),
              static_cast<int>(shards_of[w].size()));
  }
}

}  // namespace
}  // namespace plexus
