#include "plexus/server/scheduling/admission.h"

#include <algorithm>
#include <deque>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

// A call of `program` with one Execute on each of `workers`.
AdmissionUnit Call(uint64_t program, std::vector<int64_t> workers) {
  AdmissionUnit unit;
  unit.program_id = program;
  unit.exec_workers.assign(workers.begin(), workers.end());
  for (int64_t w : workers) {
    proto::WorkerOp op;
    op.mutable_execute()->set_program_id(program);
    unit.ops[w].push_back(op);
  }
  return unit;
}

AdmissionUnit Release(int64_t worker) {
  AdmissionUnit unit;
  unit.ops[worker].emplace_back().mutable_release()->add_buffer_ids(1);
  return unit;
}

struct Admitted {
  uint64_t client = 0;
  AdmissionUnit unit;
};

std::vector<Admitted> Drain(Admission& a) {
  std::vector<Admitted> out;
  Admitted next;
  while (a.Next(&next.client, &next.unit)) out.push_back(std::move(next));
  return out;
}

uint64_t TicketOn(const Admitted& a, int64_t worker) {
  return a.unit.ops.at(worker).back().execute().ticket();
}

proto::CallsDone Done(uint64_t client, uint64_t ticket, int64_t micros) {
  proto::CallsDone done;
  done.add_client_ids(client);
  done.add_tickets(ticket);
  done.add_busy_micros(micros);
  return done;
}

// A device that runs what was admitted to it, each call taking `micros`,
// and reports it done: the workers' side of the loop. It picks as a worker's
// TaskQueue does for independent tasks: among each client's oldest call, the
// lowest start tag.
class FakeDevices {
 public:
  explicit FakeDevices(Admission* a) : a_(a) {}
  void Admit(const Admitted& ad) {
    for (int64_t w : ad.unit.exec_workers) {
      const proto::Execute& e = ad.unit.ops.at(w).back().execute();
      queue_[w].push_back({ad.client, e.ticket(), e.start_tag()});
    }
  }
  // Finishes the next call on `worker`; returns its client.
  uint64_t FinishOne(int64_t worker, int64_t micros) {
    auto& q = queue_[worker];
    size_t best = 0;
    std::vector<uint64_t> seen;
    for (size_t i = 0; i < q.size(); ++i) {
      if (std::find(seen.begin(), seen.end(), q[i].client) != seen.end()) {
        continue;
      }
      seen.push_back(q[i].client);
      if (q[i].tag < q[best].tag) best = i;
    }
    const Queued next = q[best];
    q.erase(q.begin() + static_cast<std::ptrdiff_t>(best));
    a_->Completed(worker, Done(next.client, next.ticket, micros));
    return next.client;
  }
  size_t queued(int64_t worker) { return queue_[worker].size(); }

 private:
  struct Queued {
    uint64_t client;
    uint64_t ticket;
    double tag;
  };
  Admission* a_;
  std::map<int64_t, std::deque<Queued>> queue_;
};

TEST(AdmissionTest, DeviceTimeFollowsTheWeightsWhenEveryoneFloods) {
  Admission a({.window_micros = 1000, .min_window_calls = 2});
  a.AddWorker(1, 1);
  const std::map<uint64_t, double> weights = {{1, 1}, {2, 2}, {3, 4}, {4, 8}};
  for (auto [c, w] : weights) a.AddClient(c, w, 64);
  FakeDevices devices(&a);
  std::map<uint64_t, int64_t> busy;
  const int kCalls = 3000;
  for (int i = 0; i < kCalls; ++i) {
    // Every client always has work waiting.
    for (auto [c, w] : weights) {
      if (a.Find(c)->pending_calls < 4) a.Enqueue(c, Call(100 + c, {1}));
    }
    for (const Admitted& ad : Drain(a)) devices.Admit(ad);
    ASSERT_GT(devices.queued(1), 0u);
    busy[devices.FinishOne(1, 330)] += 330;
  }
  int64_t total = 0;
  for (auto [c, b] : busy) total += b;
  for (auto [c, w] : weights) {
    const double share = static_cast<double>(busy[c]) / total;
    EXPECT_NEAR(share, w / 15.0, 0.01) << "client " << c;
  }
  // The queue in front of the device stayed within the windows: each
  // client's 1000 µs (3 calls of 330 µs), all together twice that.
  EXPECT_LE(a.WorkerLoad(1).first, 6);
}

TEST(AdmissionTest, AClientsOwnUnitsKeepTheirOrder) {
  Admission a;
  a.AddWorker(1, 1);
  a.AddClient(7, 1, 64);
  a.Enqueue(7, Call(1, {1}));
  a.Enqueue(7, Release(1));
  a.Enqueue(7, Call(2, {1}));
  std::vector<Admitted> out = Drain(a);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].unit.program_id, 1u);
  EXPECT_FALSE(out[1].unit.is_call());
  EXPECT_EQ(out[2].unit.program_id, 2u);
  EXPECT_NE(TicketOn(out[0], 1), TicketOn(out[2], 1));
  EXPECT_NE(TicketOn(out[0], 1), 0u);
}

TEST(AdmissionTest, AFullWindowHoldsCallsUntilTheWorkerReports) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 2,
               .default_cost_micros = 400});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);
  for (int i = 0; i < 5; ++i) a.Enqueue(1, Call(9, {1}));
  // Two always fit; a third would make 1200 µs > 1000 µs.
  std::vector<Admitted> first = Drain(a);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(a.Find(1)->pending_calls, 3);
  a.Completed(1, Done(1, TicketOn(first[0], 1), 400));
  EXPECT_EQ(Drain(a).size(), 1u);
  EXPECT_EQ(a.Find(1)->in_flight, 2);
  EXPECT_EQ(a.Find(1)->device_micros, 400);
}

// Calls estimated at up to a quarter window go without a look at each of
// their windows while no window holds more than half a window: once one
// does, each is looked at again, and a call that does not fit waits.
TEST(AdmissionTest, SmallCallsFillAWideCallsWindowsNoFurtherThanTheyHold) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 100});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 1, 64);
  for (int i = 0; i < 12; ++i) a.Enqueue(1, Call(9, {1, 2}));
  // Ten fill the client's window on each worker (1000 µs); the eleventh
  // would make 1100.
  std::vector<Admitted> first = Drain(a);
  ASSERT_EQ(first.size(), 10u);
  EXPECT_EQ(a.WorkerLoad(1), std::make_pair(int64_t{10}, int64_t{1000}));
  // One call done on one worker only: the other is still full.
  a.Completed(1, Done(1, TicketOn(first[0], 1), 100));
  EXPECT_TRUE(Drain(a).empty());
  a.Completed(2, Done(1, TicketOn(first[0], 2), 100));
  EXPECT_EQ(Drain(a).size(), 1u);
  // Everything done: the windows are empty again and the last call goes.
  for (size_t i = 1; i < first.size(); ++i) {
    for (int64_t w : {1, 2}) {
      a.Completed(w, Done(1, TicketOn(first[i], w), 100));
    }
  }
  EXPECT_EQ(Drain(a).size(), 1u);
  EXPECT_EQ(a.Find(1)->pending_calls, 0);
}

TEST(AdmissionTest, ACallIsChargedItsEstimateOnEveryWorkerItRunsOn) {
  Admission a({.default_cost_micros = 100});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 1, 64);
  a.Enqueue(1, Call(9, {1, 2}));
  std::vector<Admitted> first = Drain(a);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].unit.charged_micros, 200);  // the default, twice
  proto::CallsDone done = Done(1, TicketOn(first[0], 1), 700);
  a.Completed(1, done);
  a.Completed(2, Done(1, TicketOn(first[0], 2), 700));
  a.Enqueue(1, Call(9, {1}));
  a.Enqueue(1, Release(1));
  std::vector<Admitted> next = Drain(a);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].unit.charged_micros, 700);  // the first report
  EXPECT_EQ(next[1].unit.charged_micros, 0);    // no call: no charge
}

TEST(AdmissionTest, AStalledWorkerStallsOnlyTheCallsThatNeedIt) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 500});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 8, 64);  // the heavier client: first in fair order
  a.AddClient(2, 1, 64);
  // Worker 1 never reports (SIGSTOPped): client 1's calls pile up there.
  for (int i = 0; i < 10; ++i) a.Enqueue(1, Call(5, {1}));
  EXPECT_EQ(Drain(a).size(), 2u);
  // Client 2, on worker 2 only, goes on however long worker 1 stalls.
  FakeDevices devices(&a);
  for (int i = 0; i < 100; ++i) {
    a.Enqueue(2, Call(6, {2}));
    std::vector<Admitted> out = Drain(a);
    ASSERT_EQ(out.size(), 1u) << "round " << i;
    EXPECT_EQ(out[0].client, 2u);
    devices.Admit(out[0]);
    devices.FinishOne(2, 500);
  }
}

TEST(AdmissionTest, AWideCallBlockedByAWindowReservesItsWorkers) {
  Admission a({.window_micros = 500,
               .min_window_calls = 1,
               .default_cost_micros = 600});
  for (int64_t w : {1, 2, 3}) a.AddWorker(w, 1);
  a.AddClient(1, 1, 64);
  a.AddClient(2, 1, 64);
  a.AddClient(3, 1, 64);
  // Worker 1 is busy with client 3's call.
  a.Enqueue(3, Call(30, {1}));
  std::vector<Admitted> busy = Drain(a);
  ASSERT_EQ(busy.size(), 1u);
  // Client 1 asks for workers 1 and 2 (blocked on 1); client 2 for worker
  // 2 alone and worker 3 alone.
  a.Enqueue(1, Call(10, {1, 2}));
  a.Enqueue(2, Call(20, {3}));
  a.Enqueue(2, Call(21, {2}));
  std::vector<Admitted> out = Drain(a);
  // Worker 3 is free and unreserved: client 2's first call goes; its
  // second needs worker 2, which the wide call waits for.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].unit.program_id, 20u);
  a.Completed(1, Done(3, TicketOn(busy[0], 1), 600));
  out = Drain(a);
  ASSERT_GE(out.size(), 1u);
  EXPECT_EQ(out[0].unit.program_id, 10u);
}

TEST(AdmissionTest, PendingCallSeqsAreTheCallsStillWaitingInOrder) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 2,
               .default_cost_micros = 400});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    AdmissionUnit call = Call(9, {1});
    call.call_seq = seq;
    a.Enqueue(1, std::move(call));
  }
  a.Enqueue(1, Release(1));  // not a call: not listed
  EXPECT_EQ(a.PendingCallSeqs(1), (std::vector<uint64_t>{1, 2, 3, 4}));
  // Two go (the window's minimum); the others still wait, in order.
  ASSERT_EQ(Drain(a).size(), 2u);
  EXPECT_EQ(a.PendingCallSeqs(1), (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(a.PendingCallSeqs(2).empty());  // an unknown client
}

TEST(AdmissionTest, TheWorkersNotDoneWithACallAreThoseYetToReport) {
  Admission a;
  for (int64_t w : {1, 2}) a.AddWorker(w, 1);
  a.AddClient(1, 1, 64);
  AdmissionUnit wide = Call(10, {1, 2});
  wide.call_seq = 7;
  a.Enqueue(1, std::move(wide));
  std::vector<Admitted> out = Drain(a);
  ASSERT_EQ(out.size(), 1u);
  using NotDone = absl::InlinedVector<int64_t, 4>;
  EXPECT_EQ(a.WorkersNotDone().at(7), (NotDone{1, 2}));
  a.Completed(2, Done(1, TicketOn(out[0], 2), 100));
  EXPECT_EQ(a.WorkersNotDone().at(7), (NotDone{1}));
  a.Completed(1, Done(1, TicketOn(out[0], 1), 100));
  EXPECT_FALSE(a.WorkersNotDone().contains(7));
}

TEST(AdmissionTest, TheCallsInFlightQuotaHoldsOnlyItsClient) {
  Admission a({.window_micros = 100000});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, /*max_calls_in_flight=*/2);
  a.AddClient(2, 1, 64);
  for (int i = 0; i < 5; ++i) a.Enqueue(1, Call(1, {1}));
  for (int i = 0; i < 5; ++i) a.Enqueue(2, Call(2, {1}));
  std::vector<Admitted> out = Drain(a);
  int of_one = 0;
  for (const Admitted& ad : out) of_one += ad.client == 1;
  EXPECT_EQ(of_one, 2);
  EXPECT_EQ(out.size(), 7u);
  EXPECT_EQ(a.Find(1)->pending_calls, 3);
  for (const Admitted& ad : out) {
    if (ad.client == 1) {
      a.Completed(1, Done(1, TicketOn(ad, 1), 10));
      break;
    }
  }
  out = Drain(a);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].client, 1u);
}

TEST(AdmissionTest, AFloodFillsOnlyItsOwnWindow) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 500});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);
  a.AddClient(2, 1, 64);
  for (int i = 0; i < 10; ++i) a.Enqueue(1, Call(1, {1}));
  EXPECT_EQ(Drain(a).size(), 2u);  // its own 1000 µs
  // Another client's call goes at once: the worker holds up to twice a
  // window, and a flood fills only its own.
  a.Enqueue(2, Call(2, {1}));
  std::vector<Admitted> out = Drain(a);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].client, 2u);
}

TEST(AdmissionTest, ALeavingClientFreesItsWindowAndDropsItsQueue) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 1000});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);
  a.AddClient(2, 1, 64);
  a.AddClient(3, 1, 64);
  for (int i = 0; i < 3; ++i) a.Enqueue(1, Call(1, {1}));
  for (int i = 0; i < 2; ++i) a.Enqueue(2, Call(2, {1}));
  EXPECT_EQ(Drain(a).size(), 2u);  // one each: the worker is full
  a.Enqueue(3, Call(3, {1}));
  EXPECT_TRUE(Drain(a).empty());
  EXPECT_EQ(a.RemoveClient(1), 2);
  EXPECT_EQ(a.Find(1), nullptr);
  std::vector<Admitted> out = Drain(a);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].client, 3u);
  // A late report of the gone client's call is ignored.
  a.Completed(1, Done(1, 1, 1000));
  EXPECT_EQ(a.WorkerLoad(1).first, 2);
}

TEST(AdmissionTest, ALostWorkerEndsItsCallsInFlight) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 1000});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 1, 2);
  a.Enqueue(1, Call(1, {1, 2}));
  a.Enqueue(1, Call(1, {1, 2}));
  a.Enqueue(1, Call(1, {1, 2}));
  EXPECT_EQ(Drain(a).size(), 1u);
  a.RemoveWorker(2);
  // Worker 2's share of the call is over; worker 1 still holds it.
  EXPECT_EQ(a.Find(1)->in_flight, 1);
  a.RemoveWorker(1);
  EXPECT_EQ(a.Find(1)->in_flight, 0);
  // Calls for gone workers go at once (their ops are dropped).
  EXPECT_EQ(Drain(a).size(), 2u);
}

TEST(AdmissionTest, IdlenessEarnsNoCredit) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 500});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);
  a.AddClient(2, 1, 64);
  FakeDevices devices(&a);
  // Client 1 runs alone for a long time.
  for (int i = 0; i < 200; ++i) {
    a.Enqueue(1, Call(1, {1}));
    for (const Admitted& ad : Drain(a)) devices.Admit(ad);
    devices.FinishOne(1, 500);
  }
  // Now both flood: they alternate instead of client 2 catching up on the
  // time it did not use.
  std::map<uint64_t, int> served;
  for (int i = 0; i < 100; ++i) {
    for (uint64_t c : {1, 2}) {
      if (a.Find(c)->pending_calls < 2) a.Enqueue(c, Call(c, {1}));
    }
    for (const Admitted& ad : Drain(a)) devices.Admit(ad);
    served[devices.FinishOne(1, 500)]++;
  }
  EXPECT_NEAR(served[1], 50, 3);
  EXPECT_NEAR(served[2], 50, 3);
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

TEST(AdmissionTest, AReturningClientsCallIsTaggedBeforeAFloodsQueuedCalls) {
  Admission a({.window_micros = 3000,
               .min_window_calls = 1,
               .default_cost_micros = 500});
  a.AddWorker(1, 1);
  a.AddClient(1, 1, 64);  // floods
  a.AddClient(2, 1, 64);  // comes and goes
  for (int i = 0; i < 10; ++i) a.Enqueue(1, Call(1, {1}));
  std::vector<Admitted> flood = Drain(a);
  ASSERT_EQ(flood.size(), 6u);  // 3000 µs of 500 µs calls
  auto tag = [](const Admitted& ad) {
    return ad.unit.ops.at(1).back().execute().start_tag();
  };
  // The first flood call runs; the others wait on the device with later
  // tags. The newcomer's tag is that of the call running, so the device
  // runs it next (worker/task_queue.h).
  a.Completed(1, Done(1, TicketOn(flood[0], 1), 500));
  a.Enqueue(2, Call(2, {1}));
  std::vector<Admitted> out = Drain(a);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0].client, 2u);
  EXPECT_LE(tag(out[0]), tag(flood[1]));
  EXPECT_LT(tag(out[0]), tag(flood[2]));
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

TEST(AdmissionTest, CallsWaitingForALostWorkerFailTheirOutputsAtOnce) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 1000});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 1, 64);
  auto call = [](uint64_t out) {
    AdmissionUnit unit = Call(7, {1, 2});
    for (auto& [w, list] : unit.ops) {
      list.back().mutable_execute()->add_output_ids(out);
      // A relayed call's failure is relayed too (FailBuffers.relay).
      list.back().mutable_execute()->set_relay(out == 11);
    }
    return unit;
  };
  for (uint64_t out : {10, 11, 12}) a.Enqueue(1, call(out));
  a.Enqueue(1, Call(8, {1}));      // does not need worker 2
  ASSERT_EQ(Drain(a).size(), 1u);  // the windows are full
  a.RemoveWorker(2);
  EXPECT_EQ(a.FailCallsOn(2, absl::UnavailableError("worker 2 is down")), 2);
  EXPECT_EQ(a.Find(1)->pending_calls, 1);
  // They go at once, in their place, as failures on worker 1 only.
  std::vector<Admitted> out = Drain(a);
  ASSERT_EQ(out.size(), 2u);
  for (const Admitted& ad : out) {
    EXPECT_FALSE(ad.unit.is_call());
    ASSERT_EQ(ad.unit.ops.count(2), 0u);
    const proto::WorkerOp& op = ad.unit.ops.at(1).back();
    ASSERT_TRUE(op.has_fail());
    EXPECT_EQ(op.fail().status().message(), "worker 2 is down");
  }
  EXPECT_EQ(out[0].unit.ops.at(1).back().fail().buffer_ids(0), 11u);
  EXPECT_EQ(out[1].unit.ops.at(1).back().fail().buffer_ids(0), 12u);
  EXPECT_TRUE(out[0].unit.ops.at(1).back().fail().relay());
  EXPECT_FALSE(out[1].unit.ops.at(1).back().fail().relay());
}

// A client whose slice lost a host: its waiting units are held apart
// (routed on the old map), neither admitted nor failed with the lost
// worker's calls, and given back in order, those of a second loss after
// the first's; a client that leaves drops them.
TEST(AdmissionTest, UnitsHeldForALossStayOutOfTheWayUntilTaken) {
  Admission a({.window_micros = 1000,
               .min_window_calls = 1,
               .default_cost_micros = 1000});
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddClient(1, 1, 64);
  a.AddClient(2, 1, 64);
  for (uint64_t seq : {1, 2, 3}) {
    AdmissionUnit unit = Call(7, {1, 2});
    unit.call_seq = seq;
    a.Enqueue(1, std::move(unit));
  }
  ASSERT_EQ(Drain(a).size(), 1u);  // seq 1; the windows are full
  a.Hold(1);
  EXPECT_EQ(a.Find(1)->pending_calls, 0);
  EXPECT_EQ(a.Find(1)->held_units, 2);
  EXPECT_TRUE(a.PendingCallSeqs(1).empty());
  a.RemoveWorker(2);
  EXPECT_EQ(a.FailCallsOn(2, absl::UnavailableError("down")), 0);
  AdmissionUnit later = Call(7, {1});
  later.call_seq = 4;
  a.Enqueue(1, std::move(later));
  a.Hold(1);  // a second loss before the first is settled
  EXPECT_EQ(a.Find(1)->held_units, 3);
  EXPECT_TRUE(Drain(a).empty());
  std::vector<AdmissionUnit> held = a.TakeHeld(1);
  ASSERT_EQ(held.size(), 3u);
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(held[i].call_seq, i + 2);
  }
  EXPECT_EQ(a.Find(1)->held_units, 0);
  EXPECT_TRUE(a.TakeHeld(1).empty());

  a.Enqueue(2, Call(7, {1}));
  a.Hold(2);
  EXPECT_EQ(a.RemoveClient(2), 1);  // held units are dropped with it
  EXPECT_TRUE(a.TakeHeld(2).empty());
}

// A call over `workers` in wire form (its Executes encoded once).
AdmissionUnit WireCall(uint64_t program, uint64_t output,
                       const std::vector<int64_t>& workers,
                       uint64_t call_seq = 7) {
  proto::Execute shared;
  shared.set_program_id(program);
  shared.add_output_ids(output);
  auto executes = std::make_shared<CallExecutes>(shared);
  proto::ShardTask task;
  for (int64_t w : workers) executes->AddHost(w, {&task});
  return MakeAdmissionUnit({}, call_seq, std::move(executes));
}

// Over 70 workers (more than a word of done bits), with a second call over
// the same workers (which shares the first's worker list) ending apart.
TEST(AdmissionTest, AWideCallEndsWithItsLastWorkersReportInAnyOrder) {
  Admission a;
  a.AddClient(1, 1, 100);
  std::vector<int64_t> workers;
  for (int64_t w = 70; w >= 1; --w) workers.push_back(w);  // not sorted
  for (int64_t w : workers) a.AddWorker(w, 1);
  a.Enqueue(1, WireCall(5, 99, workers, /*call_seq=*/5));
  a.Enqueue(1, WireCall(5, 100, workers, /*call_seq=*/6));
  std::vector<Admitted> admitted = Drain(a);
  ASSERT_EQ(admitted.size(), 2u);
  // One ticket for the call, stamped once for every host.
  const CallExecutes& executes = *admitted[0].unit.executes;
  const uint64_t ticket = executes.ticket();
  ASSERT_NE(ticket, 0u);
  EXPECT_EQ(executes.Execute(0).ticket(), ticket);
  EXPECT_EQ(executes.Execute(69).ticket(), ticket);
  const uint64_t second = admitted[1].unit.executes->ticket();
  for (int64_t w = 1; w <= 69; ++w) {
    a.Completed(w, Done(1, ticket, 10));
    a.Completed(w, Done(1, ticket, 10));  // told twice: counted once
  }
  a.Completed(70, Done(1, second, 10));
  EXPECT_FALSE(a.has_done_calls());
  using NotDone = absl::InlinedVector<int64_t, 4>;
  EXPECT_EQ(a.WorkersNotDone().at(5), (NotDone{70}));
  EXPECT_EQ(a.WorkersNotDone().at(6).size(), 69u);
  a.Completed(70, Done(1, ticket, 10));
  EXPECT_EQ(a.TakeDoneCalls(),
            (std::vector<std::pair<uint64_t, bool>>{{5, false}}));
  EXPECT_EQ(a.Find(1)->in_flight, 1);
  for (int64_t w = 1; w <= 69; ++w) a.Completed(w, Done(1, second, 10));
  EXPECT_EQ(a.TakeDoneCalls(),
            (std::vector<std::pair<uint64_t, bool>>{{6, false}}));
  EXPECT_EQ(a.Find(1)->in_flight, 0);
}

// A call still in flight after 70,000 later calls came and went (a host
// stalled while the others ran): it leaves the ring of recent tickets
// (TicketTable, 65,536) and is still found by its reports, listed by
// WorkersNotDone, ended by its last report, and by a lost worker.
TEST(AdmissionTest, ACallInFlightLongAfterLaterOnesIsStillFound) {
  Admission a({.window_micros = 1000000});
  for (int64_t w : {1, 2, 3}) a.AddWorker(w, 1);
  a.AddClient(1, 1, /*max_calls_in_flight=*/1 << 20);
  AdmissionUnit slow = Call(10, {1, 2});
  slow.call_seq = 7;
  a.Enqueue(1, std::move(slow));
  AdmissionUnit lost = Call(10, {3, 2});
  lost.call_seq = 8;
  a.Enqueue(1, std::move(lost));
  std::vector<Admitted> first = Drain(a);
  ASSERT_EQ(first.size(), 2u);
  a.Completed(2, Done(1, TicketOn(first[0], 2), 10));  // its fast host
  for (int i = 0; i < 70000; ++i) {  // later calls on worker 2, each done
    a.Enqueue(1, Call(11, {2}));
    std::vector<Admitted> one = Drain(a);
    ASSERT_EQ(one.size(), 1u) << i;
    a.Completed(2, Done(1, TicketOn(one[0], 2), 10));
  }
  EXPECT_EQ(a.Find(1)->in_flight, 2);
  using NotDone = absl::InlinedVector<int64_t, 4>;
  EXPECT_EQ(a.WorkersNotDone().at(7), (NotDone{1}));
  EXPECT_EQ(a.WorkersNotDone().at(8), (NotDone{2, 3}));
  a.TakeDoneCalls();
  a.Completed(1, Done(1, TicketOn(first[0], 1), 10));
  EXPECT_EQ(a.TakeDoneCalls(),
            (std::vector<std::pair<uint64_t, bool>>{{7, false}}));
  a.Completed(2, Done(1, TicketOn(first[1], 2), 10));
  a.RemoveWorker(3);  // the other straggler's last host: cut short
  EXPECT_EQ(a.Find(1)->in_flight, 0);
  EXPECT_TRUE(a.WorkersNotDone().empty());
  EXPECT_FALSE(a.has_done_calls());
}

TEST(AdmissionTest, AWaitingWideCallOnALostWorkerFailsItsOutputsElsewhere) {
  Admission a;
  a.AddClient(1, 1, 1);
  a.AddWorker(1, 1);
  a.AddWorker(2, 1);
  a.AddWorker(3, 1);
  a.Enqueue(1, WireCall(5, 98, {1, 2}));  // fills the client's quota
  a.Enqueue(1, WireCall(5, 99, {1, 2, 3}));
  ASSERT_EQ(Drain(a).size(), 1u);
  EXPECT_EQ(a.FailCallsOn(3, absl::UnavailableError("lost")), 1);
  a.RemoveWorker(3);
  a.RemoveWorker(1);  // frees the quota
  a.RemoveWorker(2);
  std::vector<Admitted> rest = Drain(a);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].unit.executes, nullptr);
  for (int64_t w : {1, 2}) {
    const auto& ops = rest[0].unit.ops.at(w);
    ASSERT_EQ(ops.size(), 1u);
    EXPECT_EQ(ops[0].fail().buffer_ids(0), 99u);
  }
  EXPECT_EQ(rest[0].unit.ops.count(3), 0u);
}

}  // namespace
}  // namespace plexus
