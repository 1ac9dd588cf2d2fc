#include "plexus/server/scheduling/gang_scheduler.h"

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

// A worker queue whose writer records the call ids it delivers (a
// program load as 1000 + its program id, an op encoded for several
// workers, a release, as 2000 + its first id).
struct RecordingWorker {
  absl::Mutex mu;
  std::vector<uint64_t> calls ABSL_GUARDED_BY(mu);
  std::shared_ptr<WorkerQueue> queue =
      std::make_shared<WorkerQueue>([this](std::vector<OutOp>& ops) {
        absl::MutexLock lock(&mu);
        for (auto& op : ops) {
          if (op.call == nullptr && op.bytes != nullptr) {
            proto::WorkerOp shared;
            EXPECT_TRUE(shared.ParseFromString(std::string(op.bytes, op.size)));
            calls.push_back(2000 + shared.release().buffer_ids(0));
          } else if (op.call != nullptr) {
            calls.push_back(op.call->Execute(op.host).call_id());
          } else if (op.op != nullptr && op.op->has_load()) {
            calls.push_back(1000 + op.op->load().program_id());
          } else {
            calls.push_back(op.op->execute().call_id());
          }
        }
        return true;
      });
  std::vector<uint64_t> WaitFor(size_t n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return calls.size() >= n;
    };
    mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return calls;
  }
};

// One unit: call `id` executes on both workers 1 and 2.
WorkerOps Call(uint64_t id) {
  WorkerOps unit;
  for (int64_t w : {1, 2}) {
    proto::WorkerOp op;
    op.mutable_execute()->set_call_id(id);
    unit[w].push_back(op);
  }
  return unit;
}

TEST(GangSchedulerTest, EveryIslandGetsTheSameOrderAcrossClients) {
  GangScheduler scheduler({});
  RecordingWorker a, b;
  scheduler.AddWorker(1, a.queue);
  scheduler.AddWorker(2, b.queue);
  scheduler.Submit({Call(10), Call(11)});
  scheduler.Submit({Call(20), Call(21)});
  EXPECT_EQ(a.WaitFor(4), (std::vector<uint64_t>{10, 11, 20, 21}));
  EXPECT_EQ(b.WaitFor(4), (std::vector<uint64_t>{10, 11, 20, 21}));
  EXPECT_EQ(scheduler.epoch(), 2u);
}

TEST(GangSchedulerTest, TestOnlyBypassLetsIslandsDisagree) {
  GangScheduler scheduler({.consistent_order = false});
  RecordingWorker a, b;
  scheduler.AddWorker(1, a.queue);
  scheduler.AddWorker(2, b.queue);
  scheduler.Submit({Call(10), Call(11)});
  EXPECT_EQ(a.WaitFor(2), (std::vector<uint64_t>{11, 10}));
  EXPECT_EQ(b.WaitFor(2), (std::vector<uint64_t>{10, 11}));
}

// One unit: call `id` in wire form on `workers`, after a load of program
// `id` on the first of them.
GangUnit WireCall(uint64_t id, std::vector<int64_t> workers) {
  proto::Execute shared;
  shared.set_call_id(id);
  auto executes = std::make_shared<CallExecutes>(shared);
  proto::ShardTask task;
  for (int64_t w : workers) executes->AddHost(w, {&task});
  GangUnit unit;
  unit.ops[workers[0]].emplace_back().mutable_load()->set_program_id(id);
  unit.executes = std::move(executes);
  return unit;
}

TEST(GangSchedulerTest, ACallInWireFormGoesAfterItsOpsInUnitOrder) {
  GangScheduler scheduler({});
  RecordingWorker a, b;
  scheduler.AddWorker(1, a.queue);
  scheduler.AddWorker(2, b.queue);
  std::vector<GangUnit> batch;
  batch.push_back(WireCall(10, {1, 2}));
  batch.push_back({Call(11), nullptr});
  batch.push_back(WireCall(12, {2, 3}));  // worker 3 has no queue: dropped
  scheduler.Submit(std::move(batch));
  EXPECT_EQ(a.WaitFor(3), (std::vector<uint64_t>{1010, 10, 11}));
  EXPECT_EQ(b.WaitFor(4), (std::vector<uint64_t>{10, 11, 1012, 12}));
}

// An op encoded once for several workers (a wide slice's releases) goes
// to each of them after its unit's ops and before its unit's Executes, in
// unit order; on a worker it does not name, nothing.
TEST(GangSchedulerTest, AnOpEncodedForSeveralWorkersKeepsItsPlaceInTheUnit) {
  GangScheduler scheduler({});
  RecordingWorker a, b, c;
  scheduler.AddWorker(1, a.queue);
  scheduler.AddWorker(2, b.queue);
  scheduler.AddWorker(3, c.queue);
  proto::WorkerOp release;
  release.mutable_release()->add_buffer_ids(7);
  auto shared = std::make_shared<EncodedOp>();
  shared->bytes = release.SerializeAsString();
  shared->workers = {1, 2};
  std::vector<GangUnit> batch;
  batch.push_back({Call(10), nullptr});
  batch.push_back(WireCall(11, {1, 2, 3}));
  batch.back().shared.push_back(shared);
  batch.push_back(WireCall(12, {3}));
  scheduler.Submit(std::move(batch));
  EXPECT_EQ(a.WaitFor(4), (std::vector<uint64_t>{10, 1011, 2007, 11}));
  EXPECT_EQ(b.WaitFor(3), (std::vector<uint64_t>{10, 2007, 11}));
  EXPECT_EQ(c.WaitFor(3), (std::vector<uint64_t>{11, 1012, 12}));
}

// A call's wire Executes live while a worker's queue still holds its op,
// after the batch that brought them is gone, and no longer once every
// queue has written it: each worker's push holds one reference for the
// batch (OutOp::keep), not one per host.
TEST(GangSchedulerTest, AWireCallLivesUntilEveryQueueWroteIt) {
  GangScheduler scheduler({});
  absl::Notification go;
  auto gated = [&go](std::vector<OutOp>& ops) {
    go.WaitForNotification();
    for (const OutOp& op : ops) {
      // Read after the batch was dropped: ASan's use-after-free if nothing
      // kept it.
      if (op.call != nullptr)
        EXPECT_EQ(op.call->Execute(op.host).call_id(), 10u);
    }
    return true;
  };
  auto a = std::make_shared<WorkerQueue>(gated);
  auto b = std::make_shared<WorkerQueue>(gated);
  scheduler.AddWorker(1, a);
  scheduler.AddWorker(2, b);
  std::vector<GangUnit> batch;
  batch.push_back(WireCall(10, {1, 2}));
  batch.push_back(WireCall(10, {2}));
  std::weak_ptr<const CallExecutes> first = batch[0].executes;
  std::weak_ptr<const CallExecutes> second = batch[1].executes;
  scheduler.Submit(std::move(batch));
  EXPECT_FALSE(first.expired());
  EXPECT_FALSE(second.expired());
  go.Notify();
  scheduler.RemoveWorker(1)->Stop();  // written, and its writer gone
  scheduler.RemoveWorker(2)->Stop();
  EXPECT_TRUE(first.expired());
  EXPECT_TRUE(second.expired());
}

}  // namespace
}  // namespace plexus
