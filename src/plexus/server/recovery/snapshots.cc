// ClusterState's snapshots: client.snapshot's copies of a buffer's shards
// on other hosts, where they are kept, when they count, and what releases
// them (server/model/cluster_state.h, "RouteSnapshot" and after).
#include <optional>
#include <utility>
#include <vector>

#include "plexus/common/ids.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {
namespace {

// The index of the next device after `j` (cyclically) on another host than
// device `j`'s, or -1 if every device is on its host: where shard j's
// snapshot copy is kept.
int NextHostShard(const std::vector<DeviceRef>& devices, int j) {
  const int n = static_cast<int>(devices.size());
  for (int step = 1; step < n; ++step) {
    const int c = (j + step) % n;
    if (devices[c].worker_id != devices[j].worker_id) return c;
  }
  return -1;
}

}  // namespace

void ClusterState::RouteSnapshot(uint64_t client_id, uint64_t buffer_id,
                                 WorkerOps* ops) {
  if (ClientOfBuffer(buffer_id) != client_id) return;
  // A cluster that never had a spare cannot recover: a copy would only
  // cost memory and bandwidth (as lineage would: JobRecords).
  if (!records_.keep_lineage()) return;
  if (!aliases_.empty()) {
    auto alias = aliases_.find(buffer_id);
    if (alias != aliases_.end()) buffer_id = alias->second;
  }
  const BufferRecord* b = records_.FindBuffer(buffer_id);
  if (b == nullptr || b->released) return;
  auto slice = slices_.find(b->slice_id);
  if (slice == slices_.end() || !slice->second.broken.empty()) return;
  // A copy on another host survives any one loss already.
  if (b->spec().sharding.is_replicated() && !OnOneHost(slice->second)) return;
  // A complete copy stays: the value never changes, and recovery keeps
  // the copy whole. Replacing it would leave none while the new one is
  // made (and its producer no longer holds the inputs to recompute it).
  auto done = snapshots_.find(buffer_id);
  if (done != snapshots_.end() && done->second.complete()) return;
  const std::vector<DeviceRef>& devices = slice->second.devices;
  const int n = static_cast<int>(devices.size());
  auto local = b->spec().Local(n);
  if (!local.ok()) return;
  // Out of ids (after 2^39 of them): no copy; the value keeps its lineage.
  absl::StatusOr<uint64_t> copy_id = ServerMadeIds(client_id);
  if (!copy_id.ok()) return;
  Snapshot snap;
  snap.id = *copy_id;
  std::vector<DeviceRef> holders;
  for (int j = 0; j < n; ++j) {
    std::optional<DeviceRef> holder = SnapshotHolder(devices, j);
    if (!holder.has_value()) return;  // no other live host to keep it
    holders.push_back(*holder);
  }
  for (int j = 0; j < n; ++j) {
    snap.holders.push_back(holders[j].worker_id);
    CopyShard(buffer_id, j, devices[j].worker_id, snap.id, j, holders[j],
              *local, /*report=*/true, ops);
  }
  // The previous copy goes once this one is asked for (a copy being made
  // is never the only one).
  auto old = snapshots_.find(buffer_id);
  if (old != snapshots_.end()) {
    const Snapshot previous = std::move(old->second);
    snapshots_.erase(old);
    snapshot_of_.erase(previous.id);
    ReleaseCopyOps(previous, b->slice_id, ops);
  }
  snapshot_of_[snap.id] = buffer_id;
  snapshots_[buffer_id] = std::move(snap);
  counters_.set_snapshots_taken(counters_.snapshots_taken() + 1);
}

std::optional<DeviceRef> ClusterState::SnapshotHolder(
    const std::vector<DeviceRef>& devices, int j) const {
  const int k = NextHostShard(devices, j);
  if (k >= 0) return devices[k];
  // One host: the next live host of the cluster after it, spares last (a
  // spare may be the one that takes this host's place: then the copy is
  // already where it is needed, but it serves no one else meanwhile).
  const int64_t self = devices[j].worker_id;
  std::optional<DeviceRef> spare;
  auto consider = [&](const WorkerRecord& w) -> std::optional<DeviceRef> {
    if (w.id == self || !w.alive || w.info.devices_size() == 0) {
      return std::nullopt;
    }
    DeviceRef d{w.id, 0};
    if (w.info.spare()) {
      if (!spare.has_value()) spare = d;
      return std::nullopt;
    }
    return d;
  };
  for (auto it = workers_.upper_bound(self); it != workers_.end(); ++it) {
    if (auto d = consider(it->second)) return d;
  }
  for (auto it = workers_.begin(); it != workers_.end() && it->first < self;
       ++it) {
    if (auto d = consider(it->second)) return d;
  }
  return spare;
}

void ClusterState::ReleaseCopyOps(const Snapshot& snap, uint64_t slice_id,
                                  WorkerOps* ops) {
  ReleaseOps(snap.id, slice_id, ops);
  auto slice = slices_.find(slice_id);
  std::set<int64_t> outside;  // holders that are not workers of the slice
  for (int64_t h : snap.holders) {
    const bool in_slice =
        slice != slices_.end() &&
        std::any_of(slice->second.devices.begin(), slice->second.devices.end(),
                    [h](const DeviceRef& d) { return d.worker_id == h; });
    if (!in_slice) outside.insert(h);
  }
  for (int64_t h : outside) {
    const WorkerRecord* w = FindWorker(h);
    if (w == nullptr || !w->alive) continue;
    proto::WorkerOp op;
    op.mutable_release()->add_buffer_ids(snap.id);
    (*ops)[h].push_back(std::move(op));
  }
}

void ClusterState::CopyArrived(uint64_t copy_id, WorkerOps* ops) {
  auto of = snapshot_of_.find(copy_id);
  if (of == snapshot_of_.end()) return;
  auto snap = snapshots_.find(of->second);
  if (snap == snapshots_.end()) return;
  if (snap->second.recopies > 0) snap->second.recopies--;
  if (++snap->second.arrived != static_cast<int>(snap->second.holders.size())) {
    return;
  }
  // Complete: its producer need not keep its inputs for it any more.
  records_.Snapshotted(of->second);
  DrainReleases(ops);
}

int64_t ClusterState::SnapshotsIncomplete() const {
  int64_t incomplete = 0;
  for (const auto& [id, snap] : snapshots_) incomplete += !snap.complete();
  return incomplete;
}

int64_t ClusterState::SnapshotRecopiesPending() const {
  int64_t pending = 0;
  for (const auto& [id, snap] : snapshots_) pending += snap.recopies;
  return pending;
}

}  // namespace plexus
