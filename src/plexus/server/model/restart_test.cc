// A restarted server's rebuild (ClusterState: restart.cc), driven directly:
// what the journal keeps, how it is restored, and how the workers and
// clients that come back are taken in.
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/cluster_state_test_util.h"

namespace plexus {
namespace {

// Keeps what the model journals, in order.
class RecordingSink : public ModelJournalSink {
 public:
  void Record(const proto::ModelRecord& change) override {
    records.push_back(change);
  }
  std::vector<proto::ModelRecord> records;
};

const ArgSpec kArg{{DType::kF32, {4}}, Sharding::Replicated()};

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    before_.set_journal(&sink_);
    w0_ = before_.AddWorker(Host("host0", 1), absl::Now(), 100).id;
    w1_ = before_.AddWorker(Host("host1", 1), absl::Now(), 101).id;
    client_ = before_.AddClient("job", "default").id;
    proto::SliceRequest req;
    req.set_num_devices(2);
    req.set_placement(proto::PLACEMENT_SPREAD);
    auto s = before_.CreateSlice(client_, req);
    ASSERT_TRUE(s.ok()) << s.status();
    slice_ = s->slice_id();
    proto::RegisterProgram reg;
    reg.set_program_id(Id(1));
    reg.mutable_program()->set_name("scale");
    reg.mutable_program()->set_kernel("scale");
    *reg.mutable_program()->add_inputs() = ToProto(kArg);
    *reg.mutable_program()->add_outputs() = ToProto(kArg);
    ASSERT_TRUE(before_.RegisterProgram(client_, reg).ok());
  }
  uint64_t Id(uint64_t n) const { return ClientMadeId(client_, n); }
  // The call of program 1 on the slice from `in` to `out`.
  proto::Call Call(uint64_t call_id, uint64_t in, uint64_t out) const {
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(slice_);
    call.set_program_id(Id(1));
    proto::InputRef* ref = call.add_inputs();
    ref->set_buffer_id(in);
    ref->set_slice_id(slice_);
    // A client names the layout only when it is not the program's
    // (protocol version 2); an older one named it always.
    if (name_layouts_) *ref->mutable_arg() = ToProto(kArg);
    call.add_output_ids(out);
    return call;
  }
  // `after_` rebuilt from what `before_` journaled.
  void Restart() {
    for (const proto::ModelRecord& r : sink_.records) {
      ASSERT_TRUE(after_.Restore(r).ok()) << r.DebugString();
    }
    after_.FinishRestore();
  }
  // Worker `id` of host `host` comes back holding `held` (buffer, shard).
  WorkerRecord* Return(int64_t id, const std::string& host, uint64_t gen,
                       std::vector<std::pair<uint64_t, int>> held) {
    proto::RegisterWorker info = Host(host, 1);
    info.set_previous_worker_id(id);
    info.set_previous_generation(gen);
    info.set_kept_state(true);
    for (const auto& [b, shard] : held) {
      proto::HeldShard* h = info.add_inventory();
      h->set_buffer_id(b);
      h->set_shard(shard);
    }
    return after_.ResumeWorker(info, gen + 10, absl::Now());
  }
  proto::LiveBuffers Live(std::vector<uint64_t> ids, bool done) const {
    proto::LiveBuffers live;
    for (uint64_t id : ids) {
      proto::LiveBuffer* b = live.add_buffers();
      b->set_buffer_id(id);
      b->set_slice_id(slice_);
      *b->mutable_arg() = ToProto(kArg);
    }
    live.set_done(done);
    return live;
  }

  // x -> a -> z: the client holds x and z; a was released by the client
  // but both workers gave it back whole: only a -> z runs again (a is not
  // declared twice on a worker), and a goes at the end.
  void ExpectAValueReleasedButGivenBackIsRead() {
    Restart();
    const uint64_t x = Id(10), a = Id(11), z = Id(13);
    ASSERT_NE(Return(w0_, "host0", 100, {{x, 0}, {a, 0}}), nullptr);
    ASSERT_NE(Return(w1_, "host1", 101, {{x, 1}, {a, 1}}), nullptr);
    ASSERT_TRUE(after_.ResumeClient(client_).ok());
    WorkerOps ops;
    after_.RestoreLiveBuffers(client_, Live({x, z}, false), &ops);
    google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
    *resent.Add()->mutable_call() = Call(Id(20), x, a);
    *resent.Add()->mutable_call() = Call(Id(22), a, z);
    after_.PlanResent(client_, resent);
    std::vector<bool> routed_each;
    for (const proto::ClientOp& op : resent) {
      uint64_t seq = 0;
      bool routed = false;
      ASSERT_TRUE(
          after_.RouteResentCall(client_, op.call(), &ops, &seq, &routed).ok());
      routed_each.push_back(routed);
    }
    EXPECT_EQ(routed_each, (std::vector<bool>{false, true}));
    ops.clear();
    EXPECT_EQ(after_.RestoreLiveBuffers(client_, Live({}, true), &ops)
                  .lost_ids_size(),
              0);
    const BufferRecord* gone = after_.records().FindBuffer(a);
    EXPECT_TRUE(gone == nullptr || gone->released);
  }

  bool name_layouts_ = true;
  RecordingSink sink_;
  ClusterState before_;
  ClusterState after_;
  int64_t w0_ = 0, w1_ = 0;
  uint64_t client_ = 0;
  uint64_t slice_ = 0;
};

TEST_F(RestartTest, TheJournalRebuildsWorkersClientsSlicesAndPrograms) {
  // A second slice, released: gone after the restart too.
  proto::SliceRequest req;
  req.set_num_devices(1);
  auto gone = before_.CreateSlice(client_, req);
  ASSERT_TRUE(gone.ok());
  ASSERT_TRUE(before_.ReleaseSlice(client_, gone->slice_id()).ok());
  Restart();
  ASSERT_EQ(after_.workers().size(), 2u);
  for (const auto& [id, w] : after_.workers()) {
    EXPECT_TRUE(w.away) << id;
    EXPECT_FALSE(w.alive) << id;
  }
  EXPECT_EQ(after_.workers().at(w1_).generation, 101u);
  const ClientRecord* c = after_.FindClient(client_);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->away);
  EXPECT_EQ(c->name, "job");
  EXPECT_EQ(c->programs.count(Id(1)), 1u);
  ASSERT_EQ(after_.slices().size(), 1u);
  const SliceRecord& s = after_.slices().at(slice_);
  ASSERT_EQ(s.devices.size(), 2u);
  EXPECT_EQ(s.devices[0].worker_id,
            before_.slices().at(slice_).devices[0].worker_id);
  EXPECT_EQ(s.devices[1].worker_id,
            before_.slices().at(slice_).devices[1].worker_id);
  // New ids follow the restored ones: nothing is given twice.
  EXPECT_EQ(after_.AddClient("next").id, client_ + 1);
  EXPECT_EQ(after_.AddWorker(Host("host2", 1), absl::Now()).id, w1_ + 1);
}

TEST_F(RestartTest, ASuspendedSliceIsRestoredSuspendedAndResumesAfter) {
  ASSERT_TRUE(before_.SuspendSlice(client_, slice_).ok());
  Restart();
  EXPECT_TRUE(after_.slices().at(slice_).suspended);
  ASSERT_TRUE(Return(w0_, "host0", 100, {}) != nullptr);
  ASSERT_TRUE(Return(w1_, "host1", 101, {}) != nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  auto resumed = after_.ResumeSlice(client_, slice_);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(after_.slices().at(slice_).suspended);
}

TEST_F(RestartTest, ASlicePreemptedIsRestoredHeldAndResumesOnceItsHostsFree) {
  auto tenants = TenantTable::FromJson(
      R"({"tenants": {"prod": {"priority": 10}, "batch": {}}})");
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  before_.SetTenants(*tenants);
  after_.SetTenants(*tenants);
  const uint64_t low = before_.AddClient("batch-job", "batch").id;
  const uint64_t high = before_.AddClient("urgent", "prod").id;
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.set_placement(proto::PLACEMENT_SPREAD);
  req.set_on_preempt(proto::PREEMPT_SUSPEND);
  auto held = before_.CreateSlice(low, req);
  ASSERT_TRUE(held.ok()) << held.status();
  req.set_on_preempt(proto::PREEMPT_DEFAULT);
  auto urgent = before_.CreateSlice(high, req);
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  ASSERT_EQ(before_.YieldToPriorities().size(), 1u);
  const std::string why = before_.slices().at(held->slice_id()).preempted;
  ASSERT_FALSE(why.empty());
  Restart();
  const SliceRecord& restored = after_.slices().at(held->slice_id());
  EXPECT_TRUE(restored.suspended);
  EXPECT_EQ(restored.preempted, why);
  EXPECT_EQ(restored.on_preempt, proto::PREEMPT_SUSPEND);
  ASSERT_TRUE(Return(w0_, "host0", 100, {}) != nullptr);
  ASSERT_TRUE(Return(w1_, "host1", 101, {}) != nullptr);
  ASSERT_TRUE(after_.ResumeClient(low).ok());
  ASSERT_TRUE(after_.ResumeClient(high).ok());
  google::protobuf::RepeatedPtrField<proto::ClientOp> call;
  call.Add()->mutable_call()->set_slice_id(held->slice_id());
  EXPECT_TRUE(after_.HeldByPreemption(low, call).has_value());
  EXPECT_TRUE(after_.GrowSlices().empty()) << "its hosts are still held";
  ASSERT_TRUE(after_.ReleaseSlice(high, urgent->slice_id()).ok());
  auto back = after_.GrowSlices();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_FALSE(after_.slices().at(held->slice_id()).suspended);
  EXPECT_FALSE(after_.HeldByPreemption(low, call).has_value());
}

TEST_F(RestartTest, AWorkerComesBackOnlyAsTheHostItWas) {
  Restart();
  EXPECT_TRUE(after_.WaitsForWorkers(client_));
  EXPECT_EQ(Return(w0_, "host0", 99, {}), nullptr);       // another generation
  EXPECT_EQ(Return(w0_, "elsewhere", 100, {}), nullptr);  // another host
  WorkerRecord* w = Return(w0_, "host0", 100, {});
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->alive);
  EXPECT_EQ(w->id, w0_);
  EXPECT_EQ(w->generation, 110u);
  EXPECT_EQ(Return(w0_, "host0", 100, {}), nullptr);  // not twice
  EXPECT_TRUE(after_.WaitsForWorkers(client_));       // host1 is away
  ASSERT_NE(Return(w1_, "host1", 101, {}), nullptr);
  EXPECT_FALSE(after_.WaitsForWorkers(client_));
  EXPECT_TRUE(after_.AwayWorkers().empty());
}

TEST_F(RestartTest, AResumedClientKeepsWhatIsHeldAndRunsAgainWhatIsMissing) {
  // x (put) -> y -> z; the workers came back with x and y whole, z on one
  // worker only (its call had not run everywhere), and a buffer the client
  // no longer holds.
  Restart();
  const uint64_t x = Id(10), y = Id(11), z = Id(12), stale = Id(13);
  ASSERT_NE(Return(w0_, "host0", 100, {{x, 0}, {y, 0}, {z, 0}, {stale, 0}}),
            nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {{x, 1}, {y, 1}}), nullptr);
  EXPECT_TRUE(after_.ResumeClient(client_).ok());
  EXPECT_EQ(after_.ResumeClient(client_).code(),
            absl::StatusCode::kFailedPrecondition);
  WorkerOps ops;
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({x, y, z}, /*done=*/false), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  EXPECT_NE(after_.records().FindBuffer(x), nullptr);
  EXPECT_NE(after_.records().FindBuffer(y), nullptr);
  EXPECT_EQ(after_.records().FindBuffer(z), nullptr);
  // z's one shard stays listed until the batch sent again says what
  // makes z.
  EXPECT_TRUE(ops.empty());
  // The batch sent again: x -> y is held, not run; y -> z runs again.
  google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
  *resent.Add()->mutable_call() = Call(Id(20), x, y);
  *resent.Add()->mutable_call() = Call(Id(21), y, z);
  after_.PlanResent(client_, resent);
  uint64_t seq = 0;
  bool routed = true;
  ASSERT_TRUE(
      after_.RouteResentCall(client_, Call(Id(20), x, y), &ops, &seq, &routed)
          .ok());
  EXPECT_FALSE(routed);
  EXPECT_TRUE(ops.empty());
  ASSERT_TRUE(
      after_.RouteResentCall(client_, Call(Id(21), y, z), &ops, &seq, &routed)
          .ok());
  EXPECT_TRUE(routed);
  EXPECT_GT(seq, 0u);
  EXPECT_EQ(after_.FindClient(client_)->resume_kept, 2);
  EXPECT_EQ(after_.FindClient(client_)->resume_ran_again, 1);
  for (int64_t w : {w0_, w1_}) {
    bool executes = false;
    for (const proto::WorkerOp& op : ops[w]) executes |= op.has_execute();
    EXPECT_TRUE(executes) << "worker " << w;
  }
  // z's one shard goes on its worker's stream just before z is made again.
  ASSERT_FALSE(ops[w0_].empty());
  ASSERT_TRUE(ops[w0_][0].has_release());
  EXPECT_EQ(ops[w0_][0].release().buffer_ids(0), z);
  ops.clear();
  note = after_.RestoreLiveBuffers(client_, Live({}, /*done=*/true), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  // The buffer no client holds is released where it was given back.
  ASSERT_EQ(ops[w0_].size(), 1u);
  ASSERT_TRUE(ops[w0_][0].has_release());
  EXPECT_EQ(ops[w0_][0].release().buffer_ids(0), stale);
  EXPECT_TRUE(ops[w1_].empty());
}

TEST_F(RestartTest, APutSentAgainKeepsTheShardsGivenBackAndPutsTheRest) {
  // A put cut short by the server's death: worker 0 had its shard, worker
  // 1 not. Released and declared anew, the kept shard was answered
  // "already there" to the client's put when that came first, then
  // dropped by the release, and the new declaration waited for good.
  Restart();
  const uint64_t x = Id(10);
  ASSERT_NE(Return(w0_, "host0", 100, {{x, 0}}), nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {}), nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  WorkerOps ops;
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({x}, /*done=*/false), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  EXPECT_TRUE(ops.empty()) << "nothing released before the put comes";
  google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
  proto::PutDecl& put = *resent.Add()->mutable_put();
  put.set_buffer_id(x);
  put.set_slice_id(slice_);
  *put.mutable_arg() = ToProto(kArg);
  after_.PlanResent(client_, resent);
  proto::Recovery reput;
  ASSERT_TRUE(after_.RouteResentPut(client_, put, &ops, &reput).ok());
  // Only shard 1 is declared (on worker 1) and asked of the client.
  EXPECT_TRUE(ops[w0_].empty());
  ASSERT_EQ(ops[w1_].size(), 1u);
  EXPECT_EQ(ops[w1_][0].declare().shard(), 1);
  ASSERT_EQ(reput.reput_ids_size(), 1);
  EXPECT_EQ(reput.reput_ids(0), x);
  EXPECT_EQ(reput.reput_shards(0), 1);
  ops.clear();
  note = after_.RestoreLiveBuffers(client_, Live({}, /*done=*/true), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  EXPECT_NE(after_.records().FindBuffer(x), nullptr);
  EXPECT_TRUE(ops[w0_].empty()) << "the kept shard stays";
}

TEST_F(RestartTest, AValueRoutedAnewBeforeTheLiveListIsNotLost) {
  // A put the client queued as its session came back reached the new
  // server before the session's LiveBuffers, which list it (its future
  // exists) though no worker gave it back and no op sent again makes it.
  // It was declared lost at the resume's end while its put made it.
  Restart();
  const uint64_t x = Id(30);
  ASSERT_NE(Return(w0_, "host0", 100, {}), nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {}), nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  proto::PutDecl put;
  put.set_buffer_id(x);
  put.set_slice_id(slice_);
  *put.mutable_arg() = ToProto(kArg);
  WorkerOps ops;
  ASSERT_TRUE(after_.RoutePut(client_, put, &ops).ok());
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({x}, /*done=*/false), &ops);
  note = after_.RestoreLiveBuffers(client_, Live({}, /*done=*/true), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  EXPECT_NE(after_.records().FindBuffer(x), nullptr);
}

TEST_F(RestartTest, WhatNoWorkerGaveBackAndNoCallMakesIsLostSayingWhy) {
  Restart();
  const uint64_t y = Id(11), z = Id(12), w = Id(14);
  ASSERT_NE(Return(w0_, "host0", 100, {}), nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {}), nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  WorkerOps ops;
  after_.RestoreLiveBuffers(client_, Live({z, w}, false), &ops);
  // z's call is sent again, but its input y is held nowhere.
  google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
  *resent.Add()->mutable_call() = Call(Id(21), y, z);
  after_.PlanResent(client_, resent);
  uint64_t seq = 0;
  bool routed = true;
  absl::Status s =
      after_.RouteResentCall(client_, Call(Id(21), y, z), &ops, &seq, &routed);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(absl::StrCat("input buffer ", y)),
            std::string::npos)
      << s;
  EXPECT_FALSE(routed);
  ASSERT_NE(after_.LostStatus(z), nullptr);
  // w: no call sent again makes it.
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({}, true), &ops);
  ASSERT_EQ(note.lost_ids_size(), 1);
  EXPECT_EQ(note.lost_ids(0), w);
  EXPECT_EQ(note.status().code(),
            static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_NE(after_.LostStatus(w), nullptr);
}

TEST_F(RestartTest, AChainWhoseValuesWereReleasedRunsAgainFromTheLastHeld) {
  // x -> a -> b -> z, the client holding x and z only (it released a and
  // b); the workers gave back x alone: a and b run again to make z, and go
  // once the chain is routed.
  Restart();
  const uint64_t x = Id(10), a = Id(11), b = Id(12), z = Id(13);
  ASSERT_NE(Return(w0_, "host0", 100, {{x, 0}}), nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {{x, 1}}), nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  WorkerOps ops;
  after_.RestoreLiveBuffers(client_, Live({x, z}, false), &ops);
  google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
  *resent.Add()->mutable_call() = Call(Id(20), x, a);
  *resent.Add()->mutable_call() = Call(Id(21), a, b);
  *resent.Add()->mutable_call() = Call(Id(22), b, z);
  after_.PlanResent(client_, resent);
  for (const proto::ClientOp& op : resent) {
    uint64_t seq = 0;
    bool routed = false;
    ASSERT_TRUE(
        after_.RouteResentCall(client_, op.call(), &ops, &seq, &routed).ok());
    EXPECT_TRUE(routed) << op.call().call_id();
  }
  ops.clear();
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({}, true), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  EXPECT_EQ(after_.FindClient(client_)->resume_ran_again, 3);
  // a and b are released (held back until the calls that read them are
  // done); z stays.
  EXPECT_NE(after_.records().FindBuffer(z), nullptr);
  EXPECT_TRUE(after_.records().FindBuffer(a) == nullptr ||
              after_.records().FindBuffer(a)->released);
  EXPECT_TRUE(after_.records().FindBuffer(b) == nullptr ||
              after_.records().FindBuffer(b)->released);
}

TEST_F(RestartTest, AValueReleasedButGivenBackIsReadNotMadeAgain) {
  ExpectAValueReleasedButGivenBackIsRead();
}

// The same with calls that name no layout for their inputs (the program's):
// the value given back is read with the program's layout. It was made
// again when the walk back parsed only the call's own layout.
TEST_F(RestartTest, AValueGivenBackIsReadWhenTheCallsNameNoLayout) {
  name_layouts_ = false;
  ExpectAValueReleasedButGivenBackIsRead();
}

TEST_F(RestartTest, TransferTemporariesStartPastEveryOneTheLastRunUsed) {
  // A push still on its way from the last run must never land in a
  // temporary the restarted server declares: its count goes on past the
  // block the journal reserved.
  before_.set_next_transfer(5000);
  before_.AddWorker(Host("host2", 1), absl::Now(), 103);
  proto::SliceRequest one;
  one.set_num_devices(1);
  one.set_placement(proto::PLACEMENT_ONE_HOST);
  one.add_hosts("host2");  // x is on host0 and host1: it moves
  auto a = before_.CreateSlice(client_, one);
  ASSERT_TRUE(a.ok()) << a.status();
  proto::Call call = Call(Id(20), Id(10), Id(11));  // x on slice_ (2 hosts)
  call.set_slice_id(a->slice_id());
  WorkerOps ops;
  ASSERT_TRUE(before_
                  .RoutePut(
                      client_,
                      [&] {
                        proto::PutDecl put;
                        put.set_buffer_id(Id(10));
                        put.set_slice_id(slice_);
                        *put.mutable_arg() = ToProto(kArg);
                        return put;
                      }(),
                      &ops)
                  .ok());
  ASSERT_TRUE(before_.RouteCall(client_, call, &ops).ok());
  Restart();
  // The first temporary after the restart is past the reserved block.
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  ops.clear();
  WorkerOps dummy;
  after_.RestoreLiveBuffers(client_, Live({}, true), &dummy);
  after_.set_journal(&sink_);
  ASSERT_TRUE(after_
                  .RoutePut(
                      client_,
                      [&] {
                        proto::PutDecl put;
                        put.set_buffer_id(Id(30));
                        put.set_slice_id(slice_);
                        *put.mutable_arg() = ToProto(kArg);
                        return put;
                      }(),
                      &ops)
                  .ok());
  call = Call(Id(31), Id(30), Id(32));
  call.set_slice_id(a->slice_id());
  ASSERT_TRUE(after_.RouteCall(client_, call, &ops).ok());
  uint64_t first_temp = 0;
  for (const auto& [w, list] : ops) {
    for (const proto::WorkerOp& op : list) {
      if (op.has_transfer()) first_temp = op.transfer().dst_buffer_id();
    }
  }
  ASSERT_NE(first_temp, 0u);
  EXPECT_GE(first_temp, ClientMadeId(kServerClientId, 5000 + (1 << 20)));
  // The workers are told where this server's temporaries begin: the first
  // run's (5000) is earlier, this run's first is not.
  const uint64_t floor = after_.temporary_floor();
  EXPECT_EQ(first_temp, ClientMadeId(kServerClientId, floor));
  EXPECT_TRUE(IsEarlierTemporary(5000, floor));
}

TEST_F(RestartTest, ASliceSuspendedToFilesIsRestoredParkedAndReadsBack) {
  // Parked values live in files, not on workers: the journal names them,
  // a restarted server reads them as parked (not lost with the session),
  // and the resume reads them back.
  before_.set_park_dir("/park");
  proto::PutDecl put;
  put.set_buffer_id(Id(10));
  put.set_slice_id(slice_);
  *put.mutable_arg() = ToProto(kArg);
  WorkerOps ops;
  ASSERT_TRUE(before_.RoutePut(client_, put, &ops).ok());
  auto parked = before_.SuspendSlice(client_, slice_, /*to_files=*/true);
  ASSERT_TRUE(parked.ok()) << parked.status();
  ASSERT_EQ(parked->wait_ids.size(), 1u);
  for (const auto& [seq, unit] : parked->work) {
    if (seq != 0) before_.CallDone(seq, false, &ops);
  }
  Restart();
  after_.set_park_dir("/park");
  const SliceRecord& restored = after_.slices().at(slice_);
  EXPECT_TRUE(restored.suspended && restored.on_files);
  ASSERT_EQ(restored.parked.size(), 1u);
  EXPECT_EQ(restored.parked[0].id, Id(10));
  ASSERT_NE(after_.LostStatus(Id(10)), nullptr);
  EXPECT_NE(after_.LostStatus(Id(10))->message().find("parked in files"),
            std::string::npos);
  // The workers come back holding nothing of it; the client's live
  // futures name it: it stays parked, not lost.
  ASSERT_NE(Return(w0_, "host0", 100, {}), nullptr);
  ASSERT_NE(Return(w1_, "host1", 101, {}), nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  ops.clear();
  proto::Recovery note =
      after_.RestoreLiveBuffers(client_, Live({Id(10)}, true), &ops);
  EXPECT_EQ(note.lost_ids_size(), 0);
  auto resumed = after_.ResumeSlice(client_, slice_);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->note.old_ids_size(), 1);
  EXPECT_EQ(resumed->note.old_ids(0), Id(10));
  EXPECT_EQ(after_.LostStatus(Id(10)), nullptr);
}

TEST_F(RestartTest, ACollectiveRoutedAgainExchangesUnderANewTemporary) {
  // An all_reduce in flight as the server died, sent again by the client
  // under its call id: its partials travel under another key than the
  // first run's, which the workers refuse as an earlier server's.
  proto::RegisterProgram reg;
  reg.set_program_id(Id(2));
  reg.mutable_program()->set_name("all_reduce");
  reg.mutable_program()->set_kernel("all_reduce");
  *reg.mutable_program()->add_inputs() = ToProto(kArg);
  *reg.mutable_program()->add_outputs() = ToProto(kArg);
  ASSERT_TRUE(before_.RegisterProgram(client_, reg).ok());
  auto exchange_of = [](const WorkerOps& ops) {
    std::set<uint64_t> ids;
    for (const auto& [w, list] : ops) {
      for (const proto::WorkerOp& op : list) {
        if (op.has_execute()) ids.insert(op.execute().exchange_id());
      }
    }
    return ids;
  };
  proto::Call call = Call(Id(20), Id(10), Id(11));
  call.set_program_id(Id(2));
  proto::PutDecl put;
  put.set_buffer_id(Id(10));
  put.set_slice_id(slice_);
  *put.mutable_arg() = ToProto(kArg);
  WorkerOps ops;
  ASSERT_TRUE(before_.RoutePut(client_, put, &ops).ok());
  ASSERT_TRUE(before_.RouteCall(client_, call, &ops).ok());
  const std::set<uint64_t> first = exchange_of(ops);
  ASSERT_EQ(first.size(), 1u);  // one key, on both hosts
  const uint64_t first_id = *first.begin();
  EXPECT_EQ(ClientOfBuffer(first_id), kServerClientId);

  Restart();
  ASSERT_TRUE(Return(w0_, "host0", 100, {{Id(10), 0}}) != nullptr);
  ASSERT_TRUE(Return(w1_, "host1", 101, {{Id(10), 1}}) != nullptr);
  ASSERT_TRUE(after_.ResumeClient(client_).ok());
  ops.clear();
  after_.RestoreLiveBuffers(client_, Live({Id(10), Id(11)}, false), &ops);
  google::protobuf::RepeatedPtrField<proto::ClientOp> resent;
  *resent.Add()->mutable_call() = call;
  after_.PlanResent(client_, resent);
  uint64_t seq = 0;
  bool routed = false;
  ASSERT_TRUE(after_.RouteResentCall(client_, call, &ops, &seq, &routed).ok());
  ASSERT_TRUE(routed);
  const std::set<uint64_t> again = exchange_of(ops);
  ASSERT_EQ(again.size(), 1u);
  const uint64_t again_id = *again.begin();
  EXPECT_NE(again_id, first_id);
  const uint64_t base = ClientMadeId(kServerClientId, 0);
  EXPECT_TRUE(IsEarlierTemporary(first_id - base, after_.temporary_floor()));
  EXPECT_FALSE(IsEarlierTemporary(again_id - base, after_.temporary_floor()));
}

TEST_F(RestartTest, ARemapIsJournaledWithTheProgramsThatFollowIt) {
  // A spare takes host1's place: the slice and its XLA program follow.
  const int64_t spare =
      before_.AddWorker(Host("spare", 1, /*spare=*/true), absl::Now(), 102).id;
  proto::RegisterProgram reg;
  reg.set_program_id(Id(2));
  reg.mutable_program()->set_name("xla_prog");
  reg.mutable_program()->set_kernel("xla");
  reg.mutable_program()->mutable_xla()->set_module("module");
  auto* island = reg.mutable_program()->mutable_xla()->add_islands();
  island->add_workers(w1_);
  ASSERT_TRUE(before_.RegisterProgram(client_, reg).ok());
  const WorkerLoss loss = before_.LoseWorker(w1_, "killed");
  ASSERT_EQ(loss.spare, spare);
  Restart();
  const SliceRecord& s = after_.slices().at(slice_);
  EXPECT_EQ(s.generation, 1u);
  bool on_spare = false;
  for (const DeviceRef& d : s.devices) on_spare |= d.worker_id == spare;
  EXPECT_TRUE(on_spare);
  const ProgramRecord& prog = after_.FindClient(client_)->programs.at(Id(2));
  EXPECT_EQ(prog.def.xla().islands(0).workers(0), spare);
  EXPECT_FALSE(after_.workers().at(w1_).away);  // lost, not coming back
  EXPECT_FALSE(after_.workers().at(spare).info.spare());
}

TEST_F(RestartTest, ASnapshotRebuildsWhatTheWholeJournalDoes) {
  proto::SliceRequest req;
  req.set_num_devices(1);
  ASSERT_TRUE(before_.CreateSlice(client_, req).ok());
  const proto::ModelSnapshot snap = before_.SnapshotRecords();
  ClusterState compacted;
  for (const proto::ModelRecord& r : snap.records()) {
    ASSERT_TRUE(compacted.Restore(r).ok()) << r.DebugString();
  }
  compacted.FinishRestore();
  Restart();
  EXPECT_EQ(compacted.SnapshotRecords().SerializeAsString(),
            after_.SnapshotRecords().SerializeAsString());
  EXPECT_EQ(compacted.slices().size(), 2u);
}

}  // namespace
}  // namespace plexus
