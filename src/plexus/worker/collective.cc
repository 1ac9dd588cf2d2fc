#include "plexus/worker/collective.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"

namespace plexus {
namespace {

// With EnableNccl, beside the partials: rank r's offer arrives under
// (exchange_id, kOfferShard + r); (exchange_id, kWatchShard + r) carries
// only rank r's error, or fails when r is down.
constexpr int kOfferShard = 1 << 24;
constexpr int kWatchShard = 1 << 25;

}  // namespace

CallCollective::CallCollective(uint64_t exchange_id, std::vector<Peer> peers,
                               int my_rank, ObjectStore* store, SendFn send,
                               int64_t ring_min_bytes)
    : exchange_id_(exchange_id),
      peers_(std::move(peers)),
      my_rank_(my_rank),
      store_(store),
      send_(std::move(send)),
      ring_min_bytes_(ring_min_bytes) {}

void CallCollective::EnableNccl(CollectiveGpus* nccl, absl::Duration timeout,
                                Timeline* timeline, const TimelineEvent& event,
                                Clock* clock) {
  nccl_ = nccl;
  nccl_timeout_ = timeout;
  clock_ = clock;
  timeline_ = timeline;
  nccl_event_ = event;
}

void CallCollective::ExpectPartials(int device, const TensorSpec& spec) {
  const int p = static_cast<int>(peers_.size());
  for (int r = 0; r < p && nccl_ != nullptr; ++r) {
    if (r == my_rank_) continue;
    const TensorSpec offer{DType::kU8,
                           {static_cast<int64_t>(RankOffer::kBytes)}};
    expected_.push_back({exchange_id_, kOfferShard + r});
    store_->Declare(expected_.back(), device, offer, /*owned=*/false,
                    ObjectStore::Arrival::kFromPeer, peers_[r].worker_id);
    const BufferKey watch{exchange_id_, kWatchShard + r};
    expected_.push_back(watch);
    store_->Declare(watch, device, TensorSpec{DType::kU8, {1}},
                    /*owned=*/false, ObjectStore::Arrival::kFromPeer,
                    peers_[r].worker_id);
  }
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
  for (int r = 0; r < p && nccl_ != nullptr; ++r) {
    if (r == my_rank_) continue;
    store_->OnReady(
        {exchange_id_, kWatchShard + r},
        [give_up = give_up_, worker = peers_[r].worker_id](
            const absl::StatusOr<std::shared_ptr<const Storage>>& got) {
          if (got.ok()) return;
          absl::MutexLock lock(&give_up->mu);
          if (give_up->status.ok()) {
            give_up->status =
                absl::Status(got.status().code(),
                             absl::StrCat("all_reduce: worker ", worker, ": ",
                                          got.status().message()));
            give_up->changed.SignalAll();
          }
        });
  }
}

void CallCollective::ReleasePartials() {
  for (const BufferKey& key : expected_) {
    // With NCCL, entries nothing will fill (the watch entries; the partials
    // where NCCL ran) end here, so that they are removed.
    if (nccl_ != nullptr) {
      store_->Fail(key, absl::CancelledError("all_reduce: finished"));
    }
    store_->RemoveReader(key);
  }
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

absl::StatusOr<bool> CallCollective::ReduceOnGpusLocked() {
  const int p = static_cast<int>(peers_.size());
  std::vector<int64_t> workers;
  for (const Peer& peer : peers_) workers.push_back(peer.worker_id);
  std::vector<RankOffer> offers(p);
  // One local shard per worker (ApplyExecute enables NCCL only so).
  const Storage& in = *stored_.begin()->second;
  offers[my_rank_] = nccl_->Offer(workers, my_rank_, in, stored_spec_);
  const std::string mine = offers[my_rank_].Encode();
  auto block = Storage::Allocate(mine.size());
  if (!block.ok()) return block.status();
  std::memcpy((*block)->data(), mine.data(), mine.size());
  std::shared_ptr<const Storage> shared = std::move(*block);
  for (int r = 0; r < p; ++r) {
    if (r != my_rank_) {
      send_(peers_[r].worker_id, {exchange_id_, kOfferShard + my_rank_},
            shared);
    }
  }
  offer_sent_ = true;
  for (int r = 0; r < p; ++r) {
    if (r == my_rank_) continue;
    auto got = store_->AwaitReady({exchange_id_, kOfferShard + r});
    if (!got.ok()) {
      return absl::Status(
          got.status().code(),
          absl::StrCat("all_reduce: offer from worker ", peers_[r].worker_id,
                       ": ", got.status().message()));
    }
    auto offer = RankOffer::Decode(absl::string_view(
        static_cast<const char*>((*got)->data()), (*got)->size()));
    if (!offer.ok()) {
      return absl::InternalError(absl::StrCat("all_reduce: worker ",
                                              peers_[r].worker_id, " sent ",
                                              offer.status().message()));
    }
    offers[r] = *std::move(offer);
  }
  const PathChoice choice = ChoosePath(workers, offers);
  if (choice.nccl) {
    ScopedEvent summed(timeline_, EventKind::kTransfer);
    if (timeline_ != nullptr) {
      const int64_t start_ns = summed.event.start_ns;
      summed.event = nccl_event_;
      summed.event.kind = EventKind::kTransfer;
      summed.event.path = TransferPath::kNccl;
      summed.event.start_ns = start_ns;
      summed.event.bytes = static_cast<int64_t>(stored_spec_.byte_size());
    }
    auto out = nccl_->AllReduce(
        workers, my_rank_, offers, choice, in, stored_spec_,
        clock_->Now() + nccl_timeout_,
        [give_up = give_up_, clock = clock_](absl::Duration poll) {
          absl::MutexLock lock(&give_up->mu);
          const absl::Time until = clock->Now() + poll;
          while (give_up->status.ok() &&
                 !clock->AwaitWithDeadline(&give_up->mu, &give_up->changed,
                                           until)) {
          }
          return give_up->status;
        },
        absl::StrCat("all_reduce (rank ", my_rank_, " of ", p, ")"));
    summed.event.failed = !out.ok();
    if (!out.ok()) return out.status();
    gpu_result_ = *std::move(out);
    return true;
  }
  SPDLOG_DEBUG("all_reduce {:#x}: the host path: {} (this rank: {})",
               exchange_id_, choice.reason,
               offers[my_rank_].on_gpu ? "on a GPU" : offers[my_rank_].why_not);
  for (const auto& [shard, storage] : stored_) {
    auto host = Storage::InHostMemory(storage, /*shareable=*/false);
    if (!host.ok()) return host.status();
    host_copies_.push_back(*host);
    inputs_[shard] = builtin::ConstTensor{stored_spec_, (*host)->data()};
  }
  return false;
}

absl::Status CallCollective::ReduceLocked() {
  if (nccl_ != nullptr && !stored_.empty() && peers_.size() > 1) {
    absl::StatusOr<bool> on_gpus = ReduceOnGpusLocked();
    if (!on_gpus.ok()) return on_gpus.status();
    if (*on_gpus) return absl::OkStatus();
  } else if (!stored_.empty()) {
    for (const auto& [shard, storage] : stored_) {
      auto host = Storage::InHostMemory(storage, /*shareable=*/false);
      if (!host.ok()) return host.status();
      host_copies_.push_back(*host);
      inputs_[shard] = builtin::ConstTensor{stored_spec_, (*host)->data()};
    }
  }
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
  if (!status_.ok() && nccl_ != nullptr) {
    // Peers waiting for our offer, or inside NCCL with us, give up.
    for (int r = 0; r < p; ++r) {
      if (r == my_rank_) continue;
      if (!offer_sent_) {
        send_(peers_[r].worker_id, {exchange_id_, kOfferShard + my_rank_},
              status_);
      }
      send_(peers_[r].worker_id, {exchange_id_, kWatchShard + my_rank_},
            status_);
    }
  }
  done_ = true;
}

void CallCollective::Abort(int shard, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (abort_.ok()) abort_ = status;
  ArriveLocked();
}

absl::StatusOr<std::shared_ptr<Storage>> CallCollective::AllReduceStored(
    int shard, std::shared_ptr<const Storage> in, const TensorSpec& spec) {
  absl::MutexLock lock(&mu_);
  stored_[shard] = std::move(in);
  stored_spec_ = spec;
  ArriveLocked();
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  mu_.Await(absl::Condition(&finished));
  if (!status_.ok()) return status_;
  if (gpu_result_ != nullptr) return gpu_result_;  // one local shard
  if (spec.byte_size() != static_cast<int64_t>(result_.size())) {
    return absl::InternalError("all_reduce: output size mismatch");
  }
  auto out = Storage::AllocateForWrite(result_.size());
  if (!out.ok()) return out.status();
  if (!result_.empty())
    std::memcpy((*out)->data(), result_.data(), result_.size());
  return *std::move(out);
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
