// CallCollective: the rendezvous of one collective call on one worker. Every
// local shard task of the call contributes; the last one sums the local
// contributions (shard order), exchanges that partial sum with the other
// workers of the call over the data plane, sums the partials in rank order
// and wakes the others. Shared by the call's tasks (shared_ptr: the last
// task to finish frees it). Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/store/object_store.h"

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
  CallCollective(uint64_t exchange_id, std::vector<Peer> peers, int my_rank,
                 ObjectStore* store, SendFn send);

  // Declares the partials expected from other workers (call before any
  // task runs).
  void ExpectPartials(int device, const TensorSpec& spec);
  // Done with the exchange entries (the last local task calls it).
  void ReleasePartials();

  // Called once by each local shard task; blocks until the sum is known.
  absl::Status AllReduceSum(int shard, const builtin::ConstTensor& in,
                            const builtin::MutableTensor& out);
  // A local shard task failed before contributing: the whole collective
  // fails with `status`, here and on the other workers (never a hang).
  void Abort(int shard, const absl::Status& status);

 private:
  absl::Status ReduceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts an arrival; the last one reduces (or fails) and wakes the rest.
  void ArriveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t exchange_id_;
  const std::vector<Peer> peers_;
  const int my_rank_;
  ObjectStore* const store_;
  const SendFn send_;

  absl::Mutex mu_;
  std::map<int, builtin::ConstTensor> inputs_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;  // our partial went to the peers
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<char> result_ ABSL_GUARDED_BY(mu_);
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
