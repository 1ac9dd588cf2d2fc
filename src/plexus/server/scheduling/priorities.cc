// Priorities: a slice of a higher-priority tenant takes its devices from
// lower-priority slices that allow it, which shrink off them or are
// suspended until they free (ClusterState::YieldToPriorities,
// ResumePreempted, HeldByPreemption; docs/scheduling.md, "Priorities").
#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
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
      const proto::PreemptPolicy policy = PreemptionOf(slice);
      if (policy == proto::PREEMPT_SHARE || !slice.broken.empty() ||
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
      if (policy == proto::PREEMPT_SUSPEND || policy == proto::PREEMPT_PARK) {
        absl::StatusOr<SliceResized> suspended = Preempt(client, slice, *by);
        if (!suspended.ok()) {
          if (why_not != nullptr) {
            (*why_not)[sid] = std::string(suspended.status().message());
          }
          continue;
        }
        yielded.emplace_back(cid, *std::move(suspended));
        continue;
      }
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

proto::PreemptPolicy PreemptionOf(const SliceRecord& slice) {
  if (slice.on_preempt != proto::PREEMPT_DEFAULT) return slice.on_preempt;
  return slice.on_loss == proto::LOSS_SHRINK ? proto::PREEMPT_SHRINK
                                             : proto::PREEMPT_SHARE;
}

bool ClusterState::OwnDevicesFree(const SliceRecord& slice, int32_t priority,
                                  const Claims& claims, bool alone) const {
  return std::all_of(
      slice.devices.begin(), slice.devices.end(), [&](const DeviceRef& d) {
        auto w = workers_.find(d.worker_id);
        if (w == workers_.end() || !w->second.alive ||
            (alone && w->second.device_load[d.device] != 1)) {
          return false;
        }
        auto claim = claims.find({d.worker_id, d.device});
        return claim == claims.end() || claim->second.priority <= priority ||
               claim->second.slice_id == slice.id;
      });
}

absl::StatusOr<SliceResized> ClusterState::Preempt(ClientRecord& client,
                                                   SliceRecord& slice,
                                                   const Claim& by) {
  const bool park = slice.on_preempt == proto::PREEMPT_PARK;
  const bool to_files = park && !park_dir_.empty();
  absl::StatusOr<SliceResized> out =
      SuspendSlice(client.id, slice.id, to_files, /*by_server=*/true);
  if (!out.ok()) return out.status();
  const std::string kept =
      to_files ? absl::StrCat("its values are parked in files of ", park_dir_,
                              " (on_preempt park; reads of them fail until it "
                              "resumes)")
      : park   ? "its values stay in the workers' memory (on_preempt park, "
                 "but the server has no park directory: --park-dir)"
               : "its values stay in the workers' memory (on_preempt suspend)";
  slice.preempted = absl::StrCat(
      "suspended by the server for slice ", by.slice_id, " of tenant '",
      by.tenant, "' (priority ", by.priority, ", over ",
      PolicyOf(client).priority, "), which holds its devices: ", kept,
      "; its calls and puts wait at the server until it resumes on its own "
      "devices, once they free");
  slice.preempted_since = now_;
  JournalSlice(slice);
  out->slice = DescribeSlice(slice);
  out->note.clear_remapped();
  *out->note.add_remapped() = out->slice;
  out->why = absl::StrCat("slice ", slice.id, " ", slice.preempted);
  counters_.set_slices_preempted(counters_.slices_preempted() + 1);
  return out;
}

std::vector<std::pair<uint64_t, SliceResized>> ClusterState::ResumePreempted(
    std::map<uint64_t, std::string>* why_not) {
  std::vector<std::pair<uint64_t, SliceResized>> resumed;
  Claims claims;
  bool claims_known = false;
  for (auto& [sid, slice] : slices_) {
    if (slice.preempted.empty() || !slice.suspended) continue;
    ClientRecord* client = FindClient(slice.client_id);
    if (client == nullptr || client->away) continue;
    if (!claims_known) {
      claims = ClaimsByPriority();
      claims_known = true;
    }
    // On its own devices only: its client's reads of values made after
    // the suspend went to them, and would wait there for a declaration
    // if the slice came back elsewhere.
    if (!OwnDevicesFree(slice, PolicyOf(*client).priority, claims,
                        /*alone=*/false)) {
      if (why_not != nullptr) {
        (*why_not)[sid] = absl::StrCat(
            "it stays suspended while another slice holds its devices (",
            slice.preempted, ")");
      }
      continue;
    }
    const absl::Duration held = now_ - slice.preempted_since;
    absl::StatusOr<SliceResized> back = ResumeSlice(slice.client_id, sid);
    if (!back.ok()) {
      if (why_not != nullptr) {
        (*why_not)[sid] = std::string(back.status().message());
      }
      continue;
    }
    slice.preempted.clear();
    JournalSlice(slice);
    back->slice = DescribeSlice(slice);
    back->note.clear_remapped();
    *back->note.add_remapped() = back->slice;
    back->why = absl::StrCat(
        "slice ", sid,
        " resumed on its own devices (the higher priority that held them "
        "left) after ",
        absl::FormatDuration(held),
        " suspended, nothing moved: its calls and puts that waited go now");
    counters_.set_slices_preempt_resumed(counters_.slices_preempt_resumed() +
                                         1);
    resumed.emplace_back(slice.client_id, *std::move(back));
  }
  return resumed;
}

bool ClusterState::IsPreempted(uint64_t slice_id) const {
  auto it = slices_.find(slice_id);
  return it != slices_.end() && !it->second.preempted.empty();
}

std::optional<PreemptionHold> ClusterState::HeldByPreemption(
    uint64_t client_id,
    const google::protobuf::RepeatedPtrField<proto::ClientOp>& ops) const {
  const ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return std::nullopt;
  bool any = false;
  for (uint64_t sid : client->slices) any |= IsPreempted(sid);
  if (!any) return std::nullopt;
  std::set<uint64_t> let_go;  // resumed or released by an earlier op
  for (const proto::ClientOp& op : ops) {
    uint64_t sid = 0;
    if (op.has_call()) {
      sid = op.call().slice_id();
    } else if (op.has_put()) {
      sid = op.put().slice_id();
    } else if (op.has_slice_resize() && op.slice_resize().resume()) {
      let_go.insert(op.slice_resize().slice_id());
    } else if (op.has_slice_release()) {
      let_go.insert(op.slice_release());
    }
    if (sid == 0 || let_go.count(sid) > 0) continue;
    auto it = slices_.find(sid);
    if (it == slices_.end() || it->second.client_id != client_id ||
        it->second.preempted.empty()) {
      continue;
    }
    return PreemptionHold{
        sid, absl::StrCat("slice ", sid, " is ", it->second.preempted)};
  }
  return std::nullopt;
}

}  // namespace plexus
