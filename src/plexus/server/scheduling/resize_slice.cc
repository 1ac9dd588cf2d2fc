// ClusterState::ResizeSlice: a slice's devices change while the job runs,
// along one mesh axis; its live values move onto the new map.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/ids.h"
#include "plexus/common/status_proto.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/mesh_coords.h"

namespace plexus {
namespace {

// Why a value laid out as `spec` cannot live on `n` devices, or OK.
absl::Status FitsOnNewMap(uint64_t id, const ArgSpec& spec, int n,
                          int32_t others, uint64_t slice_id) {
  const std::string value =
      absl::StrCat("buffer ", id, " (", spec.ToString(), ")");
  if (spec.sharding.is_partial()) {
    return absl::FailedPreconditionError(
        absl::StrCat(value,
                     " is partial (a sum not yet reduced): all_reduce it, or "
                     "release it, before resizing slice ",
                     slice_id));
  }
  if (spec.sharding.is_mesh()) {
    return absl::UnimplementedError(absl::StrCat(
        value,
        " is laid out by a mesh PartitionSpec; resizing a slice that "
        "holds such a value is not supported yet: fetch or release it before "
        "resizing slice ",
        slice_id));
  }
  if (spec.Local(n).ok()) return absl::OkStatus();
  // Split: the sizes along the slice that would divide its dimension,
  // the first few (a bounded search: a dimension may be a huge prime).
  const int64_t rows = spec.global.shape[spec.sharding.axis];
  std::vector<int64_t> fits;
  const int64_t last = std::min<int64_t>(std::max<int64_t>(rows, others),
                                         int64_t{others} * 4096);
  for (int64_t k = others; k <= last && fits.size() < 8; k += others) {
    if (rows % k == 0) fits.push_back(k);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      value, " is split along its dimension ", spec.sharding.axis, " of ", rows,
      ", which ", n, " devices do not divide; sizes of slice ", slice_id,
      " that would: ", fits.empty() ? "none" : absl::StrJoin(fits, ", "),
      " (release the value, or lay it out otherwise, to resize to ", n, ")"));
}

}  // namespace

absl::StatusOr<uint64_t> ClusterState::MoveProgram(ClientRecord& client,
                                                   const ArgSpec& spec) {
  const proto::ArgDef def = ToProto(spec);
  std::string key;
  def.SerializeToString(&key);
  auto it = client.move_programs.find(key);
  if (it != client.move_programs.end()) return it->second;
  absl::StatusOr<uint64_t> id = ServerMadeIds(client.id);
  if (!id.ok()) return id.status();
  proto::RegisterProgram reg;
  reg.set_program_id(*id);
  reg.mutable_program()->set_name("resize: move a value");
  reg.mutable_program()->set_kernel("identity");
  *reg.mutable_program()->add_inputs() = def;
  *reg.mutable_program()->add_outputs() = def;
  if (absl::Status s = RegisterProgram(client.id, reg); !s.ok()) return s;
  client.move_programs.emplace(std::move(key), *id);
  return *id;
}

absl::StatusOr<SliceResized> ClusterState::ResizeSlice(
    uint64_t client_id, const proto::SliceResize& req) {
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  auto found = slices_.find(req.slice_id());
  if (found == slices_.end() || found->second.client_id != client_id) {
    return absl::NotFoundError(absl::StrCat("resize: slice ", req.slice_id(),
                                            " is not held by this client"));
  }
  SliceRecord& slice = found->second;
  if (!slice.broken.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resize: slice ", slice.id, " lost a host: ", slice.broken));
  }
  if (slice.suspended) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resize: slice ", slice.id, " is suspended; resume it first"));
  }
  if (!slice.awaiting.empty()) {
    return absl::UnavailableError(
        absl::StrCat("resize: slice ", slice.id,
                     " waits for a host to take a lost one's place (",
                     slice.awaiting, "); resize it once it is whole"));
  }
  const std::vector<int32_t>& mesh = slice.mesh_shape;
  const int n = static_cast<int>(slice.devices.size());
  const std::string where = absl::StrCat("slice ", slice.id, "'s mesh ",
                                         MeshToString(mesh, slice.axis_names));
  if (req.axis() < 0 || req.axis() >= static_cast<int>(mesh.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize: ", where, " has no axis ", req.axis()));
  }
  const int32_t others = n / mesh[req.axis()];
  if (req.num_devices() <= 0 || req.num_devices() % others != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("resize: ", where,
                     " keeps its other axes, so its size is a multiple "
                     "of ",
                     others, " (asked for ", req.num_devices(), ")"));
  }
  const int size = req.num_devices();
  if (size == n) {
    SliceResized out;
    out.slice = DescribeSlice(slice);
    return out;
  }
  // The values first: nothing changes if one cannot move.
  for (const auto& [id, b] : records_.buffers()) {
    if (b.slice_id != slice.id || b.released) continue;
    if (absl::Status s = FitsOnNewMap(id, b.spec(), size, others, slice.id);
        !s.ok()) {
      return s;
    }
  }
  ResizePlan plan;
  plan.axis = req.axis();
  const int32_t length = size / others;
  for (int32_t c = 0; c < std::min(length, mesh[req.axis()]); ++c) {
    plan.keep.push_back(c);
  }
  // The devices to grow by: a size past what the cluster has is refused
  // before anything the size of the request is made.
  if (size > n) {
    absl::StatusOr<std::vector<DeviceRef>> placed =
        PlaceGrowth(*client, slice, size - n);
    if (!placed.ok()) return placed.status();
    plan.grown = *std::move(placed);
  }
  return CommitResize(*client, slice, plan);
}

absl::StatusOr<SliceResized> ClusterState::ShrinkOnLoss(
    SliceRecord& slice, int64_t lost, const std::string& reason) {
  ClientRecord* client = FindClient(slice.client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  const std::vector<int32_t>& mesh = slice.mesh_shape;
  const int n = static_cast<int>(slice.devices.size());
  ResizePlan plan;
  plan.axis =
      std::clamp<int>(slice.elastic_axis, 0, static_cast<int>(mesh.size()) - 1);
  const int32_t others = n / mesh[plan.axis];
  // A position of the axis goes if one of its devices was on the host.
  std::vector<bool> gone(mesh[plan.axis], false);
  for (int v = 0; v < n; ++v) {
    if (slice.devices[v].worker_id == lost) {
      gone[CoordsOf(v, mesh)[plan.axis]] = true;
    }
  }
  for (int32_t c = 0; c < mesh[plan.axis]; ++c) {
    if (!gone[c]) plan.keep.push_back(c);
  }
  const int size = static_cast<int>(plan.keep.size()) * others;
  const int floor = std::max(slice.min_devices, others);
  if (size < floor) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it would shrink to ", size, " devices, under its minimum of ", floor,
        " (min_devices)"));
  }
  plan.on_loss = true;
  plan.lost_worker = lost;
  plan.lost_why =
      absl::StrCat("slice ", slice.id, " shrank from ", n, " to ", size,
                   " devices when worker ", lost, " was lost (", reason, ")");
  return CommitResize(*client, slice, plan);
}

std::vector<std::pair<uint64_t, SliceResized>> ClusterState::GrowSlices(
    std::map<uint64_t, std::string>* why_not) {
  // Slices suspended for a higher priority come back first: the devices
  // were theirs.
  std::vector<std::pair<uint64_t, SliceResized>> grown =
      ResumePreempted(why_not);
  for (auto& [sid, slice] : slices_) {
    const int n = static_cast<int>(slice.devices.size());
    if (!slice.grow || n >= slice.full_devices || !slice.broken.empty() ||
        !slice.awaiting.empty() || slice.suspended) {
      continue;
    }
    ClientRecord* client = FindClient(slice.client_id);
    if (client == nullptr || client->away) continue;
    const std::vector<int32_t>& mesh = slice.mesh_shape;
    const int axis = slice.elastic_axis;
    const int32_t others = n / mesh[axis];
    // As many whole positions as the free devices hold, fewer where a
    // value does not fit that size.
    std::string refused;
    for (int32_t add = (slice.full_devices - n) / others; add > 0; --add) {
      absl::StatusOr<std::vector<DeviceRef>> placed =
          PlaceGrowth(*client, slice, add * others);
      if (!placed.ok()) continue;
      ResizePlan plan;
      plan.axis = axis;
      for (int32_t c = 0; c < mesh[axis]; ++c) plan.keep.push_back(c);
      plan.grown = *std::move(placed);
      // Refused (a value the size does not divide) before anything changes.
      absl::StatusOr<SliceResized> resized = CommitResize(*client, slice, plan);
      if (!resized.ok()) {
        if (refused.empty()) refused = std::string(resized.status().message());
        continue;
      }
      counters_.set_slices_grown(counters_.slices_grown() + 1);
      resized->why = absl::StrCat(
          "slice ", sid, " grew back to ", resized->slice.devices_size(),
          " devices on devices that came free, ", resized->values_moved,
          " values moved (", resized->bytes_moved, " bytes)");
      grown.emplace_back(slice.client_id, *std::move(resized));
      refused.clear();
      break;
    }
    if (!refused.empty() && why_not != nullptr) (*why_not)[sid] = refused;
  }
  return grown;
}

absl::StatusOr<SliceResized> ClusterState::CommitResize(
    ClientRecord& client, SliceRecord& slice, const ResizePlan& plan) {
  const uint64_t client_id = client.id;
  const std::vector<int32_t> mesh = slice.mesh_shape;
  const int n = static_cast<int>(slice.devices.size());
  const int32_t others = n / mesh[plan.axis];
  const int32_t length =
      static_cast<int32_t>(plan.keep.size() + plan.grown.size() / others);
  const int size = length * others;
  SliceResized out;
  // The values that move; on a loss, those that cannot are lost.
  std::vector<uint64_t> values;
  std::map<uint64_t, std::string> lost;  // id: what became of it
  for (const auto& [id, b] : records_.buffers()) {
    if (b.slice_id != slice.id || b.released) continue;
    absl::Status fits =
        plan.same_shape ? absl::OkStatus()
                        : FitsOnNewMap(id, b.spec(), size, others, slice.id);
    if (!plan.on_loss) {
      if (!fits.ok()) return fits;
      values.push_back(id);
      continue;
    }
    const CallRecord* producer =
        b.producer == 0 ? nullptr : records_.FindCall(b.producer);
    if (!fits.ok()) {
      lost[id] = std::string(fits.message());
    } else if (b.spec().sharding.is_split()) {
      lost[id] = absl::StrCat(
          "split over the slice's devices, its rows on "
          "worker ",
          plan.lost_worker, " went with it");
    } else if (producer != nullptr && producer->failed) {
      lost[id] = "its call failed";
    } else {
      // Replicated, done or still running: every surviving device holds
      // (or computes) its own copy, and the move waits for it there. A
      // call the server has not heard is done may be (the workers report
      // completions up to report_queue.h's delay later, and the lost one
      // never will): a value its client already waited for must not be
      // lost. A call that fails with the host (a collective with it) fails
      // the moved value with its status.
      values.push_back(id);
    }
  }
  std::sort(values.begin(), values.end());
  std::vector<int32_t> new_mesh = mesh;
  new_mesh[plan.axis] = length;
  // The new map: the kept positions in order, then the grown ones.
  std::vector<DeviceRef> devices(size);
  size_t next_grown = 0;
  for (int v = 0; v < size; ++v) {
    std::vector<int32_t> c = CoordsOf(v, new_mesh);
    if (c[plan.axis] < static_cast<int32_t>(plan.keep.size())) {
      c[plan.axis] = plan.keep[c[plan.axis]];
      devices[v] = slice.devices[IndexOf(c, mesh)];
    } else {
      devices[v] = plan.grown[next_grown++];
    }
  }
  // Ids for each value's move (its call and its new buffer), all or none.
  absl::StatusOr<uint64_t> ids =
      ServerMadeIds(client_id, 2 * static_cast<uint64_t>(values.size()));
  if (!ids.ok()) return ids.status();

  // Commit. The old map stays addressable (a slice record of its own)
  // while the moves are routed from it and its copies released.
  const uint64_t old_map = next_slice_id_++;
  SliceRecord& before = slices_[old_map];
  before = slice;
  before.id = old_map;
  const std::set<int64_t> old_hosts = [&] {
    std::set<int64_t> hosts;
    for (const DeviceRef& d : before.devices) hosts.insert(d.worker_id);
    return hosts;
  }();
  AddLoad(slice.devices, -1);
  out.freed_devices = size < n;
  slice.devices = std::move(devices);
  slice.dropped_workers.clear();
  for (int64_t w : old_hosts) {
    if (!std::any_of(slice.devices.begin(), slice.devices.end(),
                     [&](const DeviceRef& d) { return d.worker_id == w; })) {
      slice.dropped_workers.push_back(w);
    }
  }
  slice.mesh_shape = new_mesh;
  slice.generation++;
  slice.resizes++;
  AddLoad(slice.devices, +1);
  JournalSlice(slice);
  const std::string stale = absl::StrCat(
      "was compiled for slice ", slice.id, " as it was before its resize to ",
      size,
      " devices; compile it again for the new size (plexus.jit does, "
      "on its next call)");
  for (auto& [pid, prog] : client.programs) {
    if (prog.def.kernel() != "xla") continue;
    std::set<int64_t> island_hosts;
    int island_devices = 0;
    for (const auto& island : prog.def.xla().islands()) {
      island_hosts.insert(island.workers().begin(), island.workers().end());
      island_devices +=
          island.devices_size() * std::max(1, island.workers_size());
    }
    if (island_hosts == old_hosts && island_devices == n) prog.stale = stale;
  }

  WorkerOps releases;
  auto drop_old = [&](uint64_t old_id) {
    // The old copy goes once the move (or a call still running) has read
    // it (the workers apply ops in order): released on the old map.
    ForgetBuffer(client, old_id);
    ReleaseOps(old_id, old_map, &releases);
    records_.Erase(old_id);
  };
  for (size_t k = 0; k < values.size(); ++k) {
    const uint64_t old_id = values[k];
    const uint64_t call_id = *ids + 2 * k, new_id = call_id + 1;
    const ArgSpec spec = records_.FindBuffer(old_id)->spec();
    absl::StatusOr<uint64_t> program = MoveProgram(client, spec);
    proto::Call call;
    call.set_call_id(call_id);
    call.set_slice_id(slice.id);
    call.add_output_ids(new_id);
    proto::InputRef* in = call.add_inputs();
    in->set_buffer_id(old_id);
    in->set_slice_id(old_map);
    *in->mutable_arg() = ToProto(spec);
    WorkerOps ops;
    uint64_t seq = 0;
    absl::Status routed = program.status();
    if (routed.ok()) {
      call.set_program_id(*program);
      routed = RouteCall(client_id, call, &ops, &seq);
    }
    if (!routed.ok()) {
      // A value already lost (its cause kept), or not expected (checked
      // above): it is lost, saying why.
      lost_[old_id] = absl::Status(
          routed.code(),
          absl::StrCat("buffer ", old_id, " could not move in slice ", slice.id,
                       "'s resize: ", routed.message()));
      out.note.add_lost_ids(old_id);
      *out.note.mutable_status() = StatusToProto(lost_[old_id]);
      continue;
    }
    for (auto& [from, to] : aliases_) {
      if (to == old_id) to = new_id;
    }
    aliases_[old_id] = new_id;
    out.note.add_old_ids(old_id);
    out.note.add_new_ids(new_id);
    out.values_moved++;
    // Over every device of the new map; a mesh-sharded value (a resume)
    // counts its global bytes.
    absl::StatusOr<TensorSpec> local = spec.Local(size);
    out.bytes_moved += local.ok()
                           ? static_cast<int64_t>(local->byte_size()) * size
                           : static_cast<int64_t>(spec.global.byte_size());
    drop_old(old_id);
    out.work.push_back({seq, std::move(ops)});
  }
  if (!lost.empty()) LoseOnShrink(client, plan, lost, out.note);
  for (const auto& [id, what] : lost) {
    drop_old(id);
    // A put's shards may still be on their way from a client that has not
    // heard of the shrink: released, they would wait at the old map's hosts
    // for a declaration that never comes. The id fails there instead, with
    // why, until the client lets go of it (ObjectStore::FailBuffer).
    FailOnSlice(client_id, old_map, {id}, lost_[id], &releases);
  }
  if (!releases.empty()) out.work.push_back({0, std::move(releases)});
  slices_.erase(old_map);
  out.slice = DescribeSlice(slice);
  out.note.set_worker_id(plan.on_loss ? plan.lost_worker : -1);
  out.note.set_resized(true);
  *out.note.add_remapped() = out.slice;
  return out;
}

void ClusterState::LoseOnShrink(const ClientRecord& client,
                                const ResizePlan& plan,
                                const std::map<uint64_t, std::string>& lost,
                                proto::Recovery& note) {
  // What calls not done compute from a lost value is lost too, on any
  // slice of the client's (in routing order: a call's inputs first).
  std::set<uint64_t> all;
  for (const auto& [id, what] : lost) all.insert(id);
  for (const auto& [seq, rec] : records_.calls()) {
    if (rec.client_id != client.id || (rec.done && !rec.failed)) continue;
    bool reads = false;
    for (const CallInput& in : rec.inputs) reads |= all.count(in.buffer_id) > 0;
    if (reads) all.insert(rec.output_ids.begin(), rec.output_ids.end());
  }
  constexpr size_t kNamed = 3;
  std::vector<std::string> names;
  for (const auto& [id, what] : lost) {
    if (names.size() == kNamed) break;
    names.push_back(absl::StrCat(NameOfBuffer(id), ": ", what));
  }
  const std::string more =
      lost.size() > kNamed
          ? absl::StrCat("; and ", lost.size() - kNamed, " more values")
          : "";
  const absl::Status status = absl::DataLossError(absl::StrCat(
      plan.lost_why, ". Lost with it: ", absl::StrJoin(names, "; "), more,
      all.size() > lost.size() ? ", and what was to be computed from them" : "",
      ". Compute them again on the new size (slice.resizes tells a loop "
      "that it changed)"));
  for (uint64_t id : all) {
    lost_[id] = status;
    note.add_lost_ids(id);
  }
  *note.mutable_status() = StatusToProto(status);
  counters_.set_buffers_failed(counters_.buffers_failed() +
                               static_cast<int64_t>(all.size()));
}

}  // namespace plexus
