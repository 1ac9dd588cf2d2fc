// What a lost host means for admission and for each client, decided on
// the model alone (HoldForLoss, SettleLoss): the work held and routed
// again onto a spare, a client that hears later, a broken slice's waiting
// calls failed in place, a slice that waits and then breaks, and a slice
// that shrinks.
#include "plexus/server/recovery/settle_loss.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "plexus/server/recovery/recovery_test_util.h"

namespace plexus {
namespace {

// host0, host1 (workers 1, 2) and spare0, as RecoveryTest, with an
// admission queue the client's routed work waits in (nothing is admitted
// unless a test takes it).
class SettleLossTest : public RecoveryTest {
 protected:
  void SetUp() override {
    RecoveryTest::SetUp();
    for (int64_t w : {int64_t{1}, int64_t{2}, spare_}) {
      admission_.AddWorker(w, 2);
    }
    admission_.AddClient(client_, 1, 64);
    Register(Id(1), "scale", kReplicated, kReplicated);
  }
  // Routes a call of `scale` from `in` to `out` on `slice` and leaves it
  // waiting at admission.
  void Queue(uint64_t slice, uint64_t in, uint64_t out) {
    WorkerOps ops;
    const uint64_t seq =
        Route(MakeCall(Id(1), slice, in, kReplicated, out), &ops);
    ASSERT_NE(seq, 0u);
    admission_.Enqueue(client_, MakeAdmissionUnit(std::move(ops), seq));
  }
  // No spare is left: spare0 (which holds no slice) goes first.
  void LoseTheSpare() {
    WorkerLoss gone = state_.LoseWorker(spare_, "spare0 stopped");
    EXPECT_TRUE(gone.clients.empty());
  }
  const Admission::ClientView& View() { return *admission_.Find(client_); }
  // Every unit admission lets go now.
  std::vector<AdmissionUnit> Drain() {
    std::vector<AdmissionUnit> units;
    uint64_t c = 0;
    AdmissionUnit unit;
    while (units.size() < 100 && admission_.Next(&c, &unit)) {
      units.push_back(std::move(unit));
    }
    return units;
  }
  // The workers a unit sends to, or runs on.
  static std::set<int64_t> Workers(const AdmissionUnit& unit) {
    std::set<int64_t> ws(unit.exec_workers.begin(), unit.exec_workers.end());
    for (const auto& [w, list] : unit.ops) ws.insert(w);
    return ws;
  }
  // The buffer ids failed by the unit's ops on `worker`, with the message.
  static std::set<uint64_t> Failed(const AdmissionUnit& unit, int64_t worker,
                                   std::string* message = nullptr) {
    std::set<uint64_t> ids;
    auto it = unit.ops.find(worker);
    if (it == unit.ops.end()) return ids;
    for (const proto::WorkerOp& op : it->second) {
      if (!op.has_fail()) continue;
      ids.insert(op.fail().buffer_ids().begin(), op.fail().buffer_ids().end());
      if (message != nullptr) *message = op.fail().status().message();
    }
    return ids;
  }
  static bool Everyone(uint64_t) { return true; }

  Admission admission_;
};

TEST_F(SettleLossTest, ARemappedClientsWaitingWorkIsRoutedAgainOnTheSpare) {
  const uint64_t s = Spread4();
  Put(Id(10), s, kReplicated);
  Queue(s, Id(10), Id(11));
  Queue(s, Id(11), Id(12));
  ASSERT_EQ(View().pending_calls, 2);

  const WorkerLoss loss = state_.LoseWorker(2, "worker 2 was killed");
  ASSERT_EQ(loss.spare, spare_);
  // Routed on the old map: held apart, neither admitted nor failed.
  EXPECT_EQ(HoldForLoss(state_, admission_, loss), 0);
  EXPECT_EQ(View().held_units, 2);
  EXPECT_EQ(View().pending_calls, 0);
  EXPECT_TRUE(Drain().empty());

  std::vector<ClientSettlement> settled =
      SettleLoss(state_, admission_, loss, Everyone);
  // Nothing reaches admission before the caller has sent the peer ops the
  // recovery made (a transfer admitted first reached a source that had
  // not heard of its destination).
  EXPECT_EQ(View().held_units, 0);
  EXPECT_EQ(View().pending_units, 0);
  EXPECT_TRUE(Drain().empty());
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_GE(settled[0].units.size(), 2u);
  EnqueueSettled(admission_, loss, settled);
  EXPECT_TRUE(settled[0].units.empty());
  const ClientSettlement& c = settled[0];
  EXPECT_EQ(c.client_id, client_);
  EXPECT_TRUE(c.recovered);
  EXPECT_GE(c.units_routed, 2);
  EXPECT_TRUE(c.shrunk.empty());
  ASSERT_EQ(c.note.workers_down_size(), 1);
  EXPECT_EQ(c.note.workers_down(0).worker_id(), 2);
  EXPECT_EQ(c.note.workers_down(0).status().message(), "worker 2 was killed");
  ASSERT_EQ(c.note.recoveries_size(), 1);
  EXPECT_EQ(c.note.recoveries(0).worker_id(), 2);
  ASSERT_EQ(c.note.recoveries(0).remapped_size(), 1);
  EXPECT_EQ(c.note.recoveries(0).remapped(0).slice_id(), s);

  // Its work waits again, routed on the new map: nothing goes to the lost
  // host, both calls run on host0 and the spare.
  EXPECT_EQ(View().held_units, 0);
  EXPECT_EQ(View().pending_calls, 2);
  int calls = 0;
  for (const AdmissionUnit& unit : Drain()) {
    EXPECT_FALSE(Workers(unit).count(2) > 0);
    if (!unit.is_call()) continue;
    ++calls;
    EXPECT_EQ(
        std::set<int64_t>(unit.exec_workers.begin(), unit.exec_workers.end()),
        (std::set<int64_t>{1, spare_}));
  }
  EXPECT_EQ(calls, 2);
}

// A client with no stream when the loss is settled (it reconnects later)
// is left out: its work stays held, and settling again once it is
// connected gives it all.
TEST_F(SettleLossTest, AClientNotConnectedKeepsItsWorkHeldUntilItHears) {
  const uint64_t s = Spread4();
  Put(Id(10), s, kReplicated);
  Queue(s, Id(10), Id(11));
  const WorkerLoss loss = state_.LoseWorker(2, "killed");
  HoldForLoss(state_, admission_, loss);
  EXPECT_TRUE(SettleLoss(state_, admission_, loss, [](uint64_t) {
                return false;
              }).empty());
  EXPECT_EQ(View().held_units, 1);
  EXPECT_TRUE(Drain().empty());

  std::vector<ClientSettlement> settled =
      SettleLoss(state_, admission_, loss, Everyone);
  EnqueueSettled(admission_, loss, settled);
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_TRUE(settled[0].recovered);
  EXPECT_EQ(View().held_units, 0);
  EXPECT_EQ(View().pending_calls, 1);
}

// No spare: the slice breaks. The call waiting at admission that needed
// the lost host fails at once, in its place, on the host that survives;
// the client hears what was lost.
TEST_F(SettleLossTest, ABrokenSlicesWaitingCallFailsInPlace) {
  LoseTheSpare();
  const uint64_t s = Spread4();
  Put(Id(10), s, kReplicated);
  Queue(s, Id(10), Id(11));
  const WorkerLoss loss = state_.LoseWorker(2, "worker 2 was killed");
  ASSERT_EQ(loss.broken, std::set<uint64_t>{s});
  EXPECT_EQ(HoldForLoss(state_, admission_, loss), 1);
  EXPECT_EQ(View().held_units, 0);

  std::vector<ClientSettlement> settled =
      SettleLoss(state_, admission_, loss, Everyone);
  EnqueueSettled(admission_, loss, settled);
  ASSERT_EQ(settled.size(), 1u);
  const ClientSettlement& c = settled[0];
  EXPECT_FALSE(c.recovered);
  EXPECT_EQ(c.held_failed, 0);
  ASSERT_EQ(c.note.workers_down_size(), 1);
  EXPECT_GT(c.lost_ids, 0);
  ASSERT_EQ(c.note.recoveries_size(), 1);
  const auto& lost = c.note.recoveries(0).lost_ids();
  EXPECT_NE(std::find(lost.begin(), lost.end(), Id(10)), lost.end());

  std::vector<AdmissionUnit> units = Drain();
  ASSERT_EQ(units.size(), 1u);
  EXPECT_FALSE(units[0].is_call());
  EXPECT_FALSE(Workers(units[0]).count(2) > 0);
  std::string message;
  EXPECT_EQ(Failed(units[0], 1, &message), std::set<uint64_t>{Id(11)});
  EXPECT_EQ(message, "worker 2 was killed");
}

// No spare now, but the cluster waits for one: the client's work is held
// and it hears nothing while its slice waits; when the wait ends without
// a host, the slice breaks and the held call fails where it needed the
// lost host.
TEST_F(SettleLossTest, AWaitingSlicesWorkIsHeldUntilTheWaitEndsThenFails) {
  LoseTheSpare();
  const uint64_t s = Spread4();
  Put(Id(10), s, kReplicated);
  Queue(s, Id(10), Id(11));
  const absl::Time now = absl::Now();
  const WorkerLoss loss =
      state_.LoseWorker(2, "killed", now, absl::Seconds(10));
  ASSERT_EQ(loss.awaiting, std::set<uint64_t>{s});
  EXPECT_EQ(HoldForLoss(state_, admission_, loss), 0);
  EXPECT_EQ(View().held_units, 1);
  EXPECT_TRUE(SettleLoss(state_, admission_, loss, Everyone).empty());
  EXPECT_EQ(View().held_units, 1);

  std::vector<WorkerLoss> ended = state_.EndAwaited(now + absl::Seconds(11));
  ASSERT_EQ(ended.size(), 1u);
  ASSERT_EQ(ended[0].broken, std::set<uint64_t>{s});
  std::vector<ClientSettlement> settled =
      SettleLoss(state_, admission_, ended[0], Everyone);
  EnqueueSettled(admission_, ended[0], settled);
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_FALSE(settled[0].recovered);
  EXPECT_EQ(settled[0].held_failed, 1);
  EXPECT_EQ(View().held_units, 0);
  std::vector<AdmissionUnit> units = Drain();
  ASSERT_EQ(units.size(), 1u);
  EXPECT_FALSE(Workers(units[0]).count(2) > 0);
  std::string message;
  EXPECT_EQ(Failed(units[0], 1, &message), std::set<uint64_t>{Id(11)});
  EXPECT_TRUE(absl::StrContains(message, "killed")) << message;
}

// A slice that shrinks on a loss: its note says the new size first (what
// moved, what was lost), then the loss; the moves wait at admission.
TEST_F(SettleLossTest, AShrunkSliceIsTheFirstThingItsClientHears) {
  LoseTheSpare();
  proto::SliceRequest req;
  req.set_num_devices(4);
  req.set_placement(proto::PLACEMENT_SPREAD);
  req.set_on_loss(proto::LOSS_SHRINK);
  auto slice = state_.CreateSlice(client_, req);
  ASSERT_TRUE(slice.ok()) << slice.status();
  const uint64_t s = slice->slice_id();
  proto::PutDecl put;
  put.set_buffer_id(Id(10));
  put.set_slice_id(s);
  *put.mutable_arg() = ToProto(kReplicated);
  WorkerOps ops;
  ASSERT_TRUE(state_.RoutePut(client_, put, &ops).ok());

  const WorkerLoss loss = state_.LoseWorker(2, "killed");
  ASSERT_TRUE(loss.shrunk.count(s) > 0);
  HoldForLoss(state_, admission_, loss);
  std::vector<ClientSettlement> settled =
      SettleLoss(state_, admission_, loss, Everyone);
  EnqueueSettled(admission_, loss, settled);
  ASSERT_EQ(settled.size(), 1u);
  const ClientSettlement& c = settled[0];
  ASSERT_EQ(c.shrunk.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(
      c.shrunk[0],
      absl::StrCat("slice ", s, " shrank to 2 devices: worker 2 was lost")))
      << c.shrunk[0];
  ASSERT_GE(c.note.recoveries_size(), 1);
  EXPECT_EQ(c.note.recoveries(0).SerializeAsString(),
            loss.shrunk.at(s).note.SerializeAsString());
  ASSERT_EQ(c.note.workers_down_size(), 1);
  for (const AdmissionUnit& unit : Drain()) {
    EXPECT_FALSE(Workers(unit).count(2) > 0);
  }
}

}  // namespace
}  // namespace plexus
