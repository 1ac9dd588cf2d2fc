// What a client does when the server recovers from a lost host
// (proto::Recovery): slices take their new map, values recomputed under new
// ids are read under those, lost values say so; and reads that failed
// because of the loss run again.
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/client/client.h"
#include "plexus/client/client_core.h"
#include "plexus/common/logging.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

// Reads go again at most this many times (each after a loss was heard).
constexpr int kMaxRetries = 4;
// How long a read that failed as a host was lost waits for the server's
// word on it beyond the server's spare wait (the server sends it as it
// declares the host down, or once a slice that waited for a host to take
// its place is remapped or breaks).
constexpr absl::Duration kLossNoteWait = absl::Seconds(5);

}  // namespace

uint64_t ClientCore::ResolveSlow(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = aliases_.find(id);
  return it == aliases_.end() ? id : it->second;
}

absl::Status ClientCore::LostStatus(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = lost_.find(id);
  return it == lost_.end() ? absl::OkStatus() : it->second;
}

bool ClientCore::SliceBroken(uint64_t slice_id) const {
  absl::MutexLock lock(&mu_);
  return broken_slices_.contains(slice_id);
}

int64_t ClientCore::losses_heard() const {
  absl::MutexLock lock(&mu_);
  return losses_heard_;
}

bool ClientCore::AwaitLoss(int64_t heard, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto news = [this, heard]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return losses_heard_ > heard || machine_.broken() || closed_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&news), timeout) &&
         losses_heard_ > heard;
}

void ClientCore::AddSlice(Slice* slice) {
  absl::MutexLock lock(&mu_);
  slices_[slice->id()] = slice;
}

void ClientCore::RemoveSlice(Slice* slice) {
  absl::MutexLock lock(&mu_);
  auto it = slices_.find(slice->id());
  if (it != slices_.end() && it->second == slice) slices_.erase(it);
}

void ClientCore::ApplyRecoveryLocked(const proto::Recovery& r) {
  // In words, for the progress line: the lost host (named by the slices
  // that had it, before their remap) and the hosts in its place.
  RecoverySummary summary;
  summary.when = absl::Now();
  summary.lost_host = absl::StrCat("worker ", r.worker_id());
  auto note_host = [&](const proto::SliceInfo& info) {
    for (const proto::SliceDevice& d : info.devices()) {
      if (d.worker_id() == r.worker_id()) summary.lost_host = d.host_name();
    }
  };
  for (uint64_t sid : r.broken_slices()) {
    if (auto it = slices_.find(sid); it != slices_.end()) {
      note_host(it->second->info());
    }
  }
  for (const proto::SliceInfo& info : r.remapped()) {
    auto it = slices_.find(info.slice_id());
    if (it == slices_.end()) continue;
    const proto::SliceInfo& before = it->second->info();
    note_host(before);
    for (int j = 0; j < before.devices_size() && j < info.devices_size(); ++j) {
      const std::string& now = info.devices(j).host_name();
      if (before.devices(j).worker_id() == r.worker_id() &&
          std::find(summary.remapped_onto.begin(), summary.remapped_onto.end(),
                    now) == summary.remapped_onto.end()) {
        summary.remapped_onto.push_back(now);
      }
    }
    it->second->Remap(info);
  }
  summary.calls_recomputed = r.calls_recomputed();
  summary.values_lost = r.lost_ids_size();
  summary.slices_broken = r.broken_slices_size();
  if (r.remapped_size() > 0 || r.broken_slices_size() > 0 ||
      r.lost_ids_size() > 0 || r.calls_recomputed() > 0) {
    last_recovery_ = std::move(summary);
  }
  const int n = std::min(r.old_ids_size(), r.new_ids_size());
  for (int i = 0; i < n; ++i) {
    const uint64_t from = r.old_ids(i), to = r.new_ids(i);
    for (auto& [old_id, now] : aliases_) {
      if (now == from) now = to;
    }
    aliases_[from] = to;
  }
  if (!aliases_.empty()) has_aliases_.store(true, std::memory_order_release);
  const absl::Status lost = StatusFromProto(r.status());
  for (uint64_t id : r.lost_ids()) lost_[id] = lost;
  for (uint64_t sid : r.broken_slices()) {
    broken_slices_[sid] = absl::StrCat("worker ", r.worker_id(), " was lost");
  }
  const int reputs = std::min(r.reput_ids_size(), r.reput_shards_size());
  for (int i = 0; i < reputs; ++i) {
    reputs_.emplace_back(r.reput_ids(i), r.reput_shards(i));
  }
  if (reputs > 0 && !reputter_.joinable()) {
    reputter_ = std::thread([this] { RePutLoop(); });
  }
}

void ClientCore::KeepPut(uint64_t id, uint64_t slice_id,
                         std::vector<std::shared_ptr<Storage>> shards) {
  absl::MutexLock lock(&mu_);
  kept_puts_[id] = {slice_id, std::move(shards)};
}

void ClientCore::RePutLoop() {
  const uint64_t epoch = epoch_.load();  // the session that started it
  while (true) {
    uint64_t id;
    int32_t shard;
    std::shared_ptr<Storage> data;
    proto::SliceDevice device;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || machine_.broken() || !reputs_.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (closed_ || machine_.broken()) return;
      std::tie(id, shard) = reputs_.front();
      reputs_.pop_front();
      auto kept = kept_puts_.find(id);
      auto slice = kept == kept_puts_.end()
                       ? slices_.end()
                       : slices_.find(kept->second.slice_id);
      if (slice == slices_.end() || shard < 0 ||
          shard >= static_cast<int>(kept->second.shards.size()) ||
          shard >= slice->second->info().devices_size()) {
        SPDLOG_ERROR(
            "cannot put buffer {} shard {} again after a loss: its data or "
            "slice is gone here",
            id, shard);
        continue;
      }
      data = kept->second.shards[shard];
      device = slice->second->info().devices(shard);
    }
    auto conn = Checkout(device, epoch);
    absl::Status s =
        conn.ok() ? (*conn)->Put({id, shard}, *data) : conn.status();
    if (conn.ok() && (*conn)->healthy()) {
      Checkin(device.worker_id(), std::move(*conn), epoch);
    } else if (conn.ok()) {
      Discard(std::move(*conn));
    }
    // The put itself reached the new device first: nothing to do.
    if (s.code() == absl::StatusCode::kAlreadyExists) s = absl::OkStatus();
    if (!s.ok()) {
      SPDLOG_WARN("putting buffer {} shard {} again on worker {} failed: {}",
                  id, shard, device.worker_id(), s.ToString());
    }
  }
}

// ---------------------------------------------------------------- reads

namespace {

// Whether `s` is how a read fails when a host it needed is lost.
bool LostHost(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable;
}

}  // namespace

// Runs `attempt` until it succeeds, fails for another reason than a lost
// host, or the loss is settled: the server's note says what became of the
// futures (recovered: read again; lost: DATA_LOSS; broken slice: DATA_LOSS
// naming the host).
// Why none of `futures` can be read any more after a loss: lost, or on a
// slice that no spare replaced; OK if they may be read again.
static absl::Status Settled(ClientCore& core,
                            const std::vector<const Future*>& futures,
                            const absl::Status& failure) {
  for (const Future* f : futures) {
    // Made in a session that ended: the server freed it with the session.
    if (absl::Status s = core.SessionStatus(f->epoch(), f->buffer_id());
        !s.ok()) {
      return s;
    }
    absl::Status lost = core.LostStatus(f->buffer_id());
    if (!lost.ok()) return lost;
    if (!failure.ok() && core.SliceBroken(f->slice()->id())) {
      return absl::DataLossError(
          absl::StrCat(failure.message(), " (slice ", f->slice()->id(),
                       " lost that host and no spare took its place)"));
    }
  }
  return absl::OkStatus();
}

// Runs `attempt` until it succeeds, fails for another reason than a lost
// host, or the loss is settled: the server's note says what became of the
// futures (recovered: read again, under their new ids and places; lost or
// on a broken slice: DATA_LOSS).
template <typename Attempt>
static absl::Status Recovering(ClientCore& core,
                               const std::vector<const Future*>& futures,
                               Attempt attempt) {
  if (absl::Status lost = Settled(core, futures, absl::OkStatus());
      !lost.ok()) {
    return lost;
  }
  for (int tries = 1;; ++tries) {
    const int64_t heard = core.losses_heard();
    absl::Status s = attempt();
    if (s.ok() || !LostHost(s)) return s;
    if (absl::Status settled = Settled(core, futures, s); !settled.ok()) {
      return settled;
    }
    // The read may have raced the server's note on the loss.
    if (tries >= kMaxRetries ||
        (core.losses_heard() == heard &&
         !core.AwaitLoss(heard, kLossNoteWait + core.spare_wait()))) {
      return s;
    }
    if (absl::Status settled = Settled(core, futures, s); !settled.ok()) {
      return settled;
    }
  }
}

absl::Status Client::Snapshot(const std::vector<Future>& futures) {
  if (absl::Status open = core_->CheckOpen(); !open.ok()) return open;
  std::vector<proto::ClientOp> ops;
  const uint64_t epoch = core_->epoch();
  for (const Future& f : futures) {
    if (!f.valid()) return absl::InvalidArgumentError("empty future");
    // OK only for the open session's futures (`epoch`, unless it has just
    // ended, when Enqueue drops the ops).
    if (absl::Status s = core_->SessionStatus(f.epoch(), f.buffer_id());
        !s.ok()) {
      return s;
    }
    ops.emplace_back().set_snapshot(f.buffer_id());
  }
  core_->Enqueue(std::move(ops), epoch);
  return absl::OkStatus();
}

namespace {

// The client's timeline event of a fetch or wait of `future` (its first,
// for a wait on many), made to returned.
class ClientRequestEvent {
 public:
  ClientRequestEvent(ClientCore& core, EventKind kind, const Future& future)
      : scoped_(&core.timeline(), kind) {
    scoped_.event.client_id = core.client_id();
    scoped_.event.buffer_id = future.buffer_id();
    if (kind == EventKind::kFetch) {
      scoped_.event.bytes = static_cast<int64_t>(future.spec().byte_size());
    }
  }
  absl::Status Done(absl::Status status) {
    scoped_.event.failed = !status.ok();
    scoped_.Done();
    return status;
  }

 private:
  ScopedEvent scoped_;
};

}  // namespace

std::optional<RecoverySummary> ClientCore::LastRecovery() const {
  absl::MutexLock lock(&mu_);
  return last_recovery_;
}

std::optional<RecoverySummary> Client::LastRecovery() const {
  return core_->LastRecovery();
}

absl::Status Client::Fetch(const Future& future, void* dst,
                           TransferProgress* progress) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  ClientRequestEvent fetch(*core_, EventKind::kFetch, future);
  return fetch.Done(Recovering(
      *core_, {&future}, [&] { return FetchOnce(future, dst, progress); }));
}

absl::Status Client::Wait(const Future& future) {
  if (!future.valid()) return absl::InvalidArgumentError("empty future");
  ClientRequestEvent wait(*core_, EventKind::kWait, future);
  return wait.Done(
      Recovering(*core_, {&future}, [&] { return WaitOnce(future); }));
}

absl::Status Client::WaitMany(const std::vector<Future>& futures,
                              absl::Time deadline) {
  std::vector<const Future*> all;
  for (const Future& f : futures) {
    if (!f.valid()) return absl::InvalidArgumentError("empty future");
    all.push_back(&f);
  }
  if (futures.empty()) {
    return Recovering(*core_, all,
                      [&] { return WaitManyOnce(futures, deadline); });
  }
  ClientRequestEvent wait(*core_, EventKind::kWait, futures.front());
  return wait.Done(
      Recovering(*core_, all, [&] { return WaitManyOnce(futures, deadline); }));
}

}  // namespace plexus
