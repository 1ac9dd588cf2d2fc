#include "plexus/server/model/cluster_state.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/donation.h"
#include "plexus/common/ids.h"
#include "plexus/common/names.h"
#include "plexus/common/status_proto.h"
#include "plexus/executors/builtin/catalogue.h"

namespace plexus {

bool OnOneHost(const SliceRecord& slice) {
  for (const DeviceRef& d : slice.devices) {
    if (d.worker_id != slice.devices.front().worker_id) return false;
  }
  return true;
}

WorkerRecord& ClusterState::AddWorker(const proto::RegisterWorker& info,
                                      absl::Time now, uint64_t generation) {
  int64_t id = next_worker_id_++;
  WorkerRecord& w = workers_[id];
  w.id = id;
  w.generation = generation;
  w.info = info;
  w.info.clear_inventory();
  w.last_heartbeat = now;
  w.device_load.assign(info.devices_size(), 0);
  UpdateLineagePolicy();
  JournalWorker(w);
  return w;
}

void ClusterState::UpdateLineagePolicy() {
  for (const auto& [id, w] : workers_) spares_seen_ |= w.info.spare();
  records_.set_keep_lineage(spares_seen_);
}

WorkerRecord* ClusterState::FindWorker(int64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

proto::WorkerOp ClusterState::PeerOp(const WorkerRecord& w) {
  proto::WorkerOp op;
  auto* p = op.mutable_peer();
  p->set_worker_id(w.id);
  p->set_machine_id(w.info.machine_id());
  p->set_data_address(w.info.data_address());
  p->set_unix_path(w.info.unix_path());
  p->set_generation(w.generation);
  return op;
}

bool ClusterState::ToldPeer(int64_t worker, int64_t peer) const {
  auto w = workers_.find(worker);
  if (w == workers_.end() || peer < 0) return false;
  const std::vector<uint64_t>& told = w->second.told_peers;
  const size_t word = static_cast<size_t>(peer) / 64;
  return word < told.size() && (told[word] >> (peer % 64) & 1) != 0;
}

void ClusterState::TellPeer(int64_t worker, int64_t peer) {
  auto w = workers_.find(worker);
  auto p = workers_.find(peer);
  if (w == workers_.end() || p == workers_.end() || ToldPeer(worker, peer)) {
    return;
  }
  std::vector<uint64_t>& told = w->second.told_peers;
  const size_t word = static_cast<size_t>(peer) / 64;
  if (word >= told.size()) told.resize(word + 1, 0);
  told[word] |= uint64_t{1} << (peer % 64);
  peer_ops_[worker].push_back(PeerOp(p->second));
}

void ClusterState::TellIslandWorkers(int64_t worker,
                                     const proto::ProgramDef& def) {
  for (const auto& island : def.xla().islands()) {
    for (int64_t on : island.workers()) TellPeer(worker, on);
  }
}

std::set<uint64_t> ClusterState::MarkWorkerDown(int64_t id,
                                                const std::string& reason) {
  std::set<uint64_t> clients;
  WorkerRecord* w = FindWorker(id);
  if (w == nullptr || !w->alive) return clients;
  w->alive = false;
  w->down_reason = reason;
  JournalWorkerGone(*w);
  if (w->info.spare()) UpdateLineagePolicy();
  for (auto& [sid, slice] : slices_) {
    for (const DeviceRef& d : slice.devices) {
      if (d.worker_id == id) {
        if (slice.broken.empty()) slice.broken = reason;
        JournalSlice(slice);
        clients.insert(slice.client_id);
        break;
      }
    }
  }
  return clients;
}

absl::Status ClusterState::CheckClientIdsLeft() const {
  if (next_client_id_ < kServerClientId) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "this server has given all of its ", kServerClientId - 1,
      " client ids (ids are never reused: a session's credential derives "
      "from its id); restart the server to serve new sessions"));
}

absl::StatusOr<uint64_t> ClusterState::ServerMadeIds(uint64_t client_id,
                                                     uint64_t count) {
  if (absl::Status s =
          CheckIdsLeft("the server's ids in its clients' namespaces (for "
                       "recovery's recomputations and snapshots)",
                       next_server_id_, count);
      !s.ok()) {
    return s;
  }
  const uint64_t first = ::plexus::ServerMadeId(client_id, next_server_id_);
  next_server_id_ += count;
  if (journal_ != nullptr) {
    proto::ModelRecord r;
    r.set_server_ids(next_server_id_);
    Journal(r);
  }
  return first;
}

ClientRecord& ClusterState::AddClient(const std::string& name,
                                      const std::string& tenant) {
  uint64_t id = next_client_id_++;
  ClientRecord& c = clients_[id];
  c.id = id;
  c.name = name;
  c.tenant = tenant;
  if (journal_ != nullptr) {
    proto::ModelRecord r;
    r.mutable_client()->set_client_id(id);
    r.mutable_client()->set_name(name);
    r.mutable_client()->set_tenant(tenant);
    Journal(r);
  }
  return c;
}

ClientRecord* ClusterState::FindClient(uint64_t id) {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

const ClientRecord* ClusterState::FindClient(uint64_t id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

std::set<int64_t> ClusterState::RemoveClient(uint64_t id) {
  std::set<int64_t> touched;
  ClientRecord* c = FindClient(id);
  if (c == nullptr) return touched;
  if (journal_ != nullptr) {
    proto::ModelRecord r;
    r.set_client_gone(id);
    Journal(r);
  }
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (ClientOfBuffer(it->first) == id) held_.erase(it);
    it = next;
  }
  for (uint64_t sid : c->slices) {
    auto it = slices_.find(sid);
    if (it == slices_.end()) continue;
    AddLoad(it->second.devices, -1);
    slices_.erase(it);
    ForgetAwaitedSlice(sid);
  }
  clients_.erase(id);
  records_.RemoveClient(id);
  for (auto sn = snapshots_.begin(); sn != snapshots_.end();) {
    auto next = std::next(sn);
    if (ClientOfBuffer(sn->first) == id) {
      snapshot_of_.erase(sn->second.id);
      snapshots_.erase(sn);
    }
    sn = next;
  }
  for (auto a = aliases_.begin(); a != aliases_.end();) {
    auto next = std::next(a);
    if (ClientOfBuffer(a->first) == id) aliases_.erase(a);
    a = next;
  }
  for (auto sup = superseded_.begin(); sup != superseded_.end();) {
    auto next = std::next(sup);
    if (ClientOfBuffer(sup->first) == id) superseded_.erase(sup);
    sup = next;
  }
  for (auto l = lost_.begin(); l != lost_.end();) {
    auto next = std::next(l);
    if (ClientOfBuffer(l->first) == id) lost_.erase(l);
    l = next;
  }
  // Its waiting slice requests go unanswered: nobody is left to answer.
  pending_slices_.erase(
      std::remove_if(pending_slices_.begin(), pending_slices_.end(),
                     [id](const PendingSlice& p) { return p.client_id == id; }),
      pending_slices_.end());
  // Every live worker: they may hold the client's buffers from slices it
  // already released, and its programs (which they unload).
  programs_unloaded_++;  // (SliceRecord::RouteCache)
  for (auto& [wid, w] : workers_) {
    if (w.alive) touched.insert(wid);
    for (auto p = w.loaded_programs.begin(); p != w.loaded_programs.end();) {
      p = ClientOfBuffer(*p) == id ? w.loaded_programs.erase(p) : std::next(p);
    }
  }
  return touched;
}

absl::Status ClusterState::RegisterClientProgram(
    uint64_t client_id, const proto::RegisterProgram& reg, WorkerOps* ops) {
  if (IsServerMade(reg.program_id())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "program '", reg.program().name(), "': program id ", reg.program_id(),
        " is one the server makes (bit ", kBufferIdClientShift - 1,
        " of the count set); a client counts its ids from 1"));
  }
  const builtin::KernelSignature* kernel =
      builtin::KernelCatalogue::Global().Find(reg.program().kernel());
  if (kernel != nullptr && kernel->server_only()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "program '", reg.program().name(), "': kernel '",
        reg.program().kernel(),
        "' is the server's own (it moves a suspended slice's values to and "
        "from files); a client's program may not use it"));
  }
  return RegisterProgram(client_id, reg, ops);
}

absl::Status ClusterState::RegisterProgram(uint64_t client_id,
                                           const proto::RegisterProgram& reg,
                                           WorkerOps* ops) {
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  const proto::ProgramDef& def = reg.program();
  // Checked first: the messages below name the program.
  if (absl::Status s = CheckProgramStrings(def); !s.ok()) return s;
  // Program ids are buffer-style ids: they name their client. Workers keep
  // loaded programs by id, so another client's id would reach its program.
  if (ClientOfBuffer(reg.program_id()) != client_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("program '", def.name(), "': program id ",
                     reg.program_id(), " belongs to another client"));
  }
  const builtin::KernelSignature* kernel =
      builtin::KernelCatalogue::Global().Find(def.kernel());
  const bool xla = def.kernel() == "xla";
  if (kernel == nullptr && !xla) {
    return absl::NotFoundError(absl::StrCat(
        "program '", def.name(), "': unknown kernel '", def.kernel(), "'"));
  }
  if (xla && (def.xla().module().empty() || def.xla().islands_size() == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", def.name(),
                     "': an XLA program needs a module and at "
                     "least one island"));
  }
  ProgramRecord rec;
  rec.def = def;
  rec.collective = kernel != nullptr && kernel->is_collective();
  for (int i = 0; i < def.inputs_size(); ++i) {
    auto a = FromProto(def.inputs(i));
    if (!a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("program '", def.name(),
                                                     "' argument ", i, ": ",
                                                     a.status().message()));
    }
    rec.inputs.push_back(*a);
  }
  for (int i = 0; i < def.outputs_size(); ++i) {
    auto a = FromProto(def.outputs(i));
    if (!a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "program '", def.name(), "' output ", i, ": ", a.status().message()));
    }
    rec.outputs.push_back(*a);
  }
  absl::StatusOr<std::vector<int>> donated =
      DonatedInputs(def, rec.inputs, rec.outputs);
  if (!donated.ok()) return donated.status();
  rec.donated = *std::move(donated);
  auto [slot, fresh] = client->programs.try_emplace(reg.program_id());
  if (!fresh) {
    client->replaced_layouts.push_back(std::move(slot->second.inputs));
    client->replaced_layouts.push_back(std::move(slot->second.outputs));
  }
  slot->second = std::move(rec);
  if (journal_ != nullptr) {
    proto::ModelRecord r;
    r.mutable_program()->set_client_id(client_id);
    *r.mutable_program()->mutable_program() = reg;
    Journal(r);
  }
  if (xla && ops != nullptr) {
    std::set<int64_t> targets;
    for (const auto& island : def.xla().islands()) {
      targets.insert(island.workers().begin(), island.workers().end());
    }
    // Hosts standing by have it ahead too: one that takes a lost host's
    // place then runs the program at once (recovery costs no compile).
    std::set<int64_t> standing_by;
    for (const auto& [id, w] : workers_) {
      if (StandsBy(w)) standing_by.insert(id);
    }
    targets.insert(standing_by.begin(), standing_by.end());
    for (int64_t worker_id : targets) {
      auto w = workers_.find(worker_id);
      if (w == workers_.end() || !w->second.alive ||
          !w->second.loaded_programs.insert(reg.program_id()).second) {
        continue;
      }
      proto::WorkerOp load;
      load.mutable_load()->set_program_id(reg.program_id());
      const bool stand_by = standing_by.count(worker_id) > 0;
      load.mutable_load()->set_stand_by(stand_by);
      *load.mutable_load()->mutable_program() = def;
      (*ops)[worker_id].push_back(std::move(load));
      // A host standing by loads the executable from a worker of an
      // island, if it can (XlaPrograms::LoadFromPeers).
      if (stand_by) TellIslandWorkers(worker_id, def);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const SliceRecord*> ClusterState::UsableSlice(
    uint64_t client_id, uint64_t slice_id,
    absl::FunctionRef<std::string()> what) {
  auto it = slices_.find(slice_id);
  if (it == slices_.end() || it->second.client_id != client_id) {
    return absl::NotFoundError(
        absl::StrCat(what(), ": slice ", slice_id,
                     " is not held by this client (released?)"));
  }
  if (!it->second.broken.empty()) {
    return absl::UnavailableError(absl::StrCat(
        what(), ": slice ", slice_id, " lost a host: ", it->second.broken));
  }
  return &it->second;
}

absl::Status ClusterState::RefuseOnSuspended(uint64_t client_id,
                                             const proto::ClientOp& op) const {
  uint64_t slice_id = 0;
  if (op.has_call()) {
    slice_id = op.call().slice_id();
  } else if (op.has_put()) {
    slice_id = op.put().slice_id();
  } else {
    return absl::OkStatus();
  }
  auto it = slices_.find(slice_id);
  if (it == slices_.end() || it->second.client_id != client_id ||
      !it->second.suspended) {
    return absl::OkStatus();  // routing says what else is wrong
  }
  // Refused: named only now (every call passes here: its program's name
  // made into a string each time was ~600 instructions of a call's).
  std::string what = "put";
  if (op.has_call()) {
    what = "call";
    if (const ClientRecord* c = FindClient(client_id)) {
      auto prog = c->programs.find(op.call().program_id());
      if (prog != c->programs.end()) {
        what = absl::StrCat("program '", prog->second.def.name(), "'");
      }
    }
  }
  if (!it->second.preempted.empty()) {  // held, not refused: not reached
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": slice ", slice_id, " is ", it->second.preempted));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": slice ", slice_id,
                   " is suspended (slice.suspend()); resume it first "
                   "(slice.resume())"));
}

absl::Status ClusterState::RoutePut(uint64_t client_id,
                                    const proto::PutDecl& put, WorkerOps* ops,
                                    proto::Recovery* reput) {
  if (ClientOfBuffer(put.buffer_id()) != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "put: buffer id ", put.buffer_id(), " belongs to another client"));
  }
  auto slice =
      UsableSlice(client_id, put.slice_id(), [] { return std::string("put"); });
  if (!slice.ok()) return slice.status();
  auto arg = FromProto(put.arg());
  if (!arg.ok()) return arg.status();
  if (arg->sharding.is_partial()) {
    return absl::InvalidArgumentError("put: an array cannot be put as partial");
  }
  const int n = static_cast<int>((*slice)->devices.size());
  if (put.slice_resizes() != (*slice)->resizes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "put: slice ", put.slice_id(), " was resized (to ", n,
        " devices) after this put's shards were cut; put it again"));
  }
  auto local = arg->Local(n);
  if (!local.ok()) return local.status();
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  const int64_t bytes = static_cast<int64_t>(local->byte_size()) * n;
  absl::Status quota =
      CheckBytesQuota(*client, bytes, [] { return std::string("put"); });
  if (!quota.ok()) return quota;
  RecordBuffer(*client, put.buffer_id(), bytes);
  records_.AddPut(put.buffer_id(), put.slice_id(), *arg);
  // Put by a map the slice has changed since (a host lost while the put
  // went out): every shard again, to where the map says now.
  if (reput != nullptr && put.slice_generation() < (*slice)->generation) {
    for (int j = 0; j < n; ++j) {
      reput->add_reput_ids(put.buffer_id());
      reput->add_reput_shards(j);
    }
  }
  for (int j = 0; j < n; ++j) {
    const DeviceRef& d = (*slice)->devices[j];
    proto::WorkerOp op;
    auto* decl = op.mutable_declare();
    decl->set_buffer_id(put.buffer_id());
    decl->set_shard(j);
    decl->set_device(d.device);
    *decl->mutable_spec() = ToProto(*local);
    (*ops)[d.worker_id].push_back(std::move(op));
  }
  return absl::OkStatus();
}

void ClusterState::FailCallOutputs(uint64_t client_id, const proto::Call& call,
                                   const absl::Status& status, WorkerOps* ops) {
  FailOnSlice(client_id, call.slice_id(),
              {call.output_ids().begin(), call.output_ids().end()}, status, ops,
              call.relay());
  for (uint64_t o : call.output_ids()) {
    // Not a live buffer a hostile call named as its output: that one stays.
    if (ClientOfBuffer(o) == client_id && records_.FindBuffer(o) == nullptr) {
      lost_[o] = status;
    }
  }
}

void ClusterState::FailRefusedPut(uint64_t client_id, const proto::PutDecl& put,
                                  const absl::Status& status,
                                  WorkerOps* ops) const {
  FailOnSlice(client_id, put.slice_id(), {put.buffer_id()}, status, ops);
}

void ClusterState::FailOnSlice(uint64_t client_id, uint64_t slice_id,
                               const std::vector<uint64_t>& ids,
                               const absl::Status& status, WorkerOps* ops,
                               bool relay) const {
  auto it = slices_.find(slice_id);
  if (it == slices_.end() || it->second.client_id != client_id) return;
  proto::WorkerOp op;
  for (uint64_t id : ids) {
    if (ClientOfBuffer(id) == client_id) op.mutable_fail()->add_buffer_ids(id);
  }
  if (op.fail().buffer_ids_size() == 0) return;
  *op.mutable_fail()->mutable_status() = StatusToProto(status);
  op.mutable_fail()->set_relay(relay);
  for (int64_t w : WorkersAClientMayAsk(it->second)) (*ops)[w].push_back(op);
}

std::set<int64_t> ClusterState::WorkersAClientMayAsk(
    const SliceRecord& slice) const {
  std::set<int64_t> workers(slice.dropped_workers.begin(),
                            slice.dropped_workers.end());
  for (const DeviceRef& d : slice.devices) workers.insert(d.worker_id);
  for (auto w = workers.begin(); w != workers.end();) {
    auto worker = workers_.find(*w);
    w = worker != workers_.end() && worker->second.alive ? std::next(w)
                                                         : workers.erase(w);
  }
  return workers;
}

absl::Status ClusterState::CheckBytesQuota(
    const ClientRecord& client, int64_t bytes,
    absl::FunctionRef<std::string()> what) const {
  const int64_t quota = PolicyOf(client).max_bytes;
  if (quota <= 0 || client.live_bytes + bytes <= quota) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      what(), ": ", bytes, " more bytes of buffers would bring client ",
      client.id, " (tenant '", client.tenant, "') to ",
      client.live_bytes + bytes, " live bytes, over its quota of ", quota,
      " (max_bytes); release buffers it no longer needs (drop their "
      "futures) or ask the operator for more"));
}

void ClusterState::RecordBuffer(ClientRecord& client, uint64_t id,
                                int64_t bytes) {
  auto [it, fresh] = client.buffer_bytes.try_emplace(id, bytes);
  if (!fresh) {
    client.live_bytes -= it->second;
    it->second = bytes;
  }
  client.live_bytes += bytes;
}

void ClusterState::ForgetBuffer(ClientRecord& client, uint64_t id) {
  auto it = client.buffer_bytes.find(id);
  if (it == client.buffer_bytes.end()) return;
  client.live_bytes -= it->second;
  client.buffer_bytes.erase(it);
}

void ClusterState::RouteRelease(uint64_t client_id,
                                const proto::ReleaseRef& release,
                                WorkerOps* ops) {
  // A buffer id names its owner; only the owner may release it (an id is
  // not a permission: another client's release would pull the buffer from
  // under calls that still read it).
  if (ClientOfBuffer(release.buffer_id()) != client_id) return;
  uint64_t id = release.buffer_id();
  if (!aliases_.empty()) {
    auto alias = aliases_.find(id);
    if (alias != aliases_.end()) {
      id = alias->second;
      aliases_.erase(alias);
    }
  }
  if (!lost_.empty()) lost_.erase(id);
  if (parked_values_ > 0) {
    if (ClientRecord* client = FindClient(client_id);
        client != nullptr && ReleaseParked(*client, id)) {
      return;  // read back and released at the resume
    }
  }
  if (!superseded_.empty()) {
    auto stale = superseded_.find(id);
    if (stale != superseded_.end()) {
      for (const auto& [old_id, slice] : stale->second) {
        ReleaseOps(old_id, slice, ops);
      }
      superseded_.erase(stale);
    }
  }
  if (ClientRecord* client = FindClient(client_id)) ForgetBuffer(*client, id);
  // Held back while a call holds it (it may have to run again).
  bool recorded = false;
  records_.Release(id, &recorded);
  if (!recorded) {
    ReleaseOps(id, release.slice_id(), ops);
    return;
  }
  DrainReleases(ops);
}

void ClusterState::ReleaseOps(uint64_t id, uint64_t slice_id, WorkerOps* ops,
                              SharedReleases* shared) {
  if (!snapshots_.empty()) {
    auto snap = snapshots_.find(id);
    if (snap != snapshots_.end()) {
      const Snapshot copy = std::move(snap->second);
      snapshots_.erase(snap);
      snapshot_of_.erase(copy.id);
      ReleaseCopyOps(copy, slice_id, ops);
    }
  }
  // Each worker once (no set: this runs for every release).
  auto it = slices_.find(slice_id);
  auto targets_of = [&](absl::InlinedVector<int64_t, 8>* targets) {
    if (it == slices_.end()) {
      for (auto& [w, record] : workers_) targets->push_back(w);
      return;
    }
    for (const DeviceRef& d : it->second.devices) {
      targets->push_back(d.worker_id);
    }
    if (targets->size() > 1) {
      if (!std::is_sorted(targets->begin(), targets->end())) {
        std::sort(targets->begin(), targets->end());
      }
      targets->erase(std::unique(targets->begin(), targets->end()),
                     targets->end());
    }
  };
  absl::InlinedVector<int64_t, 8> targets;
  if (shared != nullptr && it != slices_.end()) {
    // A slice's first release of this drain finds its live hosts; the
    // next ones only add their id. A slice on one host is not gathered.
    auto entry = shared->find(slice_id);
    if (entry == shared->end()) {
      targets_of(&targets);
      if (targets.size() > 1) {
        entry = shared->try_emplace(slice_id).first;
        ForEachLive(targets,
                    [&](int64_t w) { entry->second.hosts.push_back(w); });
      }
    }
    if (entry != shared->end() && entry->second.hosts.size() > 1) {
      entry->second.ids.push_back(id);
      return;
    }
  }
  if (targets.empty()) targets_of(&targets);
  // The targets are sorted, as are workers_ and *ops: each is walked once
  // beside them (a slice over H hosts costs O(H) steps here, not H
  // searches of two trees of H nodes each; issue 28).
  auto at = targets.empty() ? ops->end() : ops->lower_bound(targets.front());
  ForEachLive(targets, [&](int64_t w) {
    while (at != ops->end() && at->first < w) ++at;
    if (at == ops->end() || at->first != w) {
      at = ops->emplace_hint(at, std::piecewise_construct,
                             std::forward_as_tuple(w), std::forward_as_tuple());
    }
    auto& list = at->second;
    if (!list.empty() && list.back().has_release()) {
      list.back().mutable_release()->add_buffer_ids(id);
    } else {
      proto::WorkerOp op;
      op.mutable_release()->add_buffer_ids(id);
      list.push_back(std::move(op));
    }
  });
}

}  // namespace plexus
