// ClusterState::LoseWorker and RecoverClient: a lost host's slices move to
// a spare, and what was lost with it is copied, recomputed or declared lost
// from the server's records (server/model/job_records.h).
#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/ids.h"
#include "plexus/common/status_proto.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {

WorkerLoss ClusterState::LoseWorker(int64_t id, const std::string& reason,
                                    absl::Time now, absl::Duration spare_wait) {
  WorkerLoss loss;
  loss.worker_id = id;
  loss.reason = reason;
  WorkerRecord* w = FindWorker(id);
  if (w == nullptr || !w->alive) return loss;
  w->alive = false;
  w->down_reason = reason;
  JournalWorkerGone(*w);
  counters_.set_hosts_lost(counters_.hosts_lost() + 1);
  const bool was_spare = w->info.spare();
  if (was_spare) UpdateLineagePolicy();
  std::set<uint64_t> affected;
  int32_t highest = -1;  // the highest device index of it a slice uses
  for (auto& [sid, slice] : slices_) {
    // Suspended to files: nothing of it is on the host; its resume places
    // it on live devices.
    if (slice.on_files) continue;
    bool on = false;
    for (const DeviceRef& d : slice.devices) {
      if (d.worker_id != id) continue;
      on = true;
      highest = std::max(highest, d.device);
    }
    if (!on) continue;
    affected.insert(sid);
    loss.clients.insert(slice.client_id);
  }
  if (affected.empty()) {
    // A host with no slice on it: a free spare takes its place as a host
    // that serves new slices (spares serve none), so the cluster keeps
    // its capacity (the embedded cluster starts a new spare for the pool).
    if (!was_spare) {
      for (auto& [wid, c] : workers_) {
        if (!c.alive || !c.info.spare() || c.slices_mapped > 0) continue;
        c.info.set_spare(false);
        JournalWorker(c);
        loss.promoted = wid;
        UpdateLineagePolicy();
        break;
      }
    }
    return loss;
  }
  WorkerRecord* spare = FindSpare(highest);
  if (spare != nullptr) {
    RemapOnto(loss, affected, *spare);
    return loss;
  }
  // No spare: a slice that shrinks on a loss goes on without the host's
  // positions of its elastic axis, unless that leaves it under its minimum.
  std::map<uint64_t, std::string> no_shrink;  // slice: why it broke instead
  for (auto it = affected.begin(); it != affected.end();) {
    SliceRecord& slice = slices_.at(*it);
    if (slice.on_loss != proto::LOSS_SHRINK || !slice.broken.empty()) {
      ++it;
      continue;
    }
    absl::StatusOr<SliceResized> shrunk = ShrinkOnLoss(slice, id, reason);
    if (!shrunk.ok()) {
      no_shrink[*it] = std::string(shrunk.status().message());
      ++it;
      continue;
    }
    counters_.set_slices_shrunk(counters_.slices_shrunk() + 1);
    loss.shrunk.emplace(*it, *std::move(shrunk));
    it = affected.erase(it);
  }
  if (affected.empty()) {
    UpdateLineagePolicy();
    return loss;
  }
  // A slice already broken (or waiting for another host: EndAwaited broke
  // it first) stays broken; one whose policy is to break, or that could
  // not shrink, breaks at once.
  bool may_wait = spare_wait > absl::ZeroDuration() && spares_seen_;
  for (uint64_t sid : affected) {
    const SliceRecord& slice = slices_.at(sid);
    may_wait &= slice.broken.empty() && slice.on_loss == proto::LOSS_WAIT;
  }
  if (may_wait) {
    AwaitedLoss& waiting = awaited_.emplace_back();
    waiting.highest = highest;
    waiting.since = now;
    waiting.deadline = now + spare_wait;
    for (uint64_t sid : affected) {
      SliceRecord& slice = slices_.at(sid);
      slice.awaiting = reason;
      slice.awaiting_since = now;
      slice.awaiting_until = waiting.deadline;
    }
    loss.awaiting = affected;
    waiting.loss = loss;
    counters_.set_losses_awaited(counters_.losses_awaited() + 1);
    return loss;
  }
  for (uint64_t sid : affected) {
    SliceRecord& slice = slices_.at(sid);
    auto why = no_shrink.find(sid);
    if (slice.broken.empty()) {
      slice.broken =
          why == no_shrink.end()
              ? reason
              : absl::StrCat(reason, "; it did not shrink: ", why->second);
    }
    JournalSlice(slice);
    loss.broken.insert(sid);
    counters_.set_slices_broken(counters_.slices_broken() + 1);
  }
  UpdateLineagePolicy();
  return loss;
}

WorkerRecord* ClusterState::FindSpare(int32_t highest) {
  WorkerRecord* spare = nullptr;
  for (auto& [wid, c] : workers_) {
    if (!c.alive || c.slices_mapped > 0 || c.info.devices_size() <= highest) {
      continue;
    }
    if (spare == nullptr || (c.info.spare() && !spare->info.spare())) {
      spare = &c;
    }
  }
  return spare;
}

void ClusterState::RemapOnto(WorkerLoss& loss, const std::set<uint64_t>& sids,
                             WorkerRecord& spare) {
  const int64_t id = loss.worker_id;
  for (uint64_t sid : sids) {
    SliceRecord& slice = slices_.at(sid);
    AddLoad(slice.devices, -1);
    for (DeviceRef& d : slice.devices) {
      if (d.worker_id == id) d.worker_id = spare.id;
    }
    AddLoad(slice.devices, +1);
    slice.generation++;
    slice.awaiting.clear();
    JournalSlice(slice);
    loss.remapped.insert(sid);
    counters_.set_slices_remapped(counters_.slices_remapped() + 1);
  }
  loss.spare = spare.id;
  spare.info.set_spare(false);  // a host like the others from now on
  JournalWorker(spare);
  UpdateLineagePolicy();
  // XLA programs name their islands' workers: the spare stands in for the
  // lost host (same device indices, so the same compile options).
  for (uint64_t c : loss.clients) {
    ClientRecord* client = FindClient(c);
    if (client == nullptr) continue;
    for (auto& [pid, prog] : client->programs) {
      if (prog.def.kernel() != "xla") continue;
      bool moved = false;
      for (auto& island : *prog.def.mutable_xla()->mutable_islands()) {
        for (int i = 0; i < island.workers_size(); ++i) {
          if (island.workers(i) != id) continue;
          island.set_workers(i, spare.id);
          moved = true;
        }
      }
      if (moved && journal_ != nullptr) {
        proto::ModelRecord r;
        r.mutable_program()->set_client_id(c);
        r.mutable_program()->mutable_program()->set_program_id(pid);
        *r.mutable_program()->mutable_program()->mutable_program() = prog.def;
        Journal(r);
      }
    }
  }
}

std::vector<WorkerLoss> ClusterState::ResumeAwaited() {
  std::vector<WorkerLoss> resumed;
  while (!awaited_.empty()) {
    AwaitedLoss& waiting = awaited_.front();
    WorkerRecord* spare = FindSpare(waiting.highest);
    if (spare == nullptr) break;  // the oldest first: none overtakes it
    WorkerLoss loss = std::move(waiting.loss);
    awaited_.pop_front();
    const std::set<uint64_t> sids = std::exchange(loss.awaiting, {});
    RemapOnto(loss, sids, *spare);
    counters_.set_losses_resumed(counters_.losses_resumed() + 1);
    resumed.push_back(std::move(loss));
  }
  return resumed;
}

std::vector<WorkerLoss> ClusterState::EndAwaited(absl::Time now, int64_t lost) {
  std::vector<WorkerLoss> ended;
  for (auto it = awaited_.begin(); it != awaited_.end();) {
    bool end = it->deadline <= now;
    for (uint64_t sid : it->loss.awaiting) {
      for (const DeviceRef& d : slices_.at(sid).devices) {
        end |= lost > 0 && d.worker_id == lost;
      }
    }
    if (!end) {
      ++it;
      continue;
    }
    WorkerLoss loss = std::move(it->loss);
    const std::string waited =
        it->deadline <= now
            ? absl::StrCat(" (no host took its place within ",
                           absl::FormatDuration(it->deadline - it->since), ")")
            : absl::StrCat(
                  " (no host took its place before the slice lost another, ",
                  absl::FormatDuration(
                      absl::Trunc(now - it->since, absl::Milliseconds(1))),
                  " later)");
    it = awaited_.erase(it);
    loss.reason += waited;
    for (uint64_t sid : std::exchange(loss.awaiting, {})) {
      SliceRecord& slice = slices_.at(sid);
      slice.awaiting.clear();
      if (slice.broken.empty()) slice.broken = loss.reason;
      JournalSlice(slice);
      loss.broken.insert(sid);
      counters_.set_slices_broken(counters_.slices_broken() + 1);
    }
    ended.push_back(std::move(loss));
  }
  if (!ended.empty()) UpdateLineagePolicy();
  return ended;
}

void ClusterState::ForgetAwaitedSlice(uint64_t slice_id) {
  for (auto it = awaited_.begin(); it != awaited_.end();) {
    it->loss.awaiting.erase(slice_id);
    it = it->loss.awaiting.empty() ? awaited_.erase(it) : std::next(it);
  }
}

bool ClusterState::HoldsAny(uint64_t client_id,
                            const std::set<uint64_t>& slice_ids) const {
  for (uint64_t sid : slice_ids) {
    auto it = slices_.find(sid);
    if (it != slices_.end() && it->second.client_id == client_id) return true;
  }
  return false;
}

bool ClusterState::Awaiting(uint64_t client_id) const {
  for (const AwaitedLoss& waiting : awaited_) {
    if (waiting.loss.clients.count(client_id) > 0) return true;
  }
  return false;
}

bool ClusterState::StandsBy(const WorkerRecord& w) const {
  return w.alive && w.slices_mapped == 0 && (spares_seen_ || w.info.spare());
}

std::vector<proto::WorkerOp> ClusterState::LoadsForStandby(int64_t worker_id) {
  std::vector<proto::WorkerOp> loads;
  WorkerRecord* w = FindWorker(worker_id);
  if (w == nullptr || !StandsBy(*w)) return loads;
  for (const auto& [cid, client] : clients_) {
    for (const auto& [pid, prog] : client.programs) {
      if (prog.def.kernel() != "xla" ||
          !w->loaded_programs.insert(pid).second) {
        continue;
      }
      proto::WorkerOp& load = loads.emplace_back();
      load.mutable_load()->set_program_id(pid);
      load.mutable_load()->set_stand_by(true);
      *load.mutable_load()->mutable_program() = prog.def;
      TellIslandWorkers(worker_id, prog.def);
    }
  }
  return loads;
}

void ClusterState::LoadStandbys(WorkerOps* ops) {
  for (const auto& [id, w] : workers_) {
    std::vector<proto::WorkerOp> loads = LoadsForStandby(id);
    if (loads.empty()) continue;
    auto& to = (*ops)[id];
    for (auto& load : loads) to.push_back(std::move(load));
  }
}

const proto::Call* ClusterState::Translated(
    const proto::Call& call, std::optional<proto::Call>* storage) const {
  if (aliases_.empty()) return nullptr;
  for (int i = 0; i < call.inputs_size(); ++i) {
    auto it = aliases_.find(call.inputs(i).buffer_id());
    if (it == aliases_.end()) continue;
    if (!storage->has_value()) storage->emplace(call);
    (*storage)->mutable_inputs(i)->set_buffer_id(it->second);
  }
  return storage->has_value() ? &**storage : nullptr;
}

std::map<uint64_t, std::vector<uint64_t>> ClusterState::TakeReleasedPuts() {
  std::map<uint64_t, std::vector<uint64_t>> by_client;
  for (uint64_t id : records_.TakeReleasedPuts()) {
    by_client[ClientOfBuffer(id)].push_back(id);
  }
  return by_client;
}

std::string ClusterState::NameOfBuffer(uint64_t id) const {
  const std::string name = absl::StrCat("buffer ", id);
  const BufferRecord* b = records_.FindBuffer(id);
  if (b == nullptr) return name;
  if (b->put) return absl::StrCat(name, " (put by its client)");
  const CallRecord* rec =
      b->producer != 0 ? records_.FindCall(b->producer) : nullptr;
  if (rec == nullptr) return name;
  const auto out =
      std::find(rec->output_ids.begin(), rec->output_ids.end(), id);
  std::string program = absl::StrCat("program ", rec->program_id);
  if (const ClientRecord* client = FindClient(rec->client_id)) {
    auto prog = client->programs.find(rec->program_id);
    if (prog != client->programs.end()) {
      program = absl::StrCat("program '", prog->second.def.name(), "'");
    }
  }
  return absl::StrCat(name, " (output ", out - rec->output_ids.begin(), " of ",
                      program, ", call ", rec->call_id, ")");
}

proto::Recovery ClusterState::LoseOnBrokenSlices(uint64_t client_id,
                                                 const WorkerLoss& loss) {
  proto::Recovery note;
  note.set_worker_id(loss.worker_id);
  std::set<uint64_t> lost;
  for (const auto& [id, b] : records_.buffers()) {
    if (ClientOfBuffer(id) == client_id && loss.broken.count(b.slice_id)) {
      lost.insert(id);
    }
  }
  if (lost.empty()) return note;
  // The values on the lost host that calls not done read: the error names
  // them (else those on it), so that each failure says which value it was.
  std::set<uint64_t> read;
  // In routing order: a call's inputs were routed before it.
  for (const auto& [seq, rec] : records_.calls()) {
    if (rec.client_id != client_id || (rec.done && !rec.failed)) continue;
    bool reads = false;
    for (const CallInput& in : rec.inputs) {
      if (lost.count(in.buffer_id) == 0) continue;
      if (loss.broken.count(in.slice_id) > 0) read.insert(in.buffer_id);
      reads = true;
    }
    if (reads) lost.insert(rec.output_ids.begin(), rec.output_ids.end());
  }
  const std::set<uint64_t>& named = read.empty() ? lost : read;
  constexpr size_t kNamed = 3;
  std::vector<std::string> names;
  for (uint64_t id : named) {
    if (names.size() == kNamed) break;
    names.push_back(NameOfBuffer(id));
  }
  const std::string more =
      named.size() > kNamed
          ? absl::StrCat(" and ", named.size() - kNamed, " more values were")
      : names.size() > 1 ? " were"
                         : " was";
  const absl::Status status = absl::DataLossError(absl::StrCat(
      "worker ", loss.worker_id, " was lost (", loss.reason,
      ") and no spare took its place: ", absl::StrJoin(names, ", "), more,
      " on a slice of it; what was to be computed from ",
      named.size() > 1 ? "them" : "it", " is lost too"));
  for (uint64_t id : lost) {
    lost_[id] = status;
    note.add_lost_ids(id);
  }
  for (uint64_t sid : loss.broken) {
    auto it = slices_.find(sid);
    if (it != slices_.end() && it->second.client_id == client_id) {
      note.add_broken_slices(sid);
    }
  }
  *note.mutable_status() = StatusToProto(status);
  counters_.set_buffers_failed(counters_.buffers_failed() +
                               static_cast<int64_t>(lost.size()));
  return note;
}

void ClusterState::CallDone(uint64_t seq, bool failed, WorkerOps* ops,
                            SharedReleases* shared) {
  records_.CallDone(seq, failed);
  DrainReleases(ops, shared);
  if (!parking_.empty()) FinishPark(seq, failed, ops);
}

// One client's recovery from one loss, as RecoverClient's steps go: what
// they have decided so far, read by the steps after them.
struct ClusterState::RecoveryPass {
  RecoveryPass(uint64_t client_id, const WorkerLoss& loss,
               std::vector<TakenWork> taken)
      : client_id(client_id),
        loss(loss),
        taken(std::move(taken)),
        lost_host(absl::StrCat("worker ", loss.worker_id)) {}
  bool Remapped(uint64_t slice_id) const {
    return loss.remapped.count(slice_id) > 0;
  }

  const uint64_t client_id;
  const WorkerLoss& loss;
  std::vector<TakenWork> taken;
  const std::string lost_host;
  ClientRecovery out;
  std::set<uint64_t> taken_seqs;     // calls of `taken`
  std::set<uint64_t> taken_outputs;  // their outputs, routed again (step 4)
  std::set<uint64_t> again;          // calls that run again (step 3)
  std::set<uint64_t> produced;       // their outputs
  std::set<uint64_t> restored;       // buffers copied back or put again
  // Snapshots still being made of values on a remapped slice (step 5).
  std::vector<uint64_t> incomplete;
  // Outputs run again that the client had released: released again.
  std::vector<uint64_t> release_new;
};

ClientRecovery ClusterState::RecoverClient(uint64_t client_id,
                                           const WorkerLoss& loss,
                                           std::vector<TakenWork> taken) {
  RecoveryPass r(client_id, loss, std::move(taken));
  DescribeLoss(r);
  NoteTakenWork(r);
  // 1. Calls not done that depend on the lost host run again.
  FindCallsToRunAgain(r);
  // 2. Buffers made before the loss with shards on it: copied, put again,
  // recomputed, or lost; snapshots whose copies were on it, made again.
  WorkerOps copies;
  for (const auto& [producer, id] : HitBuffers(r)) {
    RestoreBuffer(r, producer, id, &copies);
  }
  if (!copies.empty()) r.out.work.push_back({0, std::move(copies)});
  RecopySnapshots(r);
  // 3. The calls that run again, in their order, under new ids.
  for (uint64_t seq : CallsInOrder(r.again)) RunCallAgain(r, seq);
  WorkerOps releases;  // after all of them
  DrainReleases(&releases);
  if (!releases.empty()) r.out.work.push_back({0, std::move(releases)});
  // 4. What had not reached the workers, routed again on the new map.
  RouteTakenAgain(r);
  // 5. Snapshots still being made, asked for again.
  RemakeSnapshots(r);
  ReleaseRunAgainOutputs(r);
  return std::move(r.out);
}

void ClusterState::DescribeLoss(RecoveryPass& r) const {
  proto::Recovery& note = r.out.note;
  note.set_worker_id(r.loss.worker_id);
  for (uint64_t sid : r.loss.remapped) {
    auto it = slices_.find(sid);
    if (it != slices_.end() && it->second.client_id == r.client_id) {
      *note.add_remapped() = DescribeSlice(it->second);
    }
  }
  for (uint64_t sid : r.loss.broken) {
    auto it = slices_.find(sid);
    if (it != slices_.end() && it->second.client_id == r.client_id) {
      note.add_broken_slices(sid);
    }
  }
}

void ClusterState::NoteTakenWork(RecoveryPass& r) {
  // Loads that never reached their workers are sent again with the work.
  for (const TakenWork& t : r.taken) {
    for (const auto& [w, program] : t.unsent_loads) {
      auto it = workers_.find(w);
      if (it != workers_.end()) it->second.loaded_programs.erase(program);
      programs_unloaded_++;  // (SliceRecord::RouteCache)
    }
  }
  for (const TakenWork& t : r.taken) {
    if (t.call_seq == 0) continue;
    r.taken_seqs.insert(t.call_seq);
    if (const CallRecord* rec = records_.FindCall(t.call_seq)) {
      for (uint64_t o : rec->output_ids) r.taken_outputs.insert(o);
    }
  }
}

void ClusterState::FindCallsToRunAgain(RecoveryPass& r) const {
  for (const auto& [seq, rec] : records_.calls()) {
    // A call that failed may have failed for the loss (a peer's push
    // broke before the server declared the host down): it runs again too.
    if (rec.client_id != r.client_id || (rec.done && !rec.failed) ||
        r.taken_seqs.count(seq)) {
      continue;
    }
    bool depends = r.Remapped(rec.slice_id);
    for (const CallInput& in : rec.inputs) {
      depends |= r.Remapped(in.slice_id) || r.produced.count(in.buffer_id) > 0;
    }
    if (!depends) continue;
    r.again.insert(seq);
    for (uint64_t o : rec.output_ids) r.produced.insert(o);
  }
}

std::vector<std::pair<uint64_t, uint64_t>> ClusterState::HitBuffers(
    const RecoveryPass& r) const {
  std::vector<std::pair<uint64_t, uint64_t>> hit;  // (producer, id)
  for (const auto& [id, b] : records_.buffers()) {
    if (ClientOfBuffer(id) != r.client_id || !r.Remapped(b.slice_id) ||
        r.produced.count(id) > 0 || r.taken_outputs.count(id) > 0) {
      continue;
    }
    hit.emplace_back(b.producer, id);
  }
  std::sort(hit.begin(), hit.end());
  // Each after the hit values its producer reads (a recomputation finds
  // its inputs recovered): a value recomputed after an earlier loss has a
  // newer producer than calls that read it, so the producers' order alone
  // is not enough.
  std::map<uint64_t, uint64_t> producer_of;
  for (const auto& [p, id] : hit) producer_of[id] = p;
  std::vector<std::pair<uint64_t, uint64_t>> ordered;
  std::set<uint64_t> placed;
  std::function<void(uint64_t)> place = [&](uint64_t id) {
    if (!placed.insert(id).second) return;
    const uint64_t p = producer_of.at(id);
    if (const CallRecord* rec = p != 0 ? records_.FindCall(p) : nullptr) {
      for (const CallInput& in : rec->inputs) {
        if (producer_of.count(in.buffer_id) > 0) place(in.buffer_id);
      }
    }
    ordered.emplace_back(p, id);
  };
  for (const auto& [p, id] : hit) place(id);
  return ordered;
}

bool ClusterState::AvailableAfterLoss(const RecoveryPass& r,
                                      uint64_t id) const {
  if (lost_.count(id) > 0) return false;
  const BufferRecord* b = records_.FindBuffer(id);
  if (b == nullptr) return false;  // released: its bytes are gone
  return !r.Remapped(b->slice_id) || r.restored.count(id) > 0 ||
         r.produced.count(id) > 0 || r.taken_outputs.count(id) > 0;
}

void ClusterState::RestoreBuffer(RecoveryPass& r, uint64_t producer,
                                 uint64_t id, WorkerOps* copies) {
  const BufferRecord& b = *records_.FindBuffer(id);
  const SliceRecord& slice = slices_.at(b.slice_id);
  const int n = static_cast<int>(slice.devices.size());
  const int64_t spare = r.loss.spare;
  // The spare holds exactly the shards that were on the lost host.
  int survivor = -1;
  for (int k = 0; k < n; ++k) {
    if (slice.devices[k].worker_id != spare) survivor = k;
  }
  if (b.spec().sharding.is_replicated() && survivor >= 0) {
    auto local = b.spec().Local(n);
    for (int j = 0; j < n && local.ok(); ++j) {
      const DeviceRef& dst = slice.devices[j];
      if (dst.worker_id != spare) continue;
      CopyShard(id, survivor, slice.devices[survivor].worker_id, id, j, dst,
                *local, /*report=*/false, copies);
    }
    r.restored.insert(id);
    counters_.set_buffers_restored(counters_.buffers_restored() + 1);
    return;
  }
  auto snap = snapshots_.find(id);
  bool from_snapshot = snap != snapshots_.end() && snap->second.complete();
  for (int j = 0; j < n && from_snapshot; ++j) {
    if (slice.devices[j].worker_id != spare) continue;
    const WorkerRecord* holder = FindWorker(snap->second.holders[j]);
    from_snapshot = holder != nullptr && holder->alive;
  }
  if (from_snapshot) {
    auto local = b.spec().Local(n);
    for (int j = 0; j < n && local.ok(); ++j) {
      const DeviceRef& dst = slice.devices[j];
      if (dst.worker_id != spare) continue;
      CopyShard(snap->second.id, j, snap->second.holders[j], id, j, dst, *local,
                /*report=*/false, copies);
      counters_.set_shards_from_snapshots(counters_.shards_from_snapshots() +
                                          1);
    }
    r.restored.insert(id);
    counters_.set_buffers_restored(counters_.buffers_restored() + 1);
    return;
  }
  if (b.put) {
    // The client kept the data: the spare declares the lost shards, the
    // client puts them again.
    auto local = b.spec().Local(n);
    for (int j = 0; j < n && local.ok(); ++j) {
      const DeviceRef& d = slice.devices[j];
      if (d.worker_id != spare) continue;
      proto::WorkerOp op;
      auto* decl = op.mutable_declare();
      decl->set_buffer_id(id);
      decl->set_shard(j);
      decl->set_device(d.device);
      *decl->mutable_spec() = ToProto(*local);
      (*copies)[d.worker_id].push_back(std::move(op));
      r.out.note.add_reput_ids(id);
      r.out.note.add_reput_shards(j);
      counters_.set_shards_reput(counters_.shards_reput() + 1);
    }
    r.restored.insert(id);
    return;
  }
  RecomputeOrLose(r, producer, id);
}

void ClusterState::RecomputeOrLose(RecoveryPass& r, uint64_t producer,
                                   uint64_t id) {
  const CallRecord* p = producer != 0 ? records_.FindCall(producer) : nullptr;
  std::string why;
  if (p == nullptr) {
    why = "the call that made it is no longer recorded";
  } else {
    for (const CallInput& in : p->inputs) {
      if (!AvailableAfterLoss(r, in.buffer_id)) {
        why = absl::StrCat("its input ", NameOfBuffer(in.buffer_id),
                           " is gone too");
        break;
      }
    }
  }
  if (why.empty()) {
    r.again.insert(producer);
    for (uint64_t o : p->output_ids) r.produced.insert(o);
    return;
  }
  const absl::Status status = absl::DataLossError(absl::StrCat(
      NameOfBuffer(id), " had shards on ", r.lost_host, ", which was lost (",
      r.loss.reason, "), and cannot be recomputed: ", why));
  lost_[id] = status;
  r.out.note.add_lost_ids(id);
  *r.out.note.mutable_status() = StatusToProto(status);
  counters_.set_buffers_failed(counters_.buffers_failed() + 1);
}

void ClusterState::RecopySnapshots(RecoveryPass& r) {
  // Snapshots still being made, of values on a remapped slice: made again
  // in step 5.
  for (const auto& [id, snap] : snapshots_) {
    if (ClientOfBuffer(id) != r.client_id || snap.complete()) continue;
    const BufferRecord* b = records_.FindBuffer(id);
    if (b == nullptr || r.Remapped(b->slice_id)) r.incomplete.push_back(id);
  }
  // Complete snapshots whose copy of a shard was on the lost host: the
  // shard is copied again, from where it lives now, to the next shard's
  // host.
  WorkerOps recopies;
  for (auto& [id, snap] : snapshots_) {
    // One still being made is made again whole (step 5).
    if (ClientOfBuffer(id) != r.client_id || !snap.complete()) continue;
    const BufferRecord* b = records_.FindBuffer(id);
    auto slice = b == nullptr ? slices_.end() : slices_.find(b->slice_id);
    if (slice == slices_.end() || !slice->second.broken.empty()) continue;
    const std::vector<DeviceRef>& devices = slice->second.devices;
    const int n = static_cast<int>(devices.size());
    auto local = b->spec().Local(n);
    for (int j = 0; j < n && local.ok(); ++j) {
      if (j >= static_cast<int>(snap.holders.size()) ||
          snap.holders[j] != r.loss.worker_id) {
        continue;
      }
      std::optional<DeviceRef> holder = SnapshotHolder(devices, j);
      if (!holder.has_value()) continue;
      // Incomplete until the copy arrives (CopyArrived): the shard has one
      // copy meanwhile, and `snapshot_recopies_pending` says so.
      CopyShard(id, j, devices[j].worker_id, snap.id, j, *holder, *local,
                /*report=*/true, &recopies);
      snap.holders[j] = holder->worker_id;
      snap.arrived--;
      snap.recopies++;
    }
  }
  if (!recopies.empty()) r.out.work.push_back({0, std::move(recopies)});
}

std::vector<uint64_t> ClusterState::CallsInOrder(
    const std::set<uint64_t>& seqs) const {
  // Each after the calls of `seqs` that make its inputs.
  std::vector<uint64_t> order;
  std::set<uint64_t> placed;
  std::function<void(uint64_t)> place = [&](uint64_t seq) {
    if (!placed.insert(seq).second) return;
    if (const CallRecord* rec = records_.FindCall(seq)) {
      for (const CallInput& in : rec->inputs) {
        const BufferRecord* b = records_.FindBuffer(in.buffer_id);
        if (b != nullptr && seqs.count(b->producer) > 0) place(b->producer);
      }
    }
    order.push_back(seq);
  };
  for (uint64_t seq : seqs) place(seq);
  return order;
}

void ClusterState::RunCallAgain(RecoveryPass& r, uint64_t seq) {
  const CallRecord* rec = records_.FindCall(seq);
  if (rec == nullptr) return;
  proto::Recovery& note = r.out.note;
  proto::Call call = rec->ToCall();
  const std::vector<uint64_t> old_outputs(call.output_ids().begin(),
                                          call.output_ids().end());
  absl::StatusOr<uint64_t> ids =
      ServerMadeIds(r.client_id, 1 + old_outputs.size());
  if (!ids.ok()) {
    // No new ids (after 2^39 of them): its outputs are lost, under their
    // old ids, and so is what reads them (RouteCall refuses it).
    WorkerOps ops;
    FailCallOutputs(r.client_id, call, ids.status(), &ops);
    for (uint64_t o : old_outputs) {
      lost_[o] = ids.status();
      note.add_lost_ids(o);
    }
    *note.mutable_status() = StatusToProto(ids.status());
    counters_.set_buffers_failed(counters_.buffers_failed() +
                                 static_cast<int64_t>(old_outputs.size()));
    records_.Drop(seq);
    if (!ops.empty()) r.out.work.push_back({0, std::move(ops)});
    return;
  }
  call.set_call_id(*ids);
  for (int o = 0; o < call.output_ids_size(); ++o) {
    const uint64_t old_id = call.output_ids(o);
    const uint64_t new_id = *ids + 1 + static_cast<uint64_t>(o);
    call.set_output_ids(o, new_id);
    for (auto& [from, to] : aliases_) {
      if (to == old_id) to = new_id;
    }
    aliases_[old_id] = new_id;
    note.add_old_ids(old_id);
    note.add_new_ids(new_id);
  }
  WorkerOps ops;
  uint64_t new_seq = 0;
  absl::Status routed = RouteCall(r.client_id, call, &ops, &new_seq);
  if (routed.ok()) {
    counters_.set_calls_recomputed(counters_.calls_recomputed() + 1);
    note.set_calls_recomputed(note.calls_recomputed() + 1);
  } else {
    FailCallOutputs(r.client_id, call, routed, &ops);
    for (uint64_t o : call.output_ids()) lost_[o] = routed;
  }
  // The old outputs live on under the new ids: their records go (one the
  // client released waits for the calls that still read it, below).
  for (size_t o = 0; o < old_outputs.size(); ++o) {
    const uint64_t new_id = call.output_ids(static_cast<int>(o));
    // Calls done that hold it for their lineage hold the new one.
    if (routed.ok()) records_.Rename(old_outputs[o], new_id);
    SupersedeOutput(r, old_outputs[o], new_id);
  }
  records_.Drop(seq);
  r.out.work.push_back({new_seq, std::move(ops)});
}

void ClusterState::SupersedeOutput(RecoveryPass& r, uint64_t old_id,
                                   uint64_t new_id) {
  const BufferRecord* ob = records_.FindBuffer(old_id);
  // No record: the client released it and nothing read it; the new one is
  // released too (nobody else will).
  if (ob == nullptr || ob->released) {
    r.release_new.push_back(new_id);
    return;
  }
  if (ClientRecord* client = FindClient(r.client_id)) {
    ForgetBuffer(*client, old_id);
  }
  // Its entries stay on the workers until the client releases the old id:
  // a read of it that has not heard of the new one yet finds them (failed,
  // or the same value) instead of waiting for a key released under it.
  std::vector<std::pair<uint64_t, uint64_t>>& stale = superseded_[new_id];
  stale.emplace_back(old_id, ob->slice_id);
  auto older = superseded_.find(old_id);
  if (older != superseded_.end()) {
    stale.insert(stale.end(), older->second.begin(), older->second.end());
    superseded_.erase(older);
  }
  records_.Erase(old_id);
}

void ClusterState::RouteTakenAgain(RecoveryPass& r) {
  for (TakenWork& t : r.taken) {
    if (t.call_seq != 0) {
      const CallRecord* rec = records_.FindCall(t.call_seq);
      if (rec == nullptr) continue;
      const proto::Call call = rec->ToCall();
      WorkerOps ops;
      uint64_t new_seq = 0;
      absl::Status routed = RouteCall(r.client_id, call, &ops, &new_seq);
      if (!routed.ok()) FailCallOutputs(r.client_id, call, routed, &ops);
      records_.Drop(t.call_seq);
      DrainReleases(&ops);
      r.out.work.push_back({routed.ok() ? new_seq : 0, std::move(ops)});
      continue;
    }
    WorkerOps ops = std::move(t.ops);
    ops.erase(r.loss.worker_id);
    for (uint64_t id : t.release_ids) ReleaseOps(id, 0, &ops);
    if (!ops.empty()) r.out.work.push_back({0, std::move(ops)});
  }
}

void ClusterState::RemakeSnapshots(RecoveryPass& r) {
  // A copy from or to the lost host never arrives, and a value run again
  // lives under a new id. Each is asked for again, of the value as it is
  // now (after the calls routed before, which make it), and the old copy
  // goes.
  WorkerOps again_ops;
  for (uint64_t id : r.incomplete) {
    auto snap = snapshots_.find(id);
    if (snap == snapshots_.end()) continue;  // released meanwhile
    const Snapshot previous = std::move(snap->second);
    snapshots_.erase(snap);
    snapshot_of_.erase(previous.id);
    auto alias = aliases_.find(id);
    const uint64_t now = alias != aliases_.end() ? alias->second : id;
    const BufferRecord* b = records_.FindBuffer(now);
    ReleaseCopyOps(previous, b != nullptr ? b->slice_id : 0, &again_ops);
    // Released (by the client, or as an output it had released): no copy
    // is wanted any more.
    if (b == nullptr || b->released ||
        std::find(r.release_new.begin(), r.release_new.end(), now) !=
            r.release_new.end()) {
      continue;
    }
    RouteSnapshot(r.client_id, now, &again_ops);
  }
  if (!again_ops.empty()) r.out.work.push_back({0, std::move(again_ops)});
}

void ClusterState::ReleaseRunAgainOutputs(RecoveryPass& r) {
  // Released again under their new ids once nothing holds them: after
  // everything else has been routed (a call routed again in step 4 may
  // read one).
  ClientRecord* client = FindClient(r.client_id);
  WorkerOps last;
  for (uint64_t id : r.release_new) {
    if (client != nullptr) ForgetBuffer(*client, id);
    records_.Release(id);
  }
  DrainReleases(&last);
  if (!last.empty()) r.out.work.push_back({0, std::move(last)});
}

}  // namespace plexus
