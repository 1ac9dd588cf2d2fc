// What a lost worker means for admission and for each client it touched,
// decided over the model alone (ClusterState and Admission, no streams):
// the server's WorkerDown calls HoldForLoss when the host goes and
// SettleLoss when its slices are settled (at once, or after waiting for a
// host), then sends what SettleLoss decided. Tested directly in
// settle_loss_test.cc.
//
// The order of a loss:
//   1. ClusterState::LoseWorker remaps the host's slices onto a spare,
//      shrinks them, breaks them or makes them wait for a host.
//   2. HoldForLoss: admission forgets the worker's calls in flight, holds
//      apart the waiting work of each client whose slices were remapped or
//      wait (it was routed on the old map), and fails the waiting calls of
//      the others that needed the host, in their place.
//   3. SettleLoss, for a loss whose slices are remapped, shrunk or broken
//      (a waiting loss is settled when a host takes its place or its wait
//      ends): each connected client whose slices no longer wait gets its
//      note (its shrunk slices' new sizes first, then the loss, then what
//      was recomputed under new ids or lost) and its held work back, routed
//      again on the new map (ClusterState::RecoverClient) or, where its
//      slice broke after waiting, failed where it needed the lost host.
//      The work is handed back in the client's order, after each shrunk
//      slice's moves.
//   4. The caller sends the peer ops the recovery made, and only then
//      gives the work to admission (EnqueueSettled: a transfer admitted
//      before its source heard of its destination would fail), admits,
//      and pushes each note to its client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/admission.h"

namespace plexus {

// Step 2 above. Returns how many waiting calls failed.
int64_t HoldForLoss(const ClusterState& state, Admission& admission,
                    const WorkerLoss& loss);

// What settling a loss decided for one client.
struct ClientSettlement {
  uint64_t client_id = 0;
  // What it is sent: recoveries (shrunk slices' notes, then what was
  // recomputed or lost) and workers_down.
  proto::ServerToClient note;
  // One line per slice of it that shrank ("slice 3 shrank to 2 devices:
  // ..."), for the log and the timeline.
  std::vector<std::string> shrunk;
  // Its work was routed again on a remapped slice (RecoverClient ran).
  bool recovered = false;
  int64_t units_routed = 0;  // units of work routed again, to admission
  int64_t new_ids = 0;       // its buffers recomputed or restored
  int64_t lost_ids = 0;      // its buffers lost with the host
  int64_t held_failed = 0;   // held units given back to fail (a broken slice)
  // Its work for admission, in order (EnqueueSettled).
  std::vector<AdmissionUnit> units;
};

// Step 3 above: each of `loss.clients` for which `connected` is true and
// none of whose slices of this loss waits for a host. Clients left out
// hear of the loss later (when they connect, or their wait ends). Units a
// client holds for another loss still waiting stay held. Takes the held
// units from `admission`; gives it nothing (EnqueueSettled does). Enqueues the
// work it routes to `admission`; admits nothing.
std::vector<ClientSettlement> SettleLoss(
    ClusterState& state, Admission& admission, const WorkerLoss& loss,
    absl::FunctionRef<bool(uint64_t)> connected);

// Step 4's hand-over, once the peer ops are sent: each client's units to
// `admission` in order; the held units of a slice that broke fail where
// they needed the lost host. Leaves `units` empty.
void EnqueueSettled(Admission& admission, const WorkerLoss& loss,
                    std::vector<ClientSettlement>& settled);

}  // namespace plexus
