// ClusterState::SuspendSlice and ResumeSlice: a slice parked (no calls, its
// devices counted for nothing) and placed again, on other devices if its
// own were taken, its values moved there by the resize core.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {
namespace {

absl::StatusOr<SliceRecord*> OwnedSlice(std::map<uint64_t, SliceRecord>& slices,
                                        uint64_t client_id, uint64_t slice_id,
                                        const char* what) {
  auto it = slices.find(slice_id);
  if (it == slices.end() || it->second.client_id != client_id) {
    return absl::NotFoundError(absl::StrCat(what, ": slice ", slice_id,
                                            " is not held by this client"));
  }
  return &it->second;
}

// A suspend or an in-place resume: nothing moves; the client hears the
// slice's new state as for a resize (its map, `suspended` set or not).
SliceResized InPlace(proto::SliceInfo slice, std::string why) {
  SliceResized out;
  out.slice = std::move(slice);
  out.why = std::move(why);
  out.note.set_worker_id(-1);
  out.note.set_resized(true);
  *out.note.add_remapped() = out.slice;
  return out;
}

}  // namespace

absl::StatusOr<SliceResized> ClusterState::ChangeSlice(
    uint64_t client_id, const proto::SliceResize& req) {
  if (req.suspend()) return SuspendSlice(client_id, req.slice_id());
  if (req.resume()) return ResumeSlice(client_id, req.slice_id());
  return ResizeSlice(client_id, req);
}

absl::StatusOr<SliceResized> ClusterState::SuspendSlice(uint64_t client_id,
                                                        uint64_t slice_id) {
  absl::StatusOr<SliceRecord*> found =
      OwnedSlice(slices_, client_id, slice_id, "suspend");
  if (!found.ok()) return found.status();
  SliceRecord& slice = **found;
  if (slice.suspended) {
    return absl::FailedPreconditionError(
        absl::StrCat("suspend: slice ", slice_id, " is already suspended"));
  }
  if (!slice.broken.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "suspend: slice ", slice_id, " lost a host: ", slice.broken));
  }
  if (!slice.awaiting.empty()) {
    return absl::UnavailableError(
        absl::StrCat("suspend: slice ", slice_id,
                     " waits for a host to take a lost one's place (",
                     slice.awaiting, "); suspend it once it is whole"));
  }
  slice.suspended = true;
  JournalSlice(slice);
  SliceResized out = InPlace(
      DescribeSlice(slice),
      absl::StrCat("slice ", slice_id, " suspended (", slice.devices.size(),
                   " devices; its values kept where they are)"));
  out.freed_devices = true;  // for quotas and priorities
  return out;
}

absl::StatusOr<SliceResized> ClusterState::ResumeSlice(uint64_t client_id,
                                                       uint64_t slice_id) {
  absl::StatusOr<SliceRecord*> found =
      OwnedSlice(slices_, client_id, slice_id, "resume");
  if (!found.ok()) return found.status();
  SliceRecord& slice = **found;
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  if (!slice.suspended) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume: slice ", slice_id, " is not suspended"));
  }
  if (!slice.broken.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume: slice ", slice_id, " lost a host: ", slice.broken));
  }
  // Its own devices while every one is alive and no other slice maps it
  // (each carries this slice's load alone) and no higher priority claims
  // it: nothing moves.
  const Claims claims = ClaimsByPriority();
  const int32_t priority = PolicyOf(*client).priority;
  const bool own_free = std::all_of(
      slice.devices.begin(), slice.devices.end(), [&](const DeviceRef& d) {
        auto w = workers_.find(d.worker_id);
        if (w == workers_.end() || !w->second.alive ||
            w->second.device_load[d.device] != 1) {
          return false;
        }
        auto claim = claims.find({d.worker_id, d.device});
        return claim == claims.end() || claim->second.priority <= priority ||
               claim->second.slice_id == slice.id;
      });
  const int n = static_cast<int>(slice.devices.size());
  if (own_free) {
    // Counted against the quota again.
    const int32_t quota = PolicyOf(*client).max_devices;
    if (quota > 0 && DevicesHeld(*client) + n > quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "resume: slice ", slice_id, " would bring client ", client_id,
          " (tenant '", client->tenant, "') to ", DevicesHeld(*client) + n,
          " devices, over its max_devices of ", quota));
    }
    slice.suspended = false;
    JournalSlice(slice);
    return InPlace(DescribeSlice(slice),
                   absl::StrCat("slice ", slice_id,
                                " resumed on its own devices, nothing moved"));
  }
  // Elsewhere: as many devices as it has, none of its own (PlaceGrowth
  // with a map of nothing), the quota counted with it resumed.
  SliceRecord nowhere = slice;
  nowhere.devices.clear();
  absl::StatusOr<std::vector<DeviceRef>> placed =
      PlaceGrowth(*client, nowhere, n);
  if (!placed.ok()) {
    return absl::Status(
        placed.status().code(),
        absl::StrCat("resume: slice ", slice_id,
                     " stays suspended: ", placed.status().message()));
  }
  ResizePlan plan;
  plan.axis = std::clamp<int>(slice.elastic_axis, 0,
                              static_cast<int>(slice.mesh_shape.size()) - 1);
  plan.grown = *std::move(placed);
  plan.same_shape = true;
  slice.suspended = false;
  absl::StatusOr<SliceResized> moved = CommitResize(*client, slice, plan);
  if (!moved.ok()) {
    slice.suspended = true;
    return moved.status();
  }
  moved->freed_devices = true;  // its old ones
  moved->why = absl::StrCat(
      "slice ", slice_id, " resumed on other devices (its own were taken), ",
      moved->values_moved, " values moved (", moved->bytes_moved, " bytes)");
  return moved;
}

}  // namespace plexus
