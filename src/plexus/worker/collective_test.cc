// CallCollective across several "workers" in one process: each has its own
// object store, and what one sends lands in the receiver's store, as the
// data plane would deliver it. Both algorithms (every partial to every
// worker; the ring) give the exact sum for every chunk layout, and a
// failure on one worker fails all of them instead of hanging.
#include "plexus/worker/collective.h"

#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

struct Cluster {
  // `p` workers (ids 0..p-1, one local shard each) reducing int32[n].
  // `gpus[w]`, where given: worker w runs NCCL (CallCollective::EnableNccl)
  // with these GPUs.
  Cluster(int p, int64_t n, int64_t ring_min_bytes,
          std::vector<CollectiveGpus*> gpus = {})
      : p(p), n(n) {
    for (int w = 0; w < p; ++w) {
      ObjectStore::Options o;
      o.device_memory = {int64_t{1} << 30};
      o.unknown_key_timeout = absl::Seconds(5);
      stores.push_back(std::make_unique<ObjectStore>(o));
    }
    std::vector<CallCollective::Peer> peers;
    for (int w = 0; w < p; ++w) peers.push_back({w, 1});
    for (int w = 0; w < p; ++w) {
      calls.push_back(std::make_unique<CallCollective>(
          /*exchange_id=*/77, peers, /*my_rank=*/w, stores[w].get(),
          [this](int64_t to, const BufferKey& key,
                 absl::StatusOr<std::shared_ptr<const Storage>> data) {
            if (data.ok()) {
              stores[to]->Fulfil(key, std::const_pointer_cast<Storage>(*data),
                                 0, /*reserved=*/false);
            } else {
              stores[to]->Fail(key, data.status());
            }
          },
          ring_min_bytes));
      timelines.push_back(std::make_unique<Timeline>());
      if (!gpus.empty()) {
        TimelineEvent ids;  // as the worker fills it (task_runner.cc)
        ids.client_id = 5;
        ids.call_id = 9;
        ids.peer = w;
        ids.device = 0;
        ids.shard = w;
        calls[w]->EnableNccl(gpus[w], absl::Seconds(30), timelines[w].get(),
                             ids);
      }
      calls[w]->ExpectPartials(0, TensorSpec{DType::kI32, {n}});
    }
  }

  // Each worker's timeline, where the NCCL path records its sums.
  std::vector<std::unique_ptr<Timeline>> timelines;

  // As Run, through AllReduceStored (the tasks' entry with EnableNccl):
  // inputs and outputs are Storage.
  std::vector<absl::Status> RunStored(std::vector<std::vector<int32_t>>* outs) {
    outs->assign(p, std::vector<int32_t>(n, -1));
    std::vector<absl::Status> status(p);
    std::vector<std::thread> threads;
    for (int w = 0; w < p; ++w) {
      threads.emplace_back([&, w] {
        const TensorSpec spec{DType::kI32, {n}};
        std::shared_ptr<Storage> in = *Storage::Allocate(spec.byte_size());
        auto* data = static_cast<int32_t*>(in->data());
        for (int64_t i = 0; i < n; ++i) data[i] = w * 1000 + i;
        auto out = calls[w]->AllReduceStored(0, in, spec);
        status[w] = out.status();
        if (out.ok()) {
          std::memcpy((*outs)[w].data(), (*out)->data(), spec.byte_size());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& c : calls) c->ReleasePartials();
    return status;
  }

  // Worker w contributes w * 1000 + i at element i; `fail` aborts instead.
  std::vector<absl::Status> Run(std::vector<std::vector<int32_t>>* outs,
                                int fail = -1) {
    std::vector<std::vector<int32_t>> ins(p, std::vector<int32_t>(n));
    outs->assign(p, std::vector<int32_t>(n, -1));
    std::vector<absl::Status> status(p);
    std::vector<std::thread> threads;
    for (int w = 0; w < p; ++w) {
      for (int64_t i = 0; i < n; ++i) ins[w][i] = w * 1000 + i;
      threads.emplace_back([&, w] {
        if (w == fail) {
          calls[w]->Abort(0, absl::DataLossError("worker broke"));
          status[w] = absl::DataLossError("worker broke");
          return;
        }
        const TensorSpec spec{DType::kI32, {n}};
        status[w] = calls[w]->AllReduceSum(0, {spec, ins[w].data()},
                                           {spec, (*outs)[w].data()});
      });
    }
    for (auto& t : threads) t.join();
    for (auto& c : calls) c->ReleasePartials();
    return status;
  }

  int p;
  int64_t n;
  std::vector<std::unique_ptr<ObjectStore>> stores;
  std::vector<std::unique_ptr<CallCollective>> calls;
};

void ExpectSum(int p, int64_t n, const std::vector<std::vector<int32_t>>& outs,
               const std::vector<absl::Status>& status) {
  for (int w = 0; w < p; ++w) {
    ASSERT_TRUE(status[w].ok()) << "worker " << w << ": " << status[w];
    for (int64_t i = 0; i < n; ++i) {
      // sum over workers of (w * 1000 + i)
      const int32_t want = 1000 * p * (p - 1) / 2 + p * i;
      ASSERT_EQ(outs[w][i], want) << "worker " << w << " element " << i;
    }
  }
}

TEST(CallCollectiveTest, RingSumsEveryChunkLayout) {
  // n % p == 0, uneven chunks, and fewer elements than workers (empty
  // chunks).
  for (int p : {3, 4, 5}) {
    for (int64_t n : {int64_t{p} * 4, int64_t{p} * 4 + 3, int64_t{2}}) {
      Cluster c(p, n, /*ring_min_bytes=*/0);
      std::vector<std::vector<int32_t>> outs;
      auto status = c.Run(&outs);
      ExpectSum(p, n, outs, status);
    }
  }
}

TEST(CallCollectiveTest, SmallValuesAndTwoWorkersExchangeWithEveryone) {
  for (int p : {2, 3}) {
    Cluster c(p, 10, /*ring_min_bytes=*/1 << 20);
    std::vector<std::vector<int32_t>> outs;
    auto status = c.Run(&outs);
    ExpectSum(p, 10, outs, status);
  }
}

TEST(CallCollectiveTest, AFailedWorkerFailsTheWholeRing) {
  for (int fail = 0; fail < 4; ++fail) {
    Cluster c(4, 64, /*ring_min_bytes=*/0);
    std::vector<std::vector<int32_t>> outs;
    auto status = c.Run(&outs, fail);
    for (int w = 0; w < 4; ++w) {
      EXPECT_FALSE(status[w].ok())
          << "worker " << w << " (failed: " << fail << ")";
      EXPECT_NE(status[w].message().find("worker broke"), std::string::npos)
          << status[w];
    }
  }
}

// The GPUs of one rank, as CallCollective sees them: offer what the test
// says; on the NCCL path, note what was chosen and rank 0's unique id as
// it arrived, then hand the input back, fail, or wait until told to give
// up (a peer's error or death).
class TestGpus : public CollectiveGpus {
 public:
  enum class Then { kInput, kFail, kWaitToGiveUp };
  TestGpus(RankOffer offer, Then then)
      : offer_(std::move(offer)), then_(then) {}

  RankOffer Offer(const std::vector<int64_t>&, int, const Storage&,
                  const TensorSpec&) override {
    return offer_;
  }
  absl::StatusOr<std::shared_ptr<Storage>> AllReduce(
      const std::vector<int64_t>&, int, const std::vector<RankOffer>& offers,
      const PathChoice& choice, const Storage& in, const TensorSpec& spec,
      absl::Time deadline, const cuda::NcclApi::GiveUpFn& give_up,
      const std::string&) override {
    chosen = choice;
    rank0_id = offers[0].unique_id;
    switch (then_) {
      case Then::kInput: {
        auto out = Storage::Allocate(spec.byte_size());
        if (out.ok()) std::memcpy((*out)->data(), in.data(), spec.byte_size());
        return out;
      }
      case Then::kFail:
        return absl::DataLossError("the GPU broke");
      case Then::kWaitToGiveUp:
        for (;;) {
          if (absl::Status s = give_up(absl::Milliseconds(50)); !s.ok()) {
            return s;
          }
          if (absl::Now() > deadline) {
            return absl::DeadlineExceededError("never told to give up");
          }
        }
    }
    return absl::InternalError("unreachable");
  }

  std::optional<PathChoice> chosen;
  cuda::NcclUniqueId rank0_id;

 private:
  const RankOffer offer_;
  const Then then_;
};

RankOffer OnGpu(int w) {
  RankOffer o;
  o.on_gpu = true;
  o.gpu = absl::StrCat("gpu-of-worker-", w);
  if (w == 0) {
    o.has_unique_id = true;
    for (size_t i = 0; i < o.unique_id.bytes.size(); ++i) {
      o.unique_id.bytes[i] = static_cast<char>(i + 1);
    }
  }
  return o;
}

// Host values on workers that run NCCL: the offers say so, every rank
// takes the host path, and the sum is the host path's (both algorithms).
TEST(CallCollectiveNcclTest, HostValuesTakeTheHostPathAfterTheOffers) {
  for (int p : {2, 3}) {
    for (int64_t ring_min : {int64_t{0}, int64_t{1} << 20}) {
      std::vector<std::unique_ptr<TestGpus>> gpus;
      std::vector<CollectiveGpus*> raw;
      for (int w = 0; w < p; ++w) {
        RankOffer host;
        host.why_not = "a value in host memory";
        gpus.push_back(std::make_unique<TestGpus>(host, TestGpus::Then::kFail));
        raw.push_back(gpus.back().get());
      }
      Cluster c(p, 40, ring_min, raw);
      std::vector<std::vector<int32_t>> outs;
      auto status = c.RunStored(&outs);
      ExpectSum(p, 40, outs, status);
      for (auto& g : gpus) EXPECT_FALSE(g->chosen.has_value());
    }
  }
}

// One rank per GPU, each GPU its own (OnGpu(w)), handing back its input.
struct DistinctGpus {
  explicit DistinctGpus(int p) {
    for (int w = 0; w < p; ++w) {
      owned.push_back(
          std::make_unique<TestGpus>(OnGpu(w), TestGpus::Then::kInput));
      raw.push_back(owned.back().get());
    }
  }
  std::vector<std::unique_ptr<TestGpus>> owned;
  std::vector<CollectiveGpus*> raw;
};

// Ranks on distinct GPUs choose NCCL, each with rank 0's unique id as it
// travelled in rank 0's offer over the (in-process) data plane.
TEST(CallCollectiveNcclTest, RankZerosUniqueIdReachesEveryRank) {
  const int p = 3;
  DistinctGpus gpus(p);
  Cluster c(p, 8, /*ring_min_bytes=*/0, gpus.raw);
  std::vector<std::vector<int32_t>> outs;
  auto status = c.RunStored(&outs);
  for (int w = 0; w < p; ++w) {
    ASSERT_TRUE(status[w].ok()) << status[w];
    ASSERT_TRUE(gpus.owned[w]->chosen.has_value()) << "worker " << w;
    EXPECT_TRUE(gpus.owned[w]->chosen->nccl);
    EXPECT_TRUE(gpus.owned[w]->chosen->new_communicator);
    EXPECT_EQ(gpus.owned[w]->rank0_id.bytes, OnGpu(0).unique_id.bytes);
    EXPECT_EQ(outs[w][1], w * 1000 + 1);  // what TestGpus handed back
  }
}

// Each rank's sum by NCCL is one transfer on its worker's timeline, with
// the path, the call's ids and the shard's bytes; the host path records
// none there (its partials are the data plane's transfers).
TEST(CallCollectiveNcclTest, EachNcclSumIsATransferOnTheTimeline) {
  const int p = 2;
  DistinctGpus gpus(p);
  Cluster c(p, 8, /*ring_min_bytes=*/0, gpus.raw);
  std::vector<std::vector<int32_t>> outs;
  auto status = c.RunStored(&outs);
  for (int w = 0; w < p; ++w) {
    ASSERT_TRUE(status[w].ok()) << status[w];
    std::vector<TimelineEvent> events = c.timelines[w]->Since(0);
    ASSERT_EQ(events.size(), 1u) << "worker " << w;
    const TimelineEvent& e = events[0];
    EXPECT_EQ(e.kind, EventKind::kTransfer);
    EXPECT_EQ(e.path, TransferPath::kNccl);
    EXPECT_EQ(e.client_id, 5u);
    EXPECT_EQ(e.call_id, 9u);
    EXPECT_EQ(e.peer, w);
    EXPECT_EQ(e.shard, w);
    EXPECT_EQ(e.bytes, 8 * 4);
    EXPECT_FALSE(e.failed);
    EXPECT_LE(e.start_ns, e.end_ns);
  }

  RankOffer host;
  host.why_not = "a value in host memory";
  TestGpus h0(host, TestGpus::Then::kFail), h1(host, TestGpus::Then::kFail);
  Cluster on_hosts(p, 8, /*ring_min_bytes=*/0, {&h0, &h1});
  auto host_status = on_hosts.RunStored(&outs);
  ExpectSum(p, 8, outs, host_status);
  for (int w = 0; w < p; ++w) {
    EXPECT_TRUE(on_hosts.timelines[w]->Since(0).empty());
  }
}

TEST(CallCollectiveNcclTest, TwoRanksOnOneGpuTakeTheHostPath) {
  std::vector<std::unique_ptr<TestGpus>> gpus;
  std::vector<CollectiveGpus*> raw;
  for (int w = 0; w < 2; ++w) {
    RankOffer o = OnGpu(0);  // both on worker 0's GPU
    o.has_unique_id = w == 0;
    gpus.push_back(std::make_unique<TestGpus>(o, TestGpus::Then::kFail));
    raw.push_back(gpus.back().get());
  }
  Cluster c(2, 16, /*ring_min_bytes=*/1 << 20, raw);
  std::vector<std::vector<int32_t>> outs;
  auto status = c.RunStored(&outs);
  ExpectSum(2, 16, outs, status);
  for (auto& g : gpus) EXPECT_FALSE(g->chosen.has_value());
}

// A rank whose NCCL call fails tells the others, which are inside NCCL
// with it: they give up with its error instead of waiting for the deadline.
TEST(CallCollectiveNcclTest, ARankThatFailsOnItsGpuEndsTheOthersWait) {
  const int p = 3;
  std::vector<std::unique_ptr<TestGpus>> gpus;
  std::vector<CollectiveGpus*> raw;
  for (int w = 0; w < p; ++w) {
    gpus.push_back(std::make_unique<TestGpus>(
        OnGpu(w),
        w == 1 ? TestGpus::Then::kFail : TestGpus::Then::kWaitToGiveUp));
    raw.push_back(gpus.back().get());
  }
  Cluster c(p, 8, /*ring_min_bytes=*/0, raw);
  std::vector<std::vector<int32_t>> outs;
  auto status = c.RunStored(&outs);
  for (int w = 0; w < p; ++w) {
    EXPECT_FALSE(status[w].ok()) << "worker " << w;
    EXPECT_THAT(std::string(status[w].message()),
                testing::HasSubstr("the GPU broke"))
        << "worker " << w << ": " << status[w];
  }
}

// A peer that dies while the others are inside NCCL (the worker's
// PeerDown fails what is expected from it): they give up at once.
TEST(CallCollectiveNcclTest, APeersDeathEndsTheWaitOnTheGpus) {
  const int p = 2;
  std::vector<std::unique_ptr<TestGpus>> gpus;
  std::vector<CollectiveGpus*> raw;
  for (int w = 0; w < p; ++w) {
    gpus.push_back(
        std::make_unique<TestGpus>(OnGpu(w), TestGpus::Then::kWaitToGiveUp));
    raw.push_back(gpus.back().get());
  }
  Cluster c(p, 8, /*ring_min_bytes=*/0, raw);
  std::vector<std::vector<int32_t>> outs(p, std::vector<int32_t>(8));
  absl::StatusOr<std::shared_ptr<Storage>> out0;
  std::thread rank0([&] {
    const TensorSpec spec{DType::kI32, {8}};
    out0 = c.calls[0]->AllReduceStored(0, *Storage::Allocate(32), spec);
  });
  // Worker 1 sends its offer (as its collective would), then dies.
  RankOffer offer1 = OnGpu(1);
  const std::string wire = offer1.Encode();
  std::shared_ptr<Storage> bytes = *Storage::Allocate(wire.size());
  std::memcpy(bytes->data(), wire.data(), wire.size());
  c.stores[0]->Fulfil({77, (1 << 24) + 1}, bytes, 0, /*reserved=*/false);
  c.stores[0]->FailFromSource(1, absl::UnavailableError("worker 1 is down"));
  rank0.join();
  ASSERT_FALSE(out0.ok());
  EXPECT_THAT(std::string(out0.status().message()),
              testing::HasSubstr("worker 1 is down"));
  c.calls[0]->ReleasePartials();
  c.calls[1]->Abort(0, absl::CancelledError("never ran"));
  c.calls[1]->ReleasePartials();
}

}  // namespace
}  // namespace plexus
