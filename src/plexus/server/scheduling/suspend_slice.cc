// ClusterState::SuspendSlice and ResumeSlice: a slice parked (no calls, its
// devices counted for nothing) and placed again, on other devices if its
// own were taken, its values moved there by the resize core; or, suspended
// to files, its values written to the park directory and read back at the
// resume (the park and unpark kernels).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/ids.h"
#include "plexus/common/status_proto.h"
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

// Adds a resume's unparks (UnparkValues' `unparked`) to its answer `out`:
// the reads back after any moves, the new ids and losses in its note.
void MergeUnparked(SliceResized unparked, SliceResized& out) {
  for (auto& unit : unparked.work) out.work.push_back(std::move(unit));
  out.values_moved += unparked.values_moved;
  out.bytes_moved += unparked.bytes_moved;
  for (int i = 0; i < unparked.note.old_ids_size(); ++i) {
    out.note.add_old_ids(unparked.note.old_ids(i));
    out.note.add_new_ids(unparked.note.new_ids(i));
  }
  for (uint64_t id : unparked.note.lost_ids()) out.note.add_lost_ids(id);
  if (unparked.note.has_status()) {
    *out.note.mutable_status() = unparked.note.status();
  }
}

}  // namespace

absl::StatusOr<SliceResized> ClusterState::ChangeSlice(
    uint64_t client_id, const proto::SliceResize& req) {
  if (req.suspend()) {
    return SuspendSlice(client_id, req.slice_id(), req.to_files());
  }
  if (req.to_files()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice ", req.slice_id(), ": to_files goes with a suspend only"));
  }
  if (req.resume()) return ResumeSlice(client_id, req.slice_id());
  return ResizeSlice(client_id, req);
}

absl::StatusOr<SliceResized> ClusterState::SuspendSlice(uint64_t client_id,
                                                        uint64_t slice_id,
                                                        bool to_files,
                                                        bool by_server) {
  absl::StatusOr<SliceRecord*> found =
      OwnedSlice(slices_, client_id, slice_id, "suspend");
  if (!found.ok()) return found.status();
  SliceRecord& slice = **found;
  if (slice.suspended) {
    return absl::FailedPreconditionError(
        absl::StrCat("suspend: slice ", slice_id, " is already suspended",
                     slice.preempted.empty() ? "" : ": ", slice.preempted));
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
  if (to_files && park_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "suspend: slice ", slice_id,
        " cannot be suspended to files: the server has no park directory "
        "(plexus-server --park-dir, a directory every worker shares); "
        "suspend it in memory (to_files=False)"));
  }
  SliceResized parking;
  if (to_files) {
    ClientRecord* client = FindClient(client_id);
    if (client == nullptr) return absl::NotFoundError("unknown client");
    if (absl::Status s = ParkValues(*client, slice, parking, by_server);
        !s.ok()) {
      return s;
    }
  }
  slice.suspended = true;
  JournalSlice(slice);
  SliceResized out = InPlace(
      DescribeSlice(slice),
      to_files ? absl::StrCat("slice ", slice_id, " suspended to files (",
                              slice.devices.size(), " devices; ",
                              parking.values_moved, " values parked in ",
                              park_dir_, ", ", parking.bytes_moved, " bytes)")
               : absl::StrCat("slice ", slice_id, " suspended (",
                              slice.devices.size(),
                              " devices; its values kept where they are)"));
  out.freed_devices = true;  // for quotas and priorities
  out.work = std::move(parking.work);
  out.wait_ids = std::move(parking.wait_ids);
  out.parked_ids = std::move(parking.parked_ids);
  out.values_moved = parking.values_moved;
  out.bytes_moved = parking.bytes_moved;
  return out;
}

absl::Status ClusterState::ParkedStatus(uint64_t id, uint64_t slice_id) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "buffer ", id, " is parked in files while slice ", slice_id,
      " is suspended to files; resume the slice (slice.resume()) to read or "
      "use it"));
}

absl::StatusOr<uint64_t> ClusterState::ParkProgram(ClientRecord& client,
                                                   uint64_t id,
                                                   const ArgSpec& spec,
                                                   bool to_file) {
  absl::StatusOr<uint64_t> program = ServerMadeIds(client.id);
  if (!program.ok()) return program.status();
  proto::RegisterProgram reg;
  reg.set_program_id(*program);
  proto::ProgramDef& def = *reg.mutable_program();
  def.set_name(to_file ? "suspend: park a value in files"
                       : "resume: read a parked value back");
  def.set_kernel(to_file ? "park" : "unpark");
  (*def.mutable_attrs())["dir"].set_s(park_dir_);
  (*def.mutable_attrs())["key"].set_s(absl::StrCat("c", client.id, "-b", id));
  if (to_file) {
    *def.add_inputs() = ToProto(spec);
    *def.add_outputs() =
        ToProto(ArgSpec{{DType::kU8, {1}}, Sharding::Replicated()});
  } else {
    *def.add_outputs() = ToProto(spec);
  }
  if (absl::Status s = RegisterProgram(client.id, reg); !s.ok()) return s;
  return *program;
}

absl::Status ClusterState::ParkValues(ClientRecord& client, SliceRecord& slice,
                                      SliceResized& out, bool by_server) {
  std::vector<uint64_t> values;
  for (const auto& [id, b] : records_.buffers()) {
    if (b.slice_id == slice.id && !b.released) values.push_back(id);
  }
  std::sort(values.begin(), values.end());
  // Per value: its park call's id and its token's.
  absl::StatusOr<uint64_t> ids =
      ServerMadeIds(client.id, 2 * static_cast<uint64_t>(values.size()));
  if (!ids.ok()) return ids.status();
  const int n = static_cast<int>(slice.devices.size());
  for (size_t k = 0; k < values.size(); ++k) {
    const uint64_t id = values[k];
    const ArgSpec spec = records_.FindBuffer(id)->spec();
    absl::StatusOr<uint64_t> program = ParkProgram(client, id, spec, true);
    if (!program.ok()) return program.status();
    proto::Call call;
    call.set_call_id(*ids + 2 * k);
    call.set_slice_id(slice.id);
    call.set_program_id(*program);
    call.add_output_ids(*ids + 2 * k + 1);
    proto::InputRef* in = call.add_inputs();
    in->set_buffer_id(id);
    in->set_slice_id(slice.id);
    *in->mutable_arg() = ToProto(spec);
    WorkerOps ops;
    uint64_t seq = 0;
    // A value already lost stays as it is (lost, its cause kept): nothing
    // to park.
    if (!RouteCall(client.id, call, &ops, &seq).ok()) continue;
    out.work.push_back({seq, std::move(ops)});
    out.wait_ids.push_back(*ids + 2 * k + 1);
    out.parked_ids.push_back(id);
    // Its memory goes once its park is done (FinishPark), not before: a
    // park that fails leaves it where it is.
    parking_[seq] = {client.id, slice.id, id, spec,
                     by_server ? *ids + 2 * k + 1 : 0};
    out.values_moved++;
    absl::StatusOr<TensorSpec> local = spec.Local(n);
    out.bytes_moved += local.ok()
                           ? static_cast<int64_t>(local->byte_size()) * n
                           : static_cast<int64_t>(spec.global.byte_size());
  }
  slice.on_files = true;
  return absl::OkStatus();
}

void ClusterState::FinishPark(uint64_t seq, bool failed, WorkerOps* ops) {
  auto it = parking_.find(seq);
  if (it == parking_.end()) return;
  const Parking p = it->second;
  parking_.erase(it);
  if (p.token != 0 && FindClient(p.client_id) != nullptr) {
    // The server suspended the slice: no client waits on the token.
    proto::ReleaseRef release;
    release.set_buffer_id(p.token);
    release.set_slice_id(p.slice_id);
    RouteRelease(p.client_id, release, ops);
  }
  if (failed) return;  // the value stays in memory; the token said why
  ClientRecord* client = FindClient(p.client_id);
  auto slice = slices_.find(p.slice_id);
  // The slice resumed or gone meanwhile: the value stays (its file too).
  if (client == nullptr || slice == slices_.end() || !slice->second.suspended ||
      !slice->second.on_files) {
    return;
  }
  proto::Recovery& note = parked_notes_[p.client_id];
  note.set_worker_id(-1);
  note.set_resized(true);
  note.add_lost_ids(p.id);
  *note.mutable_status() = StatusToProto(ParkedStatus(p.id, p.slice_id));
  // Let go of meanwhile: released as its park read it (its file stays);
  // the client hears it as parked all the same (its suspend waits for it).
  const BufferRecord* b = records_.FindBuffer(p.id);
  if (b == nullptr || b->released) return;
  ForgetBuffer(*client, p.id);
  ReleaseOps(p.id, p.slice_id, ops);
  records_.Erase(p.id);
  lost_[p.id] = ParkedStatus(p.id, p.slice_id);
  slice->second.parked.push_back({p.id, p.spec, false});
  parked_values_++;
  JournalSlice(slice->second);
}

std::map<uint64_t, proto::Recovery> ClusterState::TakeParkedNotes() {
  return std::exchange(parked_notes_, {});
}

absl::Status ClusterState::UnparkValues(ClientRecord& client,
                                        SliceRecord& slice, SliceResized& out) {
  // Per value: its unpark call's id and the value's new id.
  absl::StatusOr<uint64_t> ids =
      ServerMadeIds(client.id, 2 * static_cast<uint64_t>(slice.parked.size()));
  if (!ids.ok()) return ids.status();
  const int n = static_cast<int>(slice.devices.size());
  WorkerOps releases;
  for (size_t k = 0; k < slice.parked.size(); ++k) {
    const SliceRecord::Parked& p = slice.parked[k];
    const uint64_t call_id = *ids + 2 * k, new_id = call_id + 1;
    absl::StatusOr<uint64_t> program = ParkProgram(client, p.id, p.spec, false);
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(slice.id);
    call.add_output_ids(new_id);
    WorkerOps ops;
    uint64_t seq = 0;
    absl::Status routed = program.status();
    if (routed.ok()) {
      call.set_program_id(*program);
      routed = RouteCall(client.id, call, &ops, &seq);
    }
    lost_.erase(p.id);
    parked_values_--;
    if (!routed.ok()) {
      lost_[p.id] =
          absl::Status(routed.code(),
                       absl::StrCat("buffer ", p.id,
                                    " could not be read back from files in "
                                    "slice ",
                                    slice.id, "'s resume: ", routed.message()));
      out.note.add_lost_ids(p.id);
      *out.note.mutable_status() = StatusToProto(lost_[p.id]);
      continue;
    }
    out.work.push_back({seq, std::move(ops)});
    out.values_moved++;
    absl::StatusOr<TensorSpec> local = p.spec.Local(n);
    out.bytes_moved += local.ok()
                           ? static_cast<int64_t>(local->byte_size()) * n
                           : static_cast<int64_t>(p.spec.global.byte_size());
    if (p.released) {
      // Let go of while parked: read back (its files go) and released.
      proto::ReleaseRef release;
      release.set_buffer_id(new_id);
      release.set_slice_id(slice.id);
      RouteRelease(client.id, release, &releases);
      continue;
    }
    for (auto& [from, to] : aliases_) {
      if (to == p.id) to = new_id;
    }
    aliases_[p.id] = new_id;
    out.note.add_old_ids(p.id);
    out.note.add_new_ids(new_id);
  }
  if (!releases.empty()) out.work.push_back({0, std::move(releases)});
  slice.parked.clear();
  slice.on_files = false;
  return absl::OkStatus();
}

SliceRecord* ClusterState::FindParked(const ClientRecord& client, uint64_t id,
                                      SliceRecord::Parked** parked) {
  if (parked_values_ <= 0) return nullptr;
  for (uint64_t sid : client.slices) {
    auto it = slices_.find(sid);
    if (it == slices_.end()) continue;
    for (SliceRecord::Parked& p : it->second.parked) {
      if (p.id != id) continue;
      if (parked != nullptr) *parked = &p;
      return &it->second;
    }
  }
  return nullptr;
}

bool ClusterState::ReleaseParked(ClientRecord& client, uint64_t id) {
  SliceRecord::Parked* p = nullptr;
  SliceRecord* slice = FindParked(client, id, &p);
  if (slice == nullptr) return false;
  p->released = true;
  JournalSlice(*slice);
  return true;
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
  // (Held by the server for a higher priority: shared as before it came.)
  const bool own_free =
      OwnDevicesFree(slice, PolicyOf(*client).priority, ClaimsByPriority(),
                     /*alone=*/slice.preempted.empty());
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
    const bool on_files = slice.on_files;
    SliceResized unparked;
    if (on_files) {
      if (absl::Status s = UnparkValues(*client, slice, unparked); !s.ok()) {
        return s;
      }
    }
    slice.suspended = false;
    slice.preempted.clear();  // its client's resume, where the server's
    JournalSlice(slice);
    SliceResized out = InPlace(
        DescribeSlice(slice),
        on_files ? absl::StrCat(
                       "slice ", slice_id, " resumed on its own devices, ",
                       unparked.values_moved, " values read back from files (",
                       unparked.bytes_moved, " bytes)")
                 : absl::StrCat("slice ", slice_id,
                                " resumed on its own devices, nothing moved"));
    MergeUnparked(std::move(unparked), out);
    return out;
  }
  // Held by the server for a higher priority: back on its own devices
  // only (ResumePreempted says why).
  if (!slice.preempted.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume: slice ", slice_id, " is ", slice.preempted));
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
  if (slice.on_files) {
    SliceResized unparked;
    if (absl::Status s = UnparkValues(*client, slice, unparked); !s.ok()) {
      return s;
    }
    JournalSlice(slice);
    absl::StrAppend(&moved->why, ", ", unparked.values_moved,
                    " values read back from files (", unparked.bytes_moved,
                    " bytes)");
    MergeUnparked(std::move(unparked), *moved);
  }
  return moved;
}

}  // namespace plexus
