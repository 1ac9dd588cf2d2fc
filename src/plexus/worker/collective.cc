#include "plexus/worker/collective.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace plexus {
namespace {}  // namespace

CallCollective::CallCollective(uint64_t exchange_id, std::vector<Peer> peers,
                               int my_rank, ObjectStore* store, SendFn send,
                               int64_t ring_min_bytes)
    : exchange_id_(exchange_id),
      peers_(std::move(peers)),
      my_rank_(my_rank),
      store_(store),
      send_(std::move(send)),
      ring_min_bytes_(ring_min_bytes) {}

void CallCollective::ExpectPartials(int device, const TensorSpec& spec) {
  const int p = static_cast<int>(peers_.size());
  ring_ = p >= 3 && spec.byte_size() >= ring_min_bytes_;
  if (!ring_) {
    for (int r = 0; r < p; ++r) {
      if (r == my_rank_) continue;
      expected_.push_back({exchange_id_, r});
      store_->Declare(expected_.back(), device, spec, /*owned=*/false,
                      ObjectStore::Arrival::kFromPeer, peers_[r].worker_id);
    }
  } else {
    // Step s of the ring arrives under (exchange_id, s) from the previous
    // worker: one chunk of the value, as a 1-D array.
    const int prev = (my_rank_ + p - 1) % p;
    const int64_t n = spec.num_elements();
    for (int step = 0; step < 2 * (p - 1); ++step) {
      const int c = RecvChunk(step);
      TensorSpec chunk{spec.dtype, {ChunkBegin(c + 1, n) - ChunkBegin(c, n)}};
      expected_.push_back({exchange_id_, step});
      store_->Declare(expected_.back(), device, chunk, /*owned=*/false,
                      ObjectStore::Arrival::kFromPeer, peers_[prev].worker_id);
    }
  }
  // Just declared: known, so AddReader cannot fail.
  for (const BufferKey& key : expected_) store_->AddReader(key).IgnoreError();
}

void CallCollective::ReleasePartials() {
  for (const BufferKey& key : expected_) store_->RemoveReader(key);
}

int CallCollective::SendChunk(int step) const {
  const int p = static_cast<int>(peers_.size());
  const int s = step < p - 1 ? step : step - (p - 1);
  const int c = step < p - 1 ? my_rank_ - s : my_rank_ + 1 - s;
  return ((c % p) + p) % p;
}

int CallCollective::RecvChunk(int step) const {
  const int p = static_cast<int>(peers_.size());
  const int s = step < p - 1 ? step : step - (p - 1);
  const int c = step < p - 1 ? my_rank_ - s - 1 : my_rank_ - s;
  return ((c % p) + p) % p;
}

int64_t CallCollective::ChunkBegin(int c, int64_t n) const {
  const int64_t p = static_cast<int64_t>(peers_.size());
  // The first n % p chunks hold one element more.
  return c * (n / p) + std::min<int64_t>(c, n % p);
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
  return ring_ ? RingLocked(first.spec.dtype, n)
               : ExchangeAllLocked(first.spec.dtype, n);
}

absl::Status CallCollective::ExchangeAllLocked(DType dtype, int64_t n) {
  const size_t bytes = result_.size();
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
    AccumulateInto(dtype, total.data(), part, n);
  }
  result_ = std::move(total);
  return absl::OkStatus();
}

absl::Status CallCollective::RingLocked(DType dtype, int64_t n) {
  const int p = static_cast<int>(peers_.size());
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t next = peers_[(my_rank_ + 1) % p].worker_id;
  const int64_t prev = peers_[(my_rank_ + p - 1) % p].worker_id;
  char* data = result_.data();
  for (int step = 0; step < 2 * (p - 1); ++step) {
    // Send first (asynchronously): every worker does, so no step waits on a
    // worker that is itself waiting.
    const int out = SendChunk(step);
    const int64_t out_begin = ChunkBegin(out, n);
    const int64_t out_bytes = (ChunkBegin(out + 1, n) - out_begin) * elem;
    auto chunk = Storage::Allocate(out_bytes);
    if (!chunk.ok()) return chunk.status();
    if (out_bytes) {
      std::memcpy((*chunk)->data(), data + out_begin * elem, out_bytes);
    }
    send_(next, {exchange_id_, step},
          std::shared_ptr<const Storage>(std::move(*chunk)));
    ring_steps_sent_ = step + 1;

    const int in = RecvChunk(step);
    const int64_t in_begin = ChunkBegin(in, n);
    const int64_t in_len = ChunkBegin(in + 1, n) - in_begin;
    auto got = store_->AwaitReady({exchange_id_, step});
    if (!got.ok()) {
      return absl::Status(
          got.status().code(),
          absl::StrCat("all_reduce: ring step ", step, " from worker ", prev,
                       ": ", got.status().message()));
    }
    if (static_cast<int64_t>((*got)->size()) != in_len * elem) {
      return absl::InternalError(absl::StrCat(
          "all_reduce: ring step ", step, " from worker ", prev, " has ",
          (*got)->size(), " bytes, expected ", in_len * elem));
    }
    if (step < p - 1) {  // reduce-scatter: add the running sum
      AccumulateInto(dtype, data + in_begin * elem, (*got)->data(), in_len);
    } else if (in_len > 0) {  // all-gather: take the finished chunk
      std::memcpy(data + in_begin * elem, (*got)->data(), in_len * elem);
    }
  }
  return absl::OkStatus();
}

void CallCollective::ArriveLocked() {
  arrived_++;
  if (arrived_ < peers_[my_rank_].local_shards) return;
  status_ = abort_.ok() ? ReduceLocked() : abort_;
  // A failure reaches every worker still waiting on us: never a hang.
  const int p = static_cast<int>(peers_.size());
  if (!status_.ok() && ring_) {
    for (int step = ring_steps_sent_; step < 2 * (p - 1); ++step) {
      send_(peers_[(my_rank_ + 1) % p].worker_id, {exchange_id_, step},
            status_);
    }
  } else if (!status_.ok() && !sent_) {
    for (int r = 0; r < p; ++r) {
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
