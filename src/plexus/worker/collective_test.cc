// CallCollective across several "workers" in one process: each has its own
// object store, and what one sends lands in the receiver's store, as the
// data plane would deliver it. Both algorithms (every partial to every
// worker; the ring) give the exact sum for every chunk layout, and a
// failure on one worker fails all of them instead of hanging.
#include "plexus/worker/collective.h"

#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

struct Cluster {
  // `p` workers (ids 0..p-1, one local shard each) reducing int32[n].
  Cluster(int p, int64_t n, int64_t ring_min_bytes) : p(p), n(n) {
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
      calls[w]->ExpectPartials(0, TensorSpec{DType::kI32, {n}});
    }
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

}  // namespace
}  // namespace plexus
