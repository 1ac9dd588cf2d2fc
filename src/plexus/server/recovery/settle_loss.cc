#include "plexus/server/recovery/settle_loss.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

// A unit taken from admission as work to route again (recovery).
TakenWork Taken(AdmissionUnit unit) {
  TakenWork t;
  t.call_seq = unit.call_seq;
  for (auto& [w, list] : unit.ops) {
    for (const proto::WorkerOp& op : list) {
      if (op.has_load()) t.unsent_loads.emplace_back(w, op.load().program_id());
    }
  }
  if (unit.call_seq != 0) return t;
  for (auto& [w, list] : unit.ops) {
    for (const proto::WorkerOp& op : list) {
      if (!op.has_release()) continue;
      for (uint64_t b : op.release().buffer_ids()) {
        if (std::find(t.release_ids.begin(), t.release_ids.end(), b) ==
            t.release_ids.end()) {
          t.release_ids.push_back(b);
        }
      }
    }
  }
  // Ops other than releases (failures of refused calls) stay.
  for (auto& [w, list] : unit.ops) {
    for (proto::WorkerOp& op : list) {
      if (!op.has_release()) t.ops[w].push_back(std::move(op));
    }
  }
  return t;
}

// The client's slices of `loss` that shrank: each one's note goes first,
// and its moves to admission before anything routed again.
void SettleShrunk(const ClusterState& state, const WorkerLoss& loss,
                  ClientSettlement& out) {
  const uint64_t c = out.client_id;
  for (const auto& [sid, shrunk] : loss.shrunk) {
    auto slice = state.slices().find(sid);
    if (slice == state.slices().end() || slice->second.client_id != c) {
      continue;
    }
    out.shrunk.push_back(
        absl::StrCat("slice ", sid, " shrank to ", shrunk.slice.devices_size(),
                     " devices: worker ", loss.worker_id,
                     " was lost and no spare was free; ", shrunk.values_moved,
                     " values moved, ", shrunk.note.lost_ids_size(), " lost"));
    *out.note.add_recoveries() = shrunk.note;
    for (const auto& [seq, ops] : shrunk.work) {
      out.units.push_back(MakeAdmissionUnit(ops, seq));
    }
  }
}

}  // namespace

int64_t HoldForLoss(const ClusterState& state, Admission& admission,
                    const WorkerLoss& loss) {
  admission.RemoveWorker(loss.worker_id);
  for (uint64_t c : loss.clients) {
    if (state.HoldsAny(c, loss.remapped) || state.HoldsAny(c, loss.awaiting)) {
      admission.Hold(c);
    }
  }
  return admission.FailCallsOn(loss.worker_id,
                               absl::UnavailableError(loss.reason));
}

std::vector<ClientSettlement> SettleLoss(
    ClusterState& state, Admission& admission, const WorkerLoss& loss,
    absl::FunctionRef<bool(uint64_t)> connected) {
  std::vector<ClientSettlement> settled;
  const proto::Status lost = StatusToProto(absl::UnavailableError(loss.reason));
  for (uint64_t c : loss.clients) {
    if (state.HoldsAny(c, loss.awaiting) || !connected(c)) continue;
    ClientSettlement& out = settled.emplace_back();
    out.client_id = c;
    SettleShrunk(state, loss, out);
    auto* down = out.note.add_workers_down();
    down->set_worker_id(loss.worker_id);
    *down->mutable_status() = lost;
    std::vector<AdmissionUnit> held;
    if (!state.Awaiting(c)) held = admission.TakeHeld(c);
    if (state.HoldsAny(c, loss.remapped)) {
      std::vector<TakenWork> taken;
      taken.reserve(held.size());
      for (AdmissionUnit& unit : held) taken.push_back(Taken(std::move(unit)));
      ClientRecovery rec = state.RecoverClient(c, loss, std::move(taken));
      out.recovered = true;
      out.units_routed = static_cast<int64_t>(rec.work.size());
      out.new_ids = rec.note.new_ids_size();
      out.lost_ids = rec.note.lost_ids_size();
      for (RoutedWork& w : rec.work) {
        out.units.push_back(MakeAdmissionUnit(std::move(w.ops), w.call_seq));
      }
      *out.note.add_recoveries() = std::move(rec.note);
      continue;
    }
    if (state.HoldsAny(c, loss.broken)) {
      // No spare: what depended on the lost host fails now, everywhere.
      proto::Recovery gone = state.LoseOnBrokenSlices(c, loss);
      out.lost_ids = gone.lost_ids_size();
      if (out.lost_ids > 0) *out.note.add_recoveries() = std::move(gone);
    }
    if (!held.empty()) {
      // The slice broke after waiting: what it held fails where it needed
      // the lost host, in the client's order.
      out.held_failed = static_cast<int64_t>(held.size());
      for (AdmissionUnit& unit : held) out.units.push_back(std::move(unit));
    }
  }
  return settled;
}

void EnqueueSettled(Admission& admission, const WorkerLoss& loss,
                    std::vector<ClientSettlement>& settled) {
  bool fail = false;
  for (ClientSettlement& c : settled) {
    for (AdmissionUnit& unit : c.units) {
      admission.Enqueue(c.client_id, std::move(unit));
    }
    c.units.clear();
    fail = fail || c.held_failed > 0;
  }
  if (fail) {
    admission.FailCallsOn(loss.worker_id, absl::UnavailableError(loss.reason));
  }
}

}  // namespace plexus
