// Why is it stuck (server/why/why.h), driven on ClusterState directly: a chain
// of calls over two hosts, the root's host silent, lost, or answering.
#include "plexus/server/why/why.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/server/model/cluster_state_test_util.h"
#include "plexus/server/recovery/recovery_test_util.h"

namespace plexus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class WhyTest : public ClusterStateTest {
 protected:
  void SetUp() override {
    ClusterStateTest::SetUp();
    proto::SliceRequest req;
    req.set_num_devices(1);
    req.add_hosts("host0");
    a_ = state_.CreateSlice(client_, req)->slice_id();
    req.set_hosts(0, "host1");
    b_ = state_.CreateSlice(client_, req)->slice_id();
    Register(Id(1), "scale", kReplicated, kReplicated);
    proto::PutDecl put;
    put.set_buffer_id(Id(10));
    put.set_slice_id(a_);
    *put.mutable_arg() = ToProto(kReplicated);
    WorkerOps ops;
    ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());
    // Y = scale(X) on host0, Z = scale(Y) on host1; neither done.
    state_.set_now(start_);
    ASSERT_TRUE(
        state_.RouteCall(client_, Call(a_, Id(10), a_, Id(11)), &ops).ok());
    ASSERT_TRUE(
        state_.RouteCall(client_, Call(b_, Id(11), a_, Id(12)), &ops).ok());
    for (auto& [id, w] : state_.workers()) Worker(id)->last_heartbeat = now_;
  }
  proto::Call Call(uint64_t slice, uint64_t in, uint64_t in_slice,
                   uint64_t out) {
    return OneInputCall(Id(1), slice, in, in_slice, out);
  }
  WorkerRecord* Worker(int64_t id) { return state_.FindWorker(id); }
  // `made` = scale(X) on host0, issued at "train.py:41 in step" (site 7),
  // then `read` = scale(made) on host1.
  void RouteStepThenConsumer(uint64_t made, uint64_t read) {
    state_.FindClient(client_)->call_sites[7] = "train.py:41 in step";
    proto::Call step = Call(a_, Id(10), a_, made);
    step.set_site(7);
    WorkerOps ops;
    ASSERT_TRUE(state_.RouteCall(client_, step, &ops).ok());
    ASSERT_TRUE(state_.RouteCall(client_, Call(b_, made, a_, read), &ops).ok());
  }
  std::vector<proto::WhyEntry> Why() {
    WhyOptions options;
    options.now = now_;
    return ExplainWaits(state_, options);
  }

  const absl::Time start_ = absl::FromUnixSeconds(1000);
  const absl::Time now_ = start_ + absl::Seconds(5);
  uint64_t a_ = 0;
  uint64_t b_ = 0;
};

TEST_F(WhyTest, AConsumerIsFollowedToTheCallItWaitsFor) {
  std::vector<proto::WhyEntry> why = Why();
  ASSERT_EQ(why.size(), 2u);
  const proto::WhyEntry* z = why[0].call_id() == Id(12) ? &why[0] : &why[1];
  EXPECT_EQ(z->waited_ms(), 5000);
  EXPECT_EQ(z->root_call_id(), Id(11));
  EXPECT_EQ(z->blame_host(), "host0");
  EXPECT_THAT(z->reason(),
              HasSubstr("has waited 5 s for its input from call "));
  EXPECT_THAT(z->reason(),
              HasSubstr("it is running on host host0, first in line there"));
}

TEST_F(WhyTest, ACallQueuedBehindAnotherOnItsDeviceNamesIt) {
  // W = scale(X) on host0 needs nothing Y makes, but Y holds the device.
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(a_, Id(10), a_, Id(15)), &ops).ok());
  const proto::WhyEntry* w = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  for (const proto::WhyEntry& e : why) {
    if (e.call_id() == Id(15)) w = &e;
  }
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->root_call_id(), Id(15));
  EXPECT_EQ(w->blame_host(), "host0");
  EXPECT_THAT(w->reason(),
              HasSubstr(absl::StrCat("it is queued on host host0 behind call ",
                                     Id(11), " ('scale'), routed 5 s ago")));
}

TEST_F(WhyTest, NamesTheLinesOfTheUsersProgramThatIssuedEachCall) {
  // Two more calls after Z, issued from lines the client named.
  ClientRecord* client = state_.FindClient(client_);
  client->call_sites[7] = "train.py:41 in step";
  client->call_sites[8] = "train.py:58 in main";
  proto::Call step = Call(a_, Id(12), b_, Id(13));
  step.set_site(7);
  proto::Call last = Call(b_, Id(13), a_, Id(14));
  last.set_site(8);
  WorkerOps ops;
  ASSERT_TRUE(state_.RouteCall(client_, step, &ops).ok());
  ASSERT_TRUE(state_.RouteCall(client_, last, &ops).ok());
  const proto::WhyEntry* e = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  for (const proto::WhyEntry& w : why) {
    if (w.call_id() == Id(14)) e = &w;
  }
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->site(), "train.py:58 in main");
  EXPECT_THAT(e->reason(),
              HasSubstr("('scale' issued at train.py:58 in main) has waited "
                        "5 s for its input from call "));
  EXPECT_THAT(e->reason(), HasSubstr("('scale' issued at train.py:41 in "
                                     "step), which waits for call "));
}

TEST_F(WhyTest, ASilentHostIsNamedWithItsPid) {
  Worker(1)->last_heartbeat = now_ - absl::Seconds(2);
  for (const proto::WhyEntry& e : Why()) {
    EXPECT_EQ(e.blame_host(), "host0");
    EXPECT_THAT(e.reason(), HasSubstr("host host0 (worker 1, pid "));
    EXPECT_THAT(e.reason(), HasSubstr("has sent no heartbeat for 2000 ms"));
  }
}

TEST_F(WhyTest, AFullDeviceIsNamedWithTheClientsWhoseValuesHoldIt) {
  // host0's device reports an allocation waiting for room: the root call's
  // output there cannot be made until something is released.
  Worker(1)->stats.add_device_waiting_bytes(int64_t{3} << 20);
  int explained = 0;
  for (const proto::WhyEntry& e : Why()) {
    ++explained;
    EXPECT_EQ(e.root_call_id(), Id(11));
    EXPECT_EQ(e.blame_host(), "host0");
    EXPECT_THAT(e.reason(), HasSubstr("device 0 of host host0 is full ("));
    EXPECT_THAT(e.reason(), HasSubstr("3.0 MiB wait for room"));
    // The put X and the output Y of the root are held on host0's device:
    // both the test client's.
    EXPECT_THAT(e.reason(),
                HasSubstr(absl::StrCat("held by client ", client_)));
    EXPECT_THAT(e.reason(), HasSubstr("in 2 values"));
    EXPECT_THAT(e.reason(), HasSubstr("--device-memory-mib"));
  }
  EXPECT_EQ(explained, 2);
  // Once nothing waits there, the root is running again.
  Worker(1)->stats.clear_device_waiting_bytes();
  for (const proto::WhyEntry& e : Why()) {
    EXPECT_THAT(e.reason(), Not(HasSubstr("is full")));
  }
}

TEST_F(WhyTest, AProgramCompilingOnItsHostIsNamedWithHowLong) {
  // host0 said, 100 ms ago, that it had compiled 'scale' for 3 s.
  proto::CompileInProgress* c = Worker(1)->stats.add_compiling();
  c->set_program_id(Id(1));
  c->set_program("scale");
  c->add_devices(0);
  c->set_elapsed_ms(3000);
  Worker(1)->last_heartbeat = now_ - absl::Milliseconds(100);
  std::vector<proto::WhyEntry> why = Why();
  ASSERT_EQ(why.size(), 2u);
  for (const proto::WhyEntry& e : why) {
    EXPECT_EQ(e.root_call_id(), Id(11));
    EXPECT_EQ(e.blame_host(), "host0");
    EXPECT_THAT(e.reason(),
                HasSubstr("its program 'scale' is compiling on host host0 "
                          "(3.1 s so far)"));
    // The root alone, for a one-line display.
    EXPECT_EQ(e.root_reason(),
              absl::StrCat("call ", Id(11),
                           " ('scale'): its program 'scale' is compiling on "
                           "host host0 (3.1 s so far)"));
  }
  // A call queued behind the compiling one names the compile too.
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(a_, Id(10), a_, Id(15)), &ops).ok());
  bool queued = false;
  for (const proto::WhyEntry& e : Why()) {
    if (e.call_id() != Id(15)) continue;
    queued = true;
    EXPECT_THAT(e.reason(),
                HasSubstr(absl::StrCat(
                    "it is queued on host host0 behind call ", Id(11),
                    " ('scale'), routed 5 s ago, whose program 'scale' is "
                    "compiling there (3.1 s so far)")));
  }
  EXPECT_TRUE(queued);
}

TEST_F(WhyTest, ACompileOfAnotherProgramIsNotTheCause) {
  proto::CompileInProgress* c = Worker(1)->stats.add_compiling();
  c->set_program_id(Id(2));
  c->set_program("other");
  c->set_elapsed_ms(3000);
  for (const proto::WhyEntry& e : Why()) {
    EXPECT_THAT(e.reason(), Not(HasSubstr("compiling")));
    EXPECT_THAT(e.reason(), HasSubstr("it is running on host host0"));
  }
}

TEST_F(WhyTest, ALostInputIsTheRoot) {
  WorkerLoss loss = state_.LoseWorker(1, "killed [host host0, pid 7]");
  state_.LoseOnBrokenSlices(client_, loss);
  int explained = 0;
  for (const proto::WhyEntry& e : Why()) {
    if (e.call_id() != Id(12)) continue;
    ++explained;
    EXPECT_THAT(e.reason(), HasSubstr("was lost"));
    EXPECT_THAT(e.reason(), HasSubstr("host0"));
  }
  EXPECT_EQ(explained, 1);
}

TEST_F(WhyTest, ALostInputNamesTheLineThatMadeIt) {
  // W = scale(X) on host0, issued at a line the client named, then
  // V = scale(W) on host1; host0 is lost with W.
  RouteStepThenConsumer(Id(15), Id(16));
  WorkerLoss loss = state_.LoseWorker(1, "killed [host host0, pid 7]");
  state_.LoseOnBrokenSlices(client_, loss);
  const proto::WhyEntry* e = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  for (const proto::WhyEntry& w : why) {
    if (w.call_id() == Id(16)) e = &w;
  }
  ASSERT_NE(e, nullptr);
  EXPECT_THAT(e->reason(),
              HasSubstr(absl::StrCat("its input buffer ", Id(15),
                                     " (the output of call ", Id(15),
                                     " ('scale' issued at train.py:41 in "
                                     "step)) was lost: ")));
}

TEST_F(WhyTest, CallsAtAdmissionAreOneEntryNamingTheShareAndWhoRuns) {
  // Another client's call runs on host0 (in flight, first there); Y and Z
  // (and W) of the test client wait at admission.
  const uint64_t other = state_.AddClient("holder", "batch").id;
  uint64_t seq_y = 0, seq_z = 0, seq_w = 0;
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(a_, Id(10), a_, Id(15)), &ops).ok());
  for (const auto& [seq, call] : state_.records().calls()) {
    if (call.call_id == Id(11)) seq_y = seq;
    if (call.call_id == Id(12)) seq_z = seq;
    if (call.call_id == Id(15)) seq_w = seq;
  }
  // The holder's call: a record of the other client, in flight.
  proto::SliceRequest req;
  req.set_num_devices(1);
  req.add_hosts("host0");
  const uint64_t held = state_.CreateSlice(other, req)->slice_id();
  proto::RegisterProgram reg;
  reg.set_program_id(ClientMadeId(other, 1));
  reg.mutable_program()->set_kernel("scale");
  reg.mutable_program()->set_name("long_step");
  *reg.mutable_program()->add_inputs() = ToProto(kReplicated);
  *reg.mutable_program()->add_outputs() = ToProto(kReplicated);
  ASSERT_TRUE(state_.RegisterProgram(other, reg).ok());
  proto::PutDecl put;
  put.set_buffer_id(ClientMadeId(other, 10));
  put.set_slice_id(held);
  *put.mutable_arg() = ToProto(kReplicated);
  ASSERT_TRUE(state_.RoutePut(other, put, &ops).ok());
  state_.set_now(start_ - absl::Seconds(1));
  ASSERT_TRUE(state_
                  .RouteCall(other,
                             OneInputCall(ClientMadeId(other, 1), held,
                                          ClientMadeId(other, 10), held,
                                          ClientMadeId(other, 11)),
                             &ops)
                  .ok());
  uint64_t seq_holder = 0;
  for (const auto& [seq, call] : state_.records().calls()) {
    if (call.client_id == other) seq_holder = seq;
  }
  absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>> not_done;
  not_done[seq_holder] = {1};
  absl::flat_hash_map<uint64_t, WhyOptions::AdmissionQueue> queues;
  queues[client_].seqs = {seq_y, seq_z, seq_w};
  queues[other].weight = 3;
  WhyOptions options;
  options.now = now_;
  options.not_done = &not_done;
  options.admission = &queues;
  std::vector<proto::WhyEntry> why = ExplainWaits(state_, options);
  // The holder's call, and one entry for the test client's three.
  ASSERT_EQ(why.size(), 2u) << why[0].reason();
  EXPECT_EQ(why[0].client_id(), other);
  const proto::WhyEntry& e = why[1];
  EXPECT_EQ(e.client_id(), client_);
  EXPECT_EQ(e.call_id(), Id(11));
  EXPECT_THAT(e.output_ids(), ::testing::ElementsAre(Id(11), Id(12), Id(15)));
  EXPECT_EQ(e.blame_host(), "host0");
  EXPECT_THAT(e.reason(),
              HasSubstr(absl::StrCat(
                  "has waited 5 s: it waits at admission for its client's "
                  "share (tenant default, weight 1), with 2 more of its "
                  "calls; calls in flight: its own 0, client ",
                  other,
                  " (holder, tenant batch, weight 3) 1; the oldest of "
                  "theirs is call ",
                  ClientMadeId(other, 11), " ('long_step') of client ", other,
                  ", routed 6 s ago")));
}

TEST_F(WhyTest, ASliceWaitingForAHostIsAnEntryWithTheTimeLeft) {
  SliceRecord& s = const_cast<SliceRecord&>(state_.slices().at(b_));
  s.awaiting = "killed [host host1]";
  s.awaiting_since = now_ - absl::Seconds(2);
  s.awaiting_until = now_ + absl::Seconds(8);
  const proto::WhyEntry* e = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  for (const proto::WhyEntry& w : why) {
    if (w.call_id() == 0) e = &w;
  }
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->slice_id(), b_);
  EXPECT_EQ(e->client_id(), client_);
  EXPECT_EQ(e->waited_ms(), 2000);
  EXPECT_THAT(e->reason(),
              HasSubstr(absl::StrCat(
                  "slice ", b_,
                  " has waited 2 s for a host to take a lost one's place "
                  "(killed [host host1]), 8 s left")));
}

TEST_F(WhyTest, AnInputWhoseSourceHostIsSilentNamesThatHost) {
  // Y's call is done on host0, but host0 went silent before its transfer
  // of Y to host1 arrived: Z, first in line on host1, waits for host0.
  for (const auto& [seq, call] : state_.records().calls()) {
    if (call.call_id != Id(11)) continue;
    WorkerOps ops;
    state_.CallDone(seq, /*failed=*/false, &ops);
    break;
  }
  Worker(1)->last_heartbeat = now_ - absl::Seconds(2);
  std::vector<proto::WhyEntry> why = Why();
  ASSERT_EQ(why.size(), 1u);
  EXPECT_EQ(why[0].call_id(), Id(12));
  EXPECT_EQ(why[0].root_call_id(), Id(12));
  EXPECT_EQ(why[0].blame_host(), "host0");
  EXPECT_THAT(why[0].reason(),
              HasSubstr(absl::StrCat("its input buffer ", Id(11),
                                     " (the output of call ", Id(11),
                                     " ('scale')) is sent from another host, "
                                     "and host host0 (worker 1, pid ")));
  EXPECT_THAT(why[0].reason(), HasSubstr("the transfer waits for it"));
  // Heard from again, host0 is not named as silent: the transfer case.
  Worker(1)->last_heartbeat = now_;
  EXPECT_THAT(Why()[0].reason(), Not(HasSubstr("no heartbeat")));
}

// Y's call, issued at a line the client named, is done on host0; Z on
// host1 reads Y (call 14 of 13's output). Returns Z's entry.
class WhyTransferTest : public WhyTest {
 protected:
  void SetUp() override {
    WhyTest::SetUp();
    RouteStepThenConsumer(Id(13), Id(14));
    WorkerOps ops;
    for (const auto& [seq, call] : state_.records().calls()) {
      if (call.call_id == Id(11) || call.call_id == Id(12) ||
          call.call_id == Id(13)) {
        state_.CallDone(seq, /*failed=*/false, &ops);
      }
    }
    Worker(1)->last_heartbeat = now_ - absl::Milliseconds(40);
    y_ = absl::StrCat("buffer ", Id(13), " (the output of call ", Id(13),
                      " ('scale' issued at train.py:41 in step))");
  }
  // host1 says, 100 ms ago, that a task waits for Y from host0 (worker 1)
  // since 2 s.
  void Host1AwaitsY() {
    proto::InputAwaited* a = Worker(2)->stats.add_awaiting_inputs();
    a->set_buffer_id(Id(13));
    a->set_source_worker(1);
    a->set_elapsed_ms(2000);
    Worker(2)->stats.set_inputs_awaited(1);
    Worker(2)->last_heartbeat = now_ - absl::Milliseconds(100);
  }
  const proto::WhyEntry* Find(const std::vector<proto::WhyEntry>& why,
                              uint64_t call_id) {
    for (const proto::WhyEntry& w : why) {
      if (w.call_id() == call_id) return &w;
    }
    return nullptr;
  }
  // Y, named by the line that made it (Id needs the client: after SetUp).
  std::string y_;
};

TEST_F(WhyTransferTest, AnInputAHostAwaitsFromALivePeerNamesTheTransfer) {
  // host1's heartbeat says its task waits for Y from host0, which answers:
  // the value, the line that made it, the peer, that it is alive, and how
  // long the transfer has been awaited.
  Host1AwaitsY();
  std::vector<proto::WhyEntry> why = Why();
  const proto::WhyEntry* e = Find(why, Id(14));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->root_call_id(), Id(14));
  EXPECT_EQ(e->blame_host(), "host0");
  EXPECT_EQ(e->slice_id(), b_);
  EXPECT_THAT(e->output_ids(), ::testing::ElementsAre(Id(14)));
  EXPECT_THAT(
      e->reason(),
      HasSubstr(absl::StrCat(
          "it is first in line on host host1 and waits for its input ", y_,
          " from host host0 (worker 1), which is alive (last heartbeat 40 ms "
          "ago) and has not delivered it: host host1 has awaited the "
          "transfer for 2.1 s")));
  EXPECT_THAT(e->reason(), Not(HasSubstr("running")));
  // A call queued behind it on host1 names the transfer too.
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(b_, Id(10), a_, Id(15)), &ops).ok());
  why = Why();
  const proto::WhyEntry* behind = Find(why, Id(15));
  ASSERT_NE(behind, nullptr);
  EXPECT_EQ(behind->blame_host(), "host0");  // the transfer's sender
  EXPECT_THAT(behind->reason(),
              HasSubstr(absl::StrCat(
                  "it is queued on host host1 behind call ", Id(14),
                  " ('scale'), routed 5 s ago, which waits for its input ", y_,
                  " from host host0 (worker 1), which is alive")));
}

TEST_F(WhyTransferTest, ATransfersTemporaryIsNamedByTheValueItCarries) {
  // Workers receive a value from another host under a temporary id of the
  // server's (route_call.cc): host1 reports that id, from host0.
  Host1AwaitsY();
  Worker(2)->stats.mutable_awaiting_inputs(0)->set_buffer_id(
      ClientMadeId(kServerClientId, 3));
  std::vector<proto::WhyEntry> why = Why();
  const proto::WhyEntry* e = Find(why, Id(14));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->blame_host(), "host0");
  EXPECT_THAT(e->reason(),
              HasSubstr(absl::StrCat("waits for its input ", y_,
                                     " from host host0 (worker 1), which is "
                                     "alive")));
  // A temporary from a host none of its inputs comes from is not its.
  Worker(2)->stats.mutable_awaiting_inputs(0)->set_source_worker(7);
  why = Why();
  EXPECT_THAT(Find(why, Id(14))->reason(), HasSubstr("it is running"));
}

TEST_F(WhyTransferTest, AnInputFromASilentPeerNamesThePeersTrouble) {
  Host1AwaitsY();
  WhyOptions options;
  options.now = now_;
  Worker(1)->last_heartbeat = now_ - absl::Seconds(2);
  const std::vector<proto::WhyEntry> why = ExplainWaits(state_, options);
  const proto::WhyEntry* e = Find(why, Id(14));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->blame_host(), "host0");
  EXPECT_THAT(e->reason(), HasSubstr("has sent no heartbeat for 2000 ms"));
}

TEST_F(WhyTransferTest, AHostThatAwaitsNoInputRunsTheCall) {
  // host1 reported after Z was routed, and no task of it waits for an
  // input: Z runs.
  Worker(2)->last_heartbeat = now_ - absl::Milliseconds(100);
  const proto::WhyEntry* e = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  e = Find(why, Id(14));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->blame_host(), "host1");
  EXPECT_THAT(e->reason(),
              HasSubstr("it is running on host host1, first in line there, "
                        "which answer and say it waits for none of its "
                        "inputs"));
  // An input made on host1 itself (source -1) is no transfer.
  proto::InputAwaited* a = Worker(2)->stats.add_awaiting_inputs();
  a->set_buffer_id(Id(13));
  a->set_source_worker(-1);
  why = Why();
  EXPECT_THAT(Find(why, Id(14))->reason(), HasSubstr("it is running"));
}

TEST_F(WhyTransferTest, WithoutAReportSinceTheCallBothAreSaid) {
  // host1 has not reported since Z was routed (and is not yet silent, by a
  // long silent_after): the records cannot tell the transfer from Z
  // running, so the sentence says both.
  Worker(2)->last_heartbeat = start_ - absl::Milliseconds(1);
  WhyOptions options;
  options.now = now_;
  options.silent_after = absl::Seconds(30);
  const std::vector<proto::WhyEntry> why = ExplainWaits(state_, options);
  const proto::WhyEntry* e = Find(why, Id(14));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->blame_host(), "host0");
  EXPECT_THAT(
      e->reason(),
      HasSubstr(absl::StrCat(
          "it is first in line on host host1 and waits for its input ", y_,
          ", done on host host0, which answers (heartbeat 40 ms ago) "
          "and has not sent it yet, or it runs")));
}

TEST_F(WhyTest, AHostThatFinishedItsPartIsNamedAndNotBlamed) {
  // A call over both hosts, after Y's on host0 (still running there).
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.add_hosts("host0");
  req.add_hosts("host1");
  req.set_placement(proto::PLACEMENT_SPREAD);
  const uint64_t both = state_.CreateSlice(client_, req)->slice_id();
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(both, Id(10), a_, Id(13)), &ops).ok());
  uint64_t seq = 0;
  for (const auto& [s, call] : state_.records().calls()) {
    if (call.call_id == Id(13)) seq = s;
  }
  ASSERT_NE(seq, 0u);
  auto explain =
      [&](const absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>>*
              not_done) {
        WhyOptions options;
        options.now = now_;
        options.not_done = not_done;
        for (const proto::WhyEntry& e : ExplainWaits(state_, options)) {
          if (e.call_id() == Id(13)) return e;
        }
        return proto::WhyEntry();
      };
  // Without admission's reports both hosts count.
  EXPECT_THAT(explain(nullptr).reason(), Not(HasSubstr("finished")));
  // host1 (worker 2) reported its part done; host0 (worker 1) has not.
  absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>> not_done;
  not_done[seq] = {1};
  proto::WhyEntry e = explain(&not_done);
  EXPECT_EQ(e.blame_host(), "host0");
  EXPECT_THAT(e.reason(), HasSubstr("; host host1 has finished its part"));
  EXPECT_THAT(e.reason(), Not(HasSubstr("on host host1 it is")));
  EXPECT_THAT(e.reason(), Not(HasSubstr("hosts host0, host1")));
  // Silent now, host1 is not blamed either: its part is done.
  Worker(2)->last_heartbeat = now_ - absl::Seconds(2);
  EXPECT_EQ(explain(&not_done).blame_host(), "host0");
}

TEST_F(WhyTest, ACollectiveQueuedOnOneHostNamesTheRankThatHasNotJoined) {
  // A call over both hosts (rank 0 on host0, rank 1 on host1); on host0
  // calls routed before it hold both devices (Y, and one over the two).
  proto::SliceRequest req;
  req.set_num_devices(2);
  req.add_hosts("host0");
  req.add_hosts("host1");
  req.set_placement(proto::PLACEMENT_SPREAD);
  const uint64_t both = state_.CreateSlice(client_, req)->slice_id();
  ASSERT_EQ(state_.slices().at(both).devices[0].worker_id, 1);
  req.clear_hosts();
  req.add_hosts("host0");
  req.set_placement(proto::PLACEMENT_ONE_HOST);
  const uint64_t pair = state_.CreateSlice(client_, req)->slice_id();
  WorkerOps ops;
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(pair, Id(10), a_, Id(17)), &ops).ok());
  // Z done: host1's devices are free.
  for (const auto& [seq, call] : state_.records().calls()) {
    if (call.call_id == Id(12)) state_.CallDone(seq, false, &ops);
  }
  ASSERT_TRUE(
      state_.RouteCall(client_, Call(both, Id(10), a_, Id(13)), &ops).ok());
  const proto::WhyEntry* e = nullptr;
  std::vector<proto::WhyEntry> why = Why();
  for (const proto::WhyEntry& w : why) {
    if (w.call_id() == Id(13)) e = &w;
  }
  ASSERT_NE(e, nullptr);
  EXPECT_THAT(e->reason(),
              HasSubstr("its rank 0 (of 2) is queued on host host0 behind "
                        "call "));
  EXPECT_THAT(e->reason(),
              HasSubstr("; on host host1 (rank 1) it is first in line (a "
                        "collective there waits for rank 0)"));
}

TEST_F(WhyTest, AShortWaitAndADoneCallAreNotListed) {
  WhyOptions options;
  options.now = start_ + absl::Milliseconds(500);
  EXPECT_TRUE(ExplainWaits(state_, options).empty());
}

}  // namespace
}  // namespace plexus
