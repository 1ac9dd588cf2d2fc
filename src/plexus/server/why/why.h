// Why is it stuck: the calls that have waited longer than a threshold, each
// followed through the server's records (JobRecords: calls and the buffers
// they read, and which call makes each) to the root of its wait, named in
// one sentence a person can act on:
//   - an input that was lost (and with which host), named with the line
//     that made it (its producing call's site; "a put" for a put);
//   - an input that another call, not done, makes: followed to that call,
//     and so on to the first call of the chain whose inputs are all there;
//   - that root call's hosts, or those its inputs made elsewhere are sent
//     from: one lost, one whose heartbeats stopped (a stopped or hung
//     process, named with how long it has been silent), or
//     all alive: then, on each of its devices, the call first in that
//     device's queue (routed first, not done). Where that is another call
//     the root is queued behind it, named with its program, the line that
//     issued it and its client; where it is the root itself the root runs
//     there — so a collective whose other rank is held by a long call on
//     one host names that rank (its index in the slice's devices), that
//     host and that call, and the hosts where its other ranks wait ("first
//     in line"); where its program is compiling on
//     one of its hosts (WorkerStats.compiling, by the worker's last
//     heartbeat) the root waits for that compile, named with how long it
//     has taken so far (so is a call queued behind one whose program
//     compiles); where it is first in line everywhere and one of its
//     hosts says its task waits for an input from a peer (WorkerStats.
//     awaiting_inputs, by the worker's last heartbeat: the shard, the
//     peer, how long; the oldest 32 waits), that transfer is named (a
//     transfer's temporary id, which the records do not map, by the input
//     of the call made on the peer's slice): the
//     value and the line that made it, the peer host, that it is alive
//     (its last heartbeat) or its trouble, and how long the transfer has
//     been awaited (blamed: the peer; so is a call queued behind one that
//     waits so). It "is running" only where its hosts reported after it was
//     routed and none waits for an input; where they have not reported
//     since and it reads an input made by a call done on another,
//     answering host, the sentence says both (not arrived, or running);
//   - a device of its slice whose memory budget is full while something
//     waits there for room (the workers report it: WorkerStats.
//     device_waiting_bytes), named with how full it is and the clients
//     whose values hold it, the most first (from the records: the live
//     buffers of slices mapped onto it);
//   - its slice waiting for a host to take a lost one's place;
//   - the call still at admission (routed, not yet admitted: its client's
//     share is used up, or its devices' windows are full): named with its
//     client's tenant and weight, and whose calls are in flight, their
//     tenants and weights, and the oldest of them.
// A client's calls at admission get one entry (its oldest call's, the
// outputs of all of them in output_ids), and each slice waiting for a
// host one (call_id 0, its slice_id), so a wait on any future names them.
// Hosts that already finished their part of the root call (admission has
// their reports: WhyOptions::not_done) are named as such, not blamed.
// Each call is named with the line of the user's program that issued it
// (Call.site), where the client said.
// A pure function of the records: `plexus status` (ClusterStatus.why),
// `plexus why` and client.why() read it.
//
// Not yet: fetches and puts (the client's, not the server's: the client's
// progress line shows their bytes, and the client reports none of them to
// the server), waits of collectives for their peers' partials (named by
// the queues and hosts above, not by the worker's waits), and calls of a
// batch that waits at the server for its slice (not routed: the slice's
// entry stands for them).
#pragma once

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {

struct WhyOptions {
  absl::Time now;
  absl::Duration after = absl::Seconds(1);  // explain waits longer than this
  // A live worker silent for longer than this is named as not answering.
  absl::Duration silent_after = absl::Milliseconds(300);
  int max_entries = 100;
  // For calls in flight on the workers (by seq), those that have not
  // reported them done (Admission::WorkersNotDone); the others finished
  // their part and are not blamed. Null, or a call not in it: unknown.
  const absl::flat_hash_map<uint64_t, absl::InlinedVector<int64_t, 4>>*
      not_done = nullptr;
  // What admission knows of each client (Admission::Find and
  // PendingCallSeqs): its weight, and its calls still waiting there, in
  // the order they go. Null: no call is at admission.
  struct AdmissionQueue {
    double weight = 1;
    std::vector<uint64_t> seqs;
  };
  const absl::flat_hash_map<uint64_t, AdmissionQueue>* admission = nullptr;
};

// The explained waits, the longest first.
std::vector<proto::WhyEntry> ExplainWaits(const ClusterState& state,
                                          const WhyOptions& options);

}  // namespace plexus
