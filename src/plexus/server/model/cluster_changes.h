// What ClusterState's changes hand back to the server: the ops to send
// each worker (WorkerOps), and, per kind of change, the work to admit and
// what to tell the client — a slice resized or suspended (SliceResized), a
// worker lost (WorkerLoss, AwaitedLoss) and a client's recovery from it
// (TakenWork, RoutedWork, ClientRecovery), and why a batch waits for a
// preempted slice (PreemptionHold). Plain data; ClusterState
// (cluster_state.h) makes and reads them.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// Why a client's batch waits at the server (HeldByPreemption): the first
// slice the server suspended for a higher priority that one of its calls
// or puts runs on.
struct PreemptionHold {
  uint64_t slice_id = 0;
  std::string why;
};

// Ops for each worker, in order.
using WorkerOps = std::map<int64_t, std::vector<proto::WorkerOp>>;

// The releases of values on one slice over several hosts, gathered rather
// than made one op per host (ClusterState::CallDone with a sink): every
// live host of the slice (`hosts`, sorted) lets go of `ids`, in order. The
// server encodes them once and shares the bytes among the hosts.
struct SliceRelease {
  std::vector<int64_t> hosts;
  std::vector<uint64_t> ids;
};
using SharedReleases = std::map<uint64_t, SliceRelease>;  // by slice id

// What ClusterState::ResizeSlice did: the slice's new map, the note that
// tells its client (every live value's new id; `resized` set), and the
// work to send, in order: one unit per value moved (its call's sequence
// number and ops), then the releases of the old copies.
struct SliceResized {
  proto::SliceInfo slice;
  proto::Recovery note;
  std::vector<std::pair<uint64_t, WorkerOps>> work;
  int32_t values_moved = 0;
  int64_t bytes_moved = 0;  // the values' bytes over all shards of the new map
  bool freed_devices = false;  // it shrank: waiting requests may be met
  // A suspend to files: the tokens of its park calls (SliceReply.wait_ids)
  // and the values they park (parked_ids).
  std::vector<uint64_t> wait_ids;
  std::vector<uint64_t> parked_ids;
  // Why the server resized it, where it did (YieldToPriorities,
  // GrowSlices).
  std::string why;
};

// What a lost worker did to the slices on it (ClusterState::LoseWorker).
struct WorkerLoss {
  int64_t worker_id = 0;
  std::string reason;
  // The host that took its place (its devices of the same indices), or 0
  // where no spare could.
  int64_t spare = 0;
  std::set<uint64_t> clients;   // owners of slices that were on it
  std::set<uint64_t> remapped;  // slices now on the spare
  std::set<uint64_t> broken;    // slices that had no spare
  // Slices that had no spare and shrank instead (SliceRequest.on_loss =
  // LOSS_SHRINK): each one's resize, its work to send and its note (the
  // values moved, and those lost with the host, with why).
  std::map<uint64_t, SliceResized> shrunk;
  // Slices that had no spare at once and wait for a host (AwaitedLoss):
  // neither remapped nor broken yet.
  std::set<uint64_t> awaiting;
  // A host that held no slice: the spare that took its place as a host
  // for new slices (0 if none did, or the lost worker was a spare).
  int64_t promoted = 0;
};

// A loss whose slices no spare could take when it happened, in a cluster
// that recovers (one given spares): they wait for a host to join or come
// free (a replacement the embedded cluster starts, a host that rejoins, a
// `plexus-worker --server` the operator starts) until `deadline`, then
// break. Their clients' work waits at the server meanwhile (ServerImpl).
struct AwaitedLoss {
  WorkerLoss loss;       // `awaiting` holds its slices
  int32_t highest = -1;  // the highest device index of it the slices use
  absl::Time since;
  absl::Time deadline;
};

// Work of a client that had not reached the workers when a worker was lost
// (admission's queue), to route again: a call (its record), releases, or
// ops that name no call (the lost worker's part dropped).
struct TakenWork {
  uint64_t call_seq = 0;
  std::vector<uint64_t> release_ids;
  WorkerOps ops;
  // Program loads it carried (worker, program): they never reached the
  // workers, which must get them with the work routed again.
  std::vector<std::pair<int64_t, uint64_t>> unsent_loads;
};

// Routed work in the order it must reach the workers: a call's ops
// (call_seq > 0), or ops that need no device.
struct RoutedWork {
  uint64_t call_seq = 0;
  WorkerOps ops;
};

// What recovery did for one client: the work to admit, in order, and what
// the client is told.
struct ClientRecovery {
  std::vector<RoutedWork> work;
  proto::Recovery note;
};

}  // namespace plexus
