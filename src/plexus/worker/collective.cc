#include "plexus/worker/collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus {
namespace {}  // namespace

CallCollective::CallCollective(uint64_t exchange_id, std::vector<Peer> peers,
                               int my_rank, ObjectStore* store, SendFn send)
    : exchange_id_(exchange_id),
      peers_(std::move(peers)),
      my_rank_(my_rank),
      store_(store),
      send_(std::move(send)) {}

void CallCollective::ExpectPartials(int device, const TensorSpec& spec) {
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == my_rank_) continue;
    BufferKey key{exchange_id_, r};
    store_->Declare(key, device, spec, /*owned=*/false, peers_[r].worker_id);
    store_->AddReader(key);
  }
}

void CallCollective::ReleasePartials() {
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r != my_rank_) store_->RemoveReader({exchange_id_, r});
  }
}

absl::Status CallCollective::ReduceLocked() {
  if (inputs_.empty()) return absl::InternalError("all_reduce: no inputs");
  const builtin::ConstTensor& first = inputs_.begin()->second;
  const int64_t n = first.spec.num_elements();
  const size_t bytes = first.spec.byte_size();
  result_.assign(bytes, 0);
  for (auto& [shard, t] : inputs_) {
    if (t.spec != first.spec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all_reduce: shard ", shard, " has ", t.spec.ToString(), ", shard ",
          inputs_.begin()->first, " has ", first.spec.ToString()));
    }
    AccumulateInto(first.spec.dtype, result_.data(), t.data, n);
  }
  if (peers_.size() <= 1) return absl::OkStatus();

  // Share this worker's partial with every other worker, then add theirs in
  // rank order.
  auto mine = Storage::Allocate(bytes);
  if (!mine.ok()) return mine.status();
  if (bytes) std::memcpy((*mine)->data(), result_.data(), bytes);
  std::shared_ptr<const Storage> shared = std::move(*mine);
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r != my_rank_) {
      send_(peers_[r].worker_id, {exchange_id_, my_rank_}, shared);
    }
  }
  sent_ = true;
  std::vector<char> total(bytes, 0);
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    const void* part = shared->data();
    std::shared_ptr<const Storage> theirs;
    if (r != my_rank_) {
      auto got = store_->AwaitReady({exchange_id_, r});
      if (!got.ok()) {
        return absl::Status(
            got.status().code(),
            absl::StrCat("all_reduce: partial from worker ",
                         peers_[r].worker_id, ": ", got.status().message()));
      }
      theirs = *got;
      if (theirs->size() != bytes) {
        return absl::InternalError(absl::StrCat(
            "all_reduce: partial from worker ", peers_[r].worker_id, " has ",
            theirs->size(), " bytes, expected ", bytes));
      }
      part = theirs->data();
    }
    AccumulateInto(first.spec.dtype, total.data(), part, n);
  }
  result_ = std::move(total);
  return absl::OkStatus();
}

void CallCollective::ArriveLocked() {
  arrived_++;
  if (arrived_ < peers_[my_rank_].local_shards) return;
  status_ = abort_.ok() ? ReduceLocked() : abort_;
  if (!status_.ok() && !sent_) {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r != my_rank_) {
        send_(peers_[r].worker_id, {exchange_id_, my_rank_}, status_);
      }
    }
  }
  done_ = true;
}

void CallCollective::Abort(int shard, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (abort_.ok()) abort_ = status;
  ArriveLocked();
}

absl::Status CallCollective::AllReduceSum(int shard,
                                          const builtin::ConstTensor& in,
                                          const builtin::MutableTensor& out) {
  absl::MutexLock lock(&mu_);
  inputs_[shard] = in;
  ArriveLocked();
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  mu_.Await(absl::Condition(&finished));
  if (!status_.ok()) return status_;
  if (out.spec.byte_size() != static_cast<int64_t>(result_.size())) {
    return absl::InternalError("all_reduce: output size mismatch");
  }
  if (!result_.empty()) std::memcpy(out.data, result_.data(), result_.size());
  return absl::OkStatus();
}

}  // namespace plexus
