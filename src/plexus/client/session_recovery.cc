// The server's word on lost hosts, as a session records it
// (ClientSession): workers down, slices remapped or broken, values
// recomputed under new ids or lost, shards to put again; and the summary
// the progress line shows.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/client/client_session.h"
#include "plexus/common/status_proto.h"

namespace plexus {

uint64_t ClientSession::ResolveSlow(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = aliases_.find(id);
  return it == aliases_.end() ? id : it->second;
}

std::pair<uint64_t, const proto::SliceInfo*> ClientSession::ResolveOn(
    uint64_t id, const Slice& slice) const {
  absl::MutexLock lock(&mu_);
  auto it = aliases_.find(id);
  return {it == aliases_.end() ? id : it->second, &slice.info()};
}

absl::Status ClientSession::LostStatus(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = lost_.find(id);
  if (it != lost_.end()) return it->second;
  // Under the id it has now (moved by a resize, then lost or parked).
  auto alias = aliases_.find(id);
  if (alias == aliases_.end()) return absl::OkStatus();
  it = lost_.find(alias->second);
  return it == lost_.end() ? absl::OkStatus() : it->second;
}

bool ClientSession::SliceBroken(uint64_t slice_id) const {
  absl::MutexLock lock(&mu_);
  return broken_slices_.contains(slice_id);
}

int64_t ClientSession::losses_heard() const {
  absl::MutexLock lock(&mu_);
  return losses_heard_;
}

bool ClientSession::AwaitLoss(int64_t heard, absl::Duration timeout,
                              absl::Time deadline) {
  return AwaitCount(&ClientSession::losses_heard_, heard, timeout, deadline);
}

int64_t ClientSession::notes_heard() const {
  absl::MutexLock lock(&mu_);
  return notes_heard_;
}

bool ClientSession::AwaitNote(int64_t heard, absl::Duration timeout,
                              absl::Time deadline) {
  return AwaitCount(&ClientSession::notes_heard_, heard, timeout, deadline);
}

bool ClientSession::AwaitServerGone(int64_t resumes, absl::Duration timeout,
                                    absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto gone = [this, resumes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !machine_.usable() || this->resumes() != resumes;
  };
  return options_.clock->AwaitCondition(
      &mu_, absl::Condition(&gone),
      std::min(deadline, options_.clock->Now() + timeout));
}

bool ClientSession::AwaitCount(int64_t ClientSession::*count, int64_t heard,
                               absl::Duration timeout, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto news = [this, count, heard]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return this->*count > heard || machine_.broken() || closed_;
  };
  return options_.clock->AwaitCondition(
             &mu_, absl::Condition(&news),
             std::min(deadline, options_.clock->Now() + timeout)) &&
         this->*count > heard;
}

void ClientSession::AddSlice(Slice* slice) {
  absl::MutexLock lock(&mu_);
  slices_[slice->id()] = slice;
}

void ClientSession::RemoveSlice(Slice* slice) {
  absl::MutexLock lock(&mu_);
  auto it = slices_.find(slice->id());
  if (it != slices_.end() && it->second == slice) slices_.erase(it);
}

void ClientSession::ApplyRecoveryLocked(const proto::Recovery& r) {
  notes_heard_++;
  if (r.resized()) {
    // Not a loss: the client resized the slice; its values' new ids.
    for (const proto::SliceInfo& info : r.remapped()) {
      auto it = slices_.find(info.slice_id());
      if (it != slices_.end()) it->second->Remap(info);
    }
    ApplyAliasesLocked(r);
    return;
  }
  // In words, for the progress line: the lost host (named by the slices
  // that had it, before their remap) and the hosts in its place.
  RecoverySummary summary;
  summary.when = options_.clock->Now();
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
  ApplyAliasesLocked(r);
  const absl::Status lost = StatusFromProto(r.status());
  for (uint64_t id : r.lost_ids()) lost_[id] = lost;
  for (uint64_t sid : r.broken_slices()) {
    broken_slices_[sid] = absl::StrCat("worker ", r.worker_id(), " was lost");
  }
  const int reputs = std::min(r.reput_ids_size(), r.reput_shards_size());
  for (int i = 0; i < reputs; ++i) {
    observer_->RePut(r.reput_ids(i), r.reput_shards(i));
  }
}

void ClientSession::ApplyAliasesLocked(const proto::Recovery& r) {
  const int n = std::min(r.old_ids_size(), r.new_ids_size());
  for (int i = 0; i < n; ++i) {
    const uint64_t from = r.old_ids(i), to = r.new_ids(i);
    for (auto& [old_id, now] : aliases_) {
      if (now == from) now = to;
    }
    aliases_[from] = to;
    // Placed again under its new id (a value read back from files).
    lost_.erase(from);
  }
  if (!aliases_.empty()) has_aliases_.store(true, std::memory_order_release);
  const absl::Status lost = StatusFromProto(r.status());
  if (r.resized()) {
    for (uint64_t id : r.lost_ids()) lost_[id] = lost;
  }
}

void ClientSession::WorkerDownLocked(const proto::WorkerDown& d) {
  // Slices still on it were not remapped: they broke.
  for (const auto& [sid, slice] : slices_) {
    for (const auto& dev : slice->info().devices()) {
      if (dev.worker_id() != d.worker_id()) continue;
      broken_slices_.try_emplace(
          sid, absl::StrCat("worker ", d.worker_id(), " was lost"));
      break;
    }
  }
  losses_heard_++;
  // A worker that is down (or stopped) will not answer: the data path
  // wakes whoever waits on it; they find it down and say so.
  observer_->WorkerDown(d.worker_id(), StatusFromProto(d.status()));
}

std::optional<RecoverySummary> ClientSession::LastRecovery() const {
  absl::MutexLock lock(&mu_);
  return last_recovery_;
}

std::optional<proto::SliceDevice> ClientSession::SliceDevice(
    uint64_t slice_id, int32_t shard) const {
  absl::MutexLock lock(&mu_);
  auto it = slices_.find(slice_id);
  if (it == slices_.end() || shard < 0 ||
      shard >= it->second->info().devices_size()) {
    return std::nullopt;
  }
  return it->second->info().devices(shard);
}

}  // namespace plexus
