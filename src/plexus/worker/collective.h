// CallCollective: the rendezvous of one collective call on one worker. Every
// local shard task of the call contributes; the last one sums the local
// contributions (shard order), combines that partial sum with the other
// workers' over the data plane and wakes the others:
//  - two workers, or a small value: each sends its partial to every other
//    and sums them all in rank order (one round trip);
//  - three workers or more and at least ring_min_bytes: a ring all-reduce
//    (reduce-scatter, then all-gather, P-1 steps each), so each worker sends
//    and receives 2(P-1)/P of the value whatever P is. Each chunk is summed
//    in a fixed ring order, so results are deterministic too.
// Where every worker runs NCCL (EnableNccl), the ranks first trade offers
// and may sum on the GPUs instead (worker/nccl_collective.h); the tasks
// then hand in their inputs as stored (AllReduceStored), device memory
// included, and get the output as a Storage.
// Shared by the call's tasks (shared_ptr: the last task to finish frees
// it). Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/worker/nccl_collective.h"

namespace plexus {

class CallCollective {
 public:
  struct Peer {
    int64_t worker_id;
    int32_t local_shards;
  };
  using SendFn =
      std::function<void(int64_t worker_id, const BufferKey& key,
                         absl::StatusOr<std::shared_ptr<const Storage>> data)>;

  // `exchange_id`: the buffer id under which ranks' partials travel (shard =
  // rank). `my_rank` indexes `peers`.
  static constexpr int64_t kRingMinBytes = 256 * 1024;

  CallCollective(uint64_t exchange_id, std::vector<Peer> peers, int my_rank,
                 ObjectStore* store, SendFn send,
                 int64_t ring_min_bytes = kRingMinBytes);

  // Offers first, and the NCCL path where the offers allow it (call before
  // ExpectPartials; every worker of the call does, as every worker's
  // CollectivePeer.nccl says). `timeout` bounds each NCCL wait. Where NCCL
  // sums, `event` (its ids: a transfer with path kNccl) is recorded on
  // `timeline` (not owned; may be null) around the sum.
  // `clock` (not owned) starts the timeout and times the waits between
  // polls of the GPUs.
  void EnableNccl(CollectiveGpus* nccl, absl::Duration timeout,
                  Timeline* timeline = nullptr, const TimelineEvent& event = {},
                  Clock* clock = Clock::Real());
  bool nccl_enabled() const { return nccl_ != nullptr; }

  // Declares the partials expected from other workers (call before any
  // task runs).
  void ExpectPartials(int device, const TensorSpec& spec);
  // Done with the exchange entries (the last local task calls it).
  void ReleasePartials();

  // Called once by each local shard task; blocks until the sum is known.
  absl::Status AllReduceSum(int shard, const builtin::ConstTensor& in,
                            const builtin::MutableTensor& out);
  // With EnableNccl: called once by each local shard task with its input
  // as stored (host or device memory); blocks until the sum is known and
  // returns it: a device buffer where NCCL ran, else host memory.
  absl::StatusOr<std::shared_ptr<Storage>> AllReduceStored(
      int shard, std::shared_ptr<const Storage> in, const TensorSpec& spec);
  // A local shard task failed before contributing: the whole collective
  // fails with `status`, here and on the other workers (never a hang).
  void Abort(int shard, const absl::Status& status);

 private:
  absl::Status ReduceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The offers, then NCCL (true: done, result in gpu_result_) or the host
  // path's inputs_ made from stored_ (false).
  absl::StatusOr<bool> ReduceOnGpusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every worker's partial to every other; result_ becomes the total.
  absl::Status ExchangeAllLocked(DType dtype, int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ring over result_ (this worker's partial) in place.
  absl::Status RingLocked(DType dtype, int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ring step s (0 .. 2(P-1)-1): the chunk this worker sends, and the one
  // it receives from the previous worker.
  int SendChunk(int step) const;
  int RecvChunk(int step) const;
  // Chunk c of n elements: [ChunkBegin(c), ChunkBegin(c + 1)).
  int64_t ChunkBegin(int c, int64_t n) const;
  // Counts an arrival; the last one reduces (or fails) and wakes the rest.
  void ArriveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t exchange_id_;
  const std::vector<Peer> peers_;
  const int my_rank_;
  ObjectStore* const store_;
  const SendFn send_;
  const int64_t ring_min_bytes_;
  bool ring_ = false;                // set by ExpectPartials
  std::vector<BufferKey> expected_;  // entries ExpectPartials declared
  CollectiveGpus* nccl_ = nullptr;   // set by EnableNccl
  absl::Duration nccl_timeout_;
  Clock* clock_ = Clock::Real();  // set by EnableNccl
  Timeline* timeline_ = nullptr;  // set by EnableNccl
  TimelineEvent nccl_event_;
  // A reason for the NCCL waits to give up: a peer's error or death, which
  // fails the watch entries (expected from each peer, sent only on error).
  // Shared with the store's callbacks on them.
  struct GiveUp {
    absl::Mutex mu;
    absl::CondVar changed;  // `status` is no longer OK
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<GiveUp> give_up_ = std::make_shared<GiveUp>();

  absl::Mutex mu_;
  std::map<int, builtin::ConstTensor> inputs_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;  // our partial went to the peers
  int ring_steps_sent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<char> result_ ABSL_GUARDED_BY(mu_);
  // AllReduceStored's inputs, their spec, and NCCL's output.
  std::map<int, std::shared_ptr<const Storage>> stored_ ABSL_GUARDED_BY(mu_);
  TensorSpec stored_spec_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const Storage>> host_copies_ ABSL_GUARDED_BY(mu_);
  bool offer_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Storage> gpu_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus

namespace plexus {
// The view of a CallCollective that one shard's kernel sees.
class ShardCollectives : public builtin::Collectives {
 public:
  ShardCollectives(CallCollective* call, int shard)
      : call_(call), shard_(shard) {}
  absl::Status AllReduceSum(const builtin::ConstTensor& in,
                            const builtin::MutableTensor& out) override {
    contributed_ = true;
    return call_->AllReduceSum(shard_, in, out);
  }
  bool contributed() const { return contributed_; }

 private:
  CallCollective* call_;
  int shard_;
  bool contributed_ = false;
};
}  // namespace plexus
