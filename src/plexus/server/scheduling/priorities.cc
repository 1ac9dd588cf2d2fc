// Priorities: a slice of a higher-priority tenant takes its devices from
// lower-priority slices that allow it, which shrink off them
// (ClusterState::YieldToPriorities, docs/scheduling.md, "Priorities").
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/mesh_coords.h"

namespace plexus {

ClusterState::Claims ClusterState::ClaimsByPriority() const {
  int32_t lowest = std::numeric_limits<int32_t>::max();
  int32_t highest = std::numeric_limits<int32_t>::min();
  for (const auto& [cid, client] : clients_) {
    if (client.slices.empty()) continue;
    lowest = std::min(lowest, PolicyOf(client).priority);
    highest = std::max(highest, PolicyOf(client).priority);
  }
  Claims claims;
  if (lowest >= highest) return claims;  // one priority: nothing to yield
  for (const auto& [cid, client] : clients_) {
    const int32_t priority = PolicyOf(client).priority;
    for (uint64_t sid : client.slices) {
      auto it = slices_.find(sid);
      if (it == slices_.end() || !it->second.broken.empty() ||
          it->second.suspended) {
        continue;
      }
      for (const DeviceRef& d : it->second.devices) {
        Claim& claim = claims[{d.worker_id, d.device}];
        if (claim.slice_id == 0 || priority > claim.priority) {
          claim = {priority, sid, client.tenant};
        }
      }
    }
  }
  return claims;
}

std::vector<std::pair<uint64_t, SliceResized>> ClusterState::YieldToPriorities(
    std::map<uint64_t, std::string>* why_not) {
  std::vector<std::pair<uint64_t, SliceResized>> yielded;
  const Claims claims = ClaimsByPriority();
  if (claims.empty()) return yielded;
  for (auto& [cid, client] : clients_) {
    if (client.away) continue;
    const int32_t priority = PolicyOf(client).priority;
    // A copy: a resize adds (and removes) a record for the old map.
    const std::set<uint64_t> held = client.slices;
    for (uint64_t sid : held) {
      auto it = slices_.find(sid);
      if (it == slices_.end()) continue;
      SliceRecord& slice = it->second;
      if (slice.on_loss != proto::LOSS_SHRINK || !slice.broken.empty() ||
          !slice.awaiting.empty() || slice.suspended) {
        continue;
      }
      const std::vector<int32_t>& mesh = slice.mesh_shape;
      const int axis = std::clamp<int>(slice.elastic_axis, 0,
                                       static_cast<int>(mesh.size()) - 1);
      const int n = static_cast<int>(slice.devices.size());
      const int32_t others = n / mesh[axis];
      // The positions of the axis with a device a higher priority holds,
      // and the first slice that holds one (named in the note).
      std::vector<bool> taken(mesh[axis], false);
      const Claim* by = nullptr;
      for (int v = 0; v < n; ++v) {
        auto c =
            claims.find({slice.devices[v].worker_id, slice.devices[v].device});
        if (c == claims.end() || c->second.priority <= priority) continue;
        taken[CoordsOf(v, mesh)[axis]] = true;
        if (by == nullptr) by = &c->second;
      }
      if (by == nullptr) continue;
      // As many of them go as its minimum allows, the last ones first.
      const int floor = std::max(slice.min_devices, others);
      const int32_t untaken =
          static_cast<int32_t>(std::count(taken.begin(), taken.end(), false));
      int32_t keep_taken =
          std::max<int32_t>(0, (floor + others - 1) / others - untaken);
      ResizePlan plan;
      plan.axis = axis;
      for (int32_t c = 0; c < mesh[axis]; ++c) {
        if (!taken[c]) {
          plan.keep.push_back(c);
        } else if (keep_taken > 0) {
          plan.keep.push_back(c);
          --keep_taken;
        }
      }
      if (static_cast<int>(plan.keep.size()) == mesh[axis]) {
        if (why_not != nullptr) {
          (*why_not)[sid] = absl::StrCat(
              "it is at its minimum of ", floor,
              " devices (min_devices): it time-shares the devices of slice ",
              by->slice_id, " (tenant '", by->tenant, "', priority ",
              by->priority, ")");
        }
        continue;
      }
      absl::StatusOr<SliceResized> resized = CommitResize(client, slice, plan);
      if (!resized.ok()) {
        if (why_not != nullptr) {
          (*why_not)[sid] = std::string(resized.status().message());
        }
        continue;
      }
      resized->why = absl::StrCat(
          "slice ", sid, " shrank from ", n, " to ",
          resized->slice.devices_size(), " devices: it gave ",
          n - resized->slice.devices_size(), " to slice ", by->slice_id,
          " of tenant '", by->tenant, "' (priority ", by->priority, ", over ",
          priority, "), ", resized->values_moved, " values moved (",
          resized->bytes_moved, " bytes)");
      counters_.set_slices_yielded(counters_.slices_yielded() + 1);
      yielded.emplace_back(cid, *std::move(resized));
    }
  }
  return yielded;
}

}  // namespace plexus
