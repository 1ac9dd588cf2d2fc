// ClusterState's journal and a restarted server's rebuild (cluster_state.h,
// "restart"): what is journaled, how it is restored, and how workers and
// clients that come back are taken in.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/ids.h"
#include "plexus/common/status_proto.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {

namespace {

proto::JournaledSlice ToJournal(const SliceRecord& slice) {
  proto::JournaledSlice j;
  j.set_slice_id(slice.id);
  j.set_client_id(slice.client_id);
  for (const DeviceRef& d : slice.devices) {
    proto::JournaledDevice* jd = j.add_devices();
    jd->set_worker_id(d.worker_id);
    jd->set_device(d.device);
  }
  for (int32_t m : slice.mesh_shape) j.add_mesh_shape(m);
  for (const std::string& a : slice.axis_names) j.add_axis_names(a);
  j.set_broken(slice.broken);
  j.set_generation(slice.generation);
  j.set_resizes(slice.resizes);
  j.set_on_loss(slice.on_loss);
  j.set_min_devices(slice.min_devices);
  j.set_grow(slice.grow);
  j.set_elastic_axis(slice.elastic_axis);
  j.set_full_devices(slice.full_devices);
  j.set_suspended(slice.suspended);
  j.set_on_files(slice.on_files);
  j.set_on_preempt(slice.on_preempt);
  j.set_preempted(slice.preempted);
  for (const SliceRecord::Parked& p : slice.parked) {
    // A value let go of while parked is read back and released: kept.
    proto::JournaledParked* jp = j.add_parked();
    jp->set_buffer_id(p.id);
    *jp->mutable_arg() = ToProto(p.spec);
    if (p.released) jp->set_released(true);
  }
  return j;
}

// A registration as the journal keeps it: no credential, no inventory.
proto::RegisterWorker Journaled(const proto::RegisterWorker& info) {
  proto::RegisterWorker kept = info;
  kept.clear_credential();
  kept.clear_inventory();
  kept.clear_kept_state();
  return kept;
}

// The layout input `k` of `call` names: its own, or, when it names none
// (proto InputRef.arg), the one `program` (null: unknown) registered.
absl::StatusOr<ArgSpec> InputLayout(const proto::Call& call, int k,
                                    const ProgramRecord* program) {
  const proto::InputRef& in = call.inputs(k);
  if (in.has_arg()) return FromProto(in.arg());
  if (program == nullptr || k >= static_cast<int>(program->inputs.size())) {
    return absl::NotFoundError("no layout");
  }
  return program->inputs[k];
}

}  // namespace

void ClusterState::JournalSlice(const SliceRecord& slice) {
  if (journal_ == nullptr) return;
  proto::ModelRecord r;
  *r.mutable_slice() = ToJournal(slice);
  Journal(r);
}

void ClusterState::ReserveTransfersSlow() {
  transfers_reserved_ = std::min(next_transfer_ + kTransferBlock, kMaxIdCount);
  proto::ModelRecord r;
  r.set_transfer_ids(transfers_reserved_);
  Journal(r);
}

void ClusterState::JournalWorker(const WorkerRecord& w) {
  if (journal_ == nullptr) return;
  proto::ModelRecord r;
  r.mutable_worker()->set_worker_id(w.id);
  r.mutable_worker()->set_generation(w.generation);
  *r.mutable_worker()->mutable_info() = Journaled(w.info);
  Journal(r);
}

void ClusterState::JournalWorkerGone(const WorkerRecord& w) {
  if (journal_ == nullptr) return;
  proto::ModelRecord r;
  r.mutable_worker_gone()->set_worker_id(w.id);
  r.mutable_worker_gone()->set_reason(w.down_reason);
  Journal(r);
}

absl::Status ClusterState::Restore(const proto::ModelRecord& change) {
  switch (change.change_case()) {
    case proto::ModelRecord::kWorker: {
      const proto::JournaledWorker& j = change.worker();
      WorkerRecord& w = workers_[j.worker_id()];
      const bool fresh = w.id == 0;
      w.id = j.worker_id();
      w.generation = j.generation();
      w.info = j.info();
      w.alive = false;
      w.away = true;
      w.down_reason = "not back since the server restarted";
      if (fresh) w.device_load.assign(w.info.devices_size(), 0);
      next_worker_id_ = std::max(next_worker_id_, w.id + 1);
      return absl::OkStatus();
    }
    case proto::ModelRecord::kWorkerGone: {
      WorkerRecord* w = FindWorker(change.worker_gone().worker_id());
      if (w == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("journal: worker ", change.worker_gone().worker_id(),
                         " gone before it registered"));
      }
      w->away = false;
      w->down_reason = change.worker_gone().reason();
      return absl::OkStatus();
    }
    case proto::ModelRecord::kClient: {
      const proto::JournaledClient& j = change.client();
      ClientRecord& c = clients_[j.client_id()];
      c.id = j.client_id();
      c.name = j.name();
      c.tenant = j.tenant();
      c.away = true;
      next_client_id_ = std::max(next_client_id_, c.id + 1);
      return absl::OkStatus();
    }
    case proto::ModelRecord::kClientGone:
      RemoveClient(change.client_gone());
      return absl::OkStatus();
    case proto::ModelRecord::kSlice: {
      const proto::JournaledSlice& j = change.slice();
      ClientRecord* c = FindClient(j.client_id());
      if (c == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("journal: slice ", j.slice_id(), " of client ",
                         j.client_id(), ", which is not restored"));
      }
      auto old = slices_.find(j.slice_id());
      if (old != slices_.end()) AddLoad(old->second.devices, -1);
      SliceRecord& slice = slices_[j.slice_id()];
      slice.id = j.slice_id();
      slice.client_id = j.client_id();
      slice.devices.clear();
      for (const proto::JournaledDevice& d : j.devices()) {
        if (FindWorker(d.worker_id()) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("journal: slice ", j.slice_id(), " on worker ",
                           d.worker_id(), ", which is not restored"));
        }
        slice.devices.push_back({d.worker_id(), d.device()});
      }
      slice.mesh_shape.assign(j.mesh_shape().begin(), j.mesh_shape().end());
      slice.axis_names.assign(j.axis_names().begin(), j.axis_names().end());
      slice.broken = j.broken();
      slice.generation = j.generation();
      slice.resizes = j.resizes();
      slice.on_loss = static_cast<proto::LossPolicy>(j.on_loss());
      slice.min_devices = j.min_devices();
      slice.grow = j.grow();
      slice.elastic_axis = j.elastic_axis();
      slice.full_devices = j.full_devices();
      slice.suspended = j.suspended();
      slice.on_files = j.on_files();
      slice.on_preempt = proto::PreemptPolicy_IsValid(j.on_preempt())
                             ? static_cast<proto::PreemptPolicy>(j.on_preempt())
                             : proto::PREEMPT_DEFAULT;
      slice.preempted = j.preempted();
      parked_values_ -= static_cast<int64_t>(slice.parked.size());
      slice.parked.clear();
      for (const proto::JournaledParked& jp : j.parked()) {
        absl::StatusOr<ArgSpec> spec = FromProto(jp.arg());
        if (!spec.ok()) {
          return absl::DataLossError(
              absl::StrCat("journal: slice ", slice.id, "'s parked buffer ",
                           jp.buffer_id(), ": ", spec.status().message()));
        }
        slice.parked.push_back({jp.buffer_id(), *spec, jp.released()});
        lost_[jp.buffer_id()] = ParkedStatus(jp.buffer_id(), slice.id);
        parked_values_++;
      }
      AddLoad(slice.devices, +1);
      c->slices.insert(slice.id);
      next_slice_id_ = std::max(next_slice_id_, slice.id + 1);
      return absl::OkStatus();
    }
    case proto::ModelRecord::kSliceGone: {
      auto it = slices_.find(change.slice_gone());
      if (it == slices_.end()) return absl::OkStatus();
      const uint64_t client = it->second.client_id;
      return ReleaseSlice(client, change.slice_gone());
    }
    case proto::ModelRecord::kProgram: {
      const proto::JournaledProgram& j = change.program();
      absl::Status s = RegisterProgram(j.client_id(), j.program(), nullptr);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("journal: program ", j.program().program_id(),
                         " of client ", j.client_id(), ": ", s.message()));
      }
      return absl::OkStatus();
    }
    case proto::ModelRecord::kServerIds:
      next_server_id_ = std::max(next_server_id_, change.server_ids());
      return absl::OkStatus();
    case proto::ModelRecord::kTransferIds:
      // Past every temporary the last run may have used (a block reserved
      // at the layout's end starts again at 1, as next_transfer_ does).
      next_transfer_ = change.transfer_ids() >= kMaxIdCount
                           ? 1
                           : std::max(next_transfer_, change.transfer_ids());
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("journal: an empty model record");
  }
}

void ClusterState::FinishRestore() {
  UpdateLineagePolicy();
  temporary_floor_ = next_transfer_;
  for (const auto& [id, w] : workers_) {
    next_worker_id_ = std::max(next_worker_id_, id + 1);
  }
}

proto::ModelSnapshot ClusterState::SnapshotRecords() const {
  proto::ModelSnapshot snap;
  for (const auto& [id, w] : workers_) {
    proto::ModelRecord* r = snap.add_records();
    r->mutable_worker()->set_worker_id(id);
    r->mutable_worker()->set_generation(w.generation);
    *r->mutable_worker()->mutable_info() = Journaled(w.info);
    if (!w.alive && !w.away) {
      r = snap.add_records();
      r->mutable_worker_gone()->set_worker_id(id);
      r->mutable_worker_gone()->set_reason(w.down_reason);
    }
  }
  for (const auto& [id, c] : clients_) {
    proto::ModelRecord* r = snap.add_records();
    r->mutable_client()->set_client_id(id);
    r->mutable_client()->set_name(c.name);
    r->mutable_client()->set_tenant(c.tenant);
    // In id order: a program registered again under its id is the last.
    std::map<uint64_t, const ProgramRecord*> programs;
    for (const auto& [pid, prog] : c.programs) programs[pid] = &prog;
    for (const auto& [pid, prog] : programs) {
      r = snap.add_records();
      r->mutable_program()->set_client_id(id);
      r->mutable_program()->mutable_program()->set_program_id(pid);
      *r->mutable_program()->mutable_program()->mutable_program() = prog->def;
    }
  }
  for (const auto& [id, slice] : slices_) {
    *snap.add_records()->mutable_slice() = ToJournal(slice);
  }
  snap.add_records()->set_server_ids(next_server_id_);
  if (transfers_reserved_ > 0) {
    snap.add_records()->set_transfer_ids(transfers_reserved_);
  }
  return snap;
}

WorkerRecord* ClusterState::ResumeWorker(const proto::RegisterWorker& info,
                                         uint64_t generation, absl::Time now) {
  WorkerRecord* w = FindWorker(info.previous_worker_id());
  if (w == nullptr || !w->away || w->generation != info.previous_generation() ||
      w->info.host_name() != info.host_name() ||
      w->info.devices_size() != info.devices_size()) {
    return nullptr;
  }
  w->away = false;
  w->alive = true;
  w->down_reason.clear();
  w->generation = generation;
  w->info = Journaled(info);
  w->last_heartbeat = now;
  for (const proto::HeldShard& h : info.inventory()) {
    held_[h.buffer_id()].emplace_back(w->id, h.shard());
  }
  // It kept the programs it had loaded: those whose islands name it.
  for (const auto& [cid, client] : clients_) {
    for (const auto& [pid, prog] : client.programs) {
      for (const auto& island : prog.def.xla().islands()) {
        for (int64_t on : island.workers()) {
          if (on == w->id) w->loaded_programs.insert(pid);
        }
      }
    }
  }
  JournalWorker(*w);
  return w;
}

bool ClusterState::WaitsForWorkers(uint64_t client_id) const {
  const ClientRecord* c = FindClient(client_id);
  if (c == nullptr) return false;
  for (uint64_t sid : c->slices) {
    auto it = slices_.find(sid);
    if (it == slices_.end()) continue;
    for (const DeviceRef& d : it->second.devices) {
      auto w = workers_.find(d.worker_id);
      if (w != workers_.end() && w->second.away) return true;
    }
  }
  return false;
}

std::vector<int64_t> ClusterState::AwayWorkers() const {
  std::vector<int64_t> away;
  for (const auto& [id, w] : workers_) {
    if (w.away) away.push_back(id);
  }
  return away;
}

void ClusterState::EndAway(int64_t worker_id) {
  WorkerRecord* w = FindWorker(worker_id);
  if (w == nullptr || !w->away) return;
  w->away = false;
  w->alive = true;  // for LoseWorker, which the caller runs now
}

absl::Status ClusterState::ResumeClient(uint64_t client_id) {
  ClientRecord* c = FindClient(client_id);
  if (c == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "client ", client_id, ": no such session in this server's journal"));
  }
  if (!c->away) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client_id, ": its session already resumed"));
  }
  c->away = false;
  c->resuming = true;
  return absl::OkStatus();
}

bool ClusterState::HeldWhole(uint64_t id, const SliceRecord& slice) const {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  for (int j = 0; j < static_cast<int>(slice.devices.size()); ++j) {
    const int64_t worker = slice.devices[j].worker_id;
    if (std::find(it->second.begin(), it->second.end(),
                  std::make_pair(worker, static_cast<int32_t>(j))) ==
        it->second.end()) {
      return false;
    }
  }
  return true;
}

proto::Recovery ClusterState::RestoreLiveBuffers(uint64_t client_id,
                                                 const proto::LiveBuffers& live,
                                                 WorkerOps* ops) {
  proto::Recovery note;
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr || !client->resuming) return note;
  for (const proto::LiveBuffer& b : live.buffers()) {
    const uint64_t id = b.buffer_id();
    if (ClientOfBuffer(id) != client_id) continue;  // not its to claim
    // Parked in files: the journal has it, not the workers.
    if (FindParked(*client, id) != nullptr) continue;
    // Routed anew in this session already (an op the client queued as the
    // session came back, which reached the server before its LiveBuffers):
    // it is being made, not missing.
    if (records_.FindBuffer(id) != nullptr) continue;
    auto slice = slices_.find(b.slice_id());
    auto arg = FromProto(b.arg());
    if (slice == slices_.end() || slice->second.client_id != client_id ||
        !arg.ok()) {
      client->missing.insert(id);
      continue;
    }
    const int n = static_cast<int>(slice->second.devices.size());
    auto local = arg->Local(n);
    if (!local.ok() || !slice->second.broken.empty() ||
        !HeldWhole(id, slice->second)) {
      // Shards some workers gave back stay listed (held_) until the batch
      // sent again says what makes the value: a put sent again keeps them
      // and puts only the others (RouteResentPut); a call sent again
      // releases them just before it makes the value anew, under its id,
      // on every worker (RouteResentCall); what nothing makes goes at the
      // end (`done`, below).
      client->missing.insert(id);
      if (client->missing_why.size() < 4) {
        std::string& why = client->missing_why[id];
        absl::StrAppend(&why, "buffer ", id, " on slice ", b.slice_id(),
                        " (workers by position:");
        for (const DeviceRef& d : slice->second.devices) {
          absl::StrAppend(&why, " ", d.worker_id);
        }
        absl::StrAppend(&why, "), given back:");
        if (auto held = held_.find(id); held != held_.end()) {
          for (const auto& [w, shard] : held->second) {
            absl::StrAppend(&why, " worker ", w, " shard ", shard, ";");
          }
        } else {
          absl::StrAppend(&why, " nothing");
        }
        if (!slice->second.broken.empty()) absl::StrAppend(&why, " (broken)");
      }
      continue;
    }
    RecordBuffer(*client, id, static_cast<int64_t>(local->byte_size()) * n);
    records_.AddRestored(id, b.slice_id(), *arg);
    client->resume_kept++;
  }
  if (!live.done()) return note;
  client->resuming = false;
  client->needed.clear();
  for (const proto::ReleaseRef& release :
       std::exchange(client->released_after_resend, {})) {
    RouteRelease(client_id, release, ops);
  }
  const absl::Status lost = absl::DataLossError(
      "the server restarted before this value was complete on its workers, "
      "and no call the client sent again makes it (a worker that did not "
      "come back held it, or it was being computed and its call was no "
      "longer kept by the client)");
  *note.mutable_status() = StatusToProto(lost);
  client->lost_detail.clear();
  for (uint64_t id : client->missing) {
    lost_.emplace(id, lost);
    note.add_lost_ids(id);
    if (auto why = client->missing_why.find(id);
        why != client->missing_why.end()) {
      absl::StrAppend(&client->lost_detail,
                      client->lost_detail.empty() ? "" : "; ", why->second);
    }
  }
  client->missing.clear();
  client->missing_why.clear();
  // What the workers gave back of this client that it no longer holds.
  for (auto it = held_.begin(); it != held_.end();) {
    auto next = std::next(it);
    if (ClientOfBuffer(it->first) == client_id) {
      if (records_.FindBuffer(it->first) == nullptr) {
        std::set<int64_t> workers;
        for (const auto& [w, shard] : it->second) workers.insert(w);
        for (int64_t w : workers) {
          proto::WorkerOp op;
          op.mutable_release()->add_buffer_ids(it->first);
          (*ops)[w].push_back(std::move(op));
        }
      }
      held_.erase(it);
    }
    it = next;
  }
  return note;
}

void ClusterState::PlanResent(
    uint64_t client_id,
    const google::protobuf::RepeatedPtrField<proto::ClientOp>& ops) {
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return;
  client->needed = client->missing;
  for (int i = ops.size() - 1; i >= 0; --i) {
    const proto::ClientOp& op = ops[i];
    if (!op.has_call()) continue;
    bool makes = false;
    for (uint64_t o : op.call().output_ids()) {
      makes |= client->needed.count(o) > 0;
    }
    if (!makes) continue;
    auto found = client->programs.find(op.call().program_id());
    const ProgramRecord* program =
        found == client->programs.end() ? nullptr : &found->second;
    for (int k = 0; k < op.call().inputs_size(); ++k) {
      const proto::InputRef& in = op.call().inputs(k);
      const uint64_t id = in.buffer_id();
      if (records_.FindBuffer(id) != nullptr) continue;
      // A value the client no longer holds that the workers gave back
      // whole: read as it is (the walk back stops there, and its id is
      // never declared twice on a worker), released at the resume's end.
      auto slice = slices_.find(in.slice_id());
      absl::StatusOr<ArgSpec> arg = InputLayout(op.call(), k, program);
      if (ClientOfBuffer(id) == client_id && slice != slices_.end() &&
          slice->second.client_id == client_id && arg.ok() &&
          slice->second.broken.empty() && HeldWhole(id, slice->second)) {
        const int n = static_cast<int>(slice->second.devices.size());
        auto local = arg->Local(n);
        if (local.ok()) {
          RecordBuffer(*client, id,
                       static_cast<int64_t>(local->byte_size()) * n);
          records_.AddRestored(id, in.slice_id(), *arg);
          proto::ReleaseRef& release =
              client->released_after_resend.emplace_back();
          release.set_buffer_id(id);
          release.set_slice_id(in.slice_id());
          continue;
        }
      }
      client->needed.insert(id);
    }
  }
}

absl::Status ClusterState::RouteResentCall(uint64_t client_id,
                                           const proto::Call& call,
                                           WorkerOps* ops, uint64_t* seq,
                                           bool* routed) {
  *routed = false;
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr) return absl::NotFoundError("unknown client");
  bool needed = false;
  for (uint64_t o : call.output_ids()) needed |= client->needed.count(o) > 0;
  if (!needed) return absl::OkStatus();
  for (const proto::InputRef& in : call.inputs()) {
    if (records_.FindBuffer(in.buffer_id()) != nullptr) continue;
    const absl::Status lost = absl::DataLossError(absl::StrCat(
        "the server restarted before this call ran everywhere, and its "
        "input buffer ",
        in.buffer_id(),
        " is no longer held (a donated input the call consumed on some "
        "worker, a value a worker that did not come back held, or one made "
        "by a call the client no longer kept)"));
    for (uint64_t o : call.output_ids()) {
      client->needed.erase(o);
      if (client->missing.erase(o) > 0) lost_.emplace(o, lost);
    }
    return lost;
  }
  // Shards of its outputs that workers gave back go first, on each
  // worker's stream ahead of the call: it makes them anew, under their ids.
  for (uint64_t o : call.output_ids()) {
    auto held = held_.find(o);
    if (held == held_.end()) continue;
    std::set<int64_t> workers;
    for (const auto& [w, shard] : held->second) workers.insert(w);
    for (int64_t w : workers) {
      proto::WorkerOp op;
      op.mutable_release()->add_buffer_ids(o);
      (*ops)[w].push_back(std::move(op));
    }
    held_.erase(held);
  }
  absl::Status s = RouteCall(client_id, call, ops, seq);
  if (!s.ok()) return s;
  *routed = true;
  client->resume_ran_again++;
  for (uint64_t o : call.output_ids()) {
    client->needed.erase(o);
    if (client->missing.erase(o) > 0) continue;
    // An output the client no longer holds: released once the calls sent
    // again that read it are routed (RestoreLiveBuffers' `done`).
    proto::ReleaseRef& release = client->released_after_resend.emplace_back();
    release.set_buffer_id(o);
    release.set_slice_id(call.slice_id());
  }
  return absl::OkStatus();
}

absl::Status ClusterState::RouteResentPut(uint64_t client_id,
                                          const proto::PutDecl& put,
                                          WorkerOps* ops,
                                          proto::Recovery* reput) {
  ClientRecord* client = FindClient(client_id);
  if (client == nullptr || client->needed.count(put.buffer_id()) == 0) {
    return absl::OkStatus();
  }
  // Shards a worker gave back whole stay where they are (the same bytes
  // under the same id): only the others are declared and put again.
  // Released and declared anew, a shard the client's put reached before
  // the release was answered "already there" by the old copy, the release
  // then dropped it, and the new declaration waited for bytes that never
  // came (a server killed inside a step hung the next one).
  std::set<std::pair<int64_t, int32_t>> kept;
  if (auto held = held_.find(put.buffer_id()); held != held_.end()) {
    kept.insert(held->second.begin(), held->second.end());
    held_.erase(held);
  }
  WorkerOps declared;
  if (absl::Status s = RoutePut(client_id, put, &declared); !s.ok()) {
    return s;
  }
  for (auto& [w, list] : declared) {
    for (proto::WorkerOp& op : list) {
      if (op.has_declare() && kept.count({w, op.declare().shard()}) > 0) {
        continue;
      }
      (*ops)[w].push_back(std::move(op));
    }
  }
  client->needed.erase(put.buffer_id());
  if (client->missing.erase(put.buffer_id()) == 0) {
    proto::ReleaseRef& release = client->released_after_resend.emplace_back();
    release.set_buffer_id(put.buffer_id());
    release.set_slice_id(put.slice_id());
  }
  client->resume_ran_again++;
  const SliceRecord& slice = slices_.at(put.slice_id());
  const int n = static_cast<int>(slice.devices.size());
  for (int j = 0; j < n; ++j) {
    if (kept.count({slice.devices[j].worker_id, j}) > 0) continue;
    reput->add_reput_ids(put.buffer_id());
    reput->add_reput_shards(j);
  }
  return absl::OkStatus();
}

}  // namespace plexus
