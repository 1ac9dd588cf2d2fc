// Why is it stuck: the calls that have waited longer than a threshold, each
// followed through the server's records (JobRecords: calls and the buffers
// they read, and which call makes each) to the root of its wait, named in
// one sentence a person can act on:
//   - an input that was lost (and with which host);
//   - an input that another call, not done, makes: followed to that call,
//     and so on to the first call of the chain whose inputs are all there;
//   - that root call's hosts: one lost, one whose heartbeats stopped (a
//     stopped or hung process, named with how long it has been silent), or
//     all alive, so it is running or queued on its devices (for how long);
//   - its slice waiting for a host to take a lost one's place.
// A pure function of the records: `plexus status` (ClusterStatus.why),
// `plexus why` and client.why() read it.
//
// Not yet: calls still at admission (not routed, so without records),
// fetches and puts (the client's, not the server's), collectives one rank
// of which has not joined, full devices.
#pragma once

#include <vector>

#include "absl/time/time.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/cluster_state.h"

namespace plexus {

struct WhyOptions {
  absl::Time now;
  absl::Duration after = absl::Seconds(1);  // explain waits longer than this
  // A live worker silent for longer than this is named as not answering.
  absl::Duration silent_after = absl::Milliseconds(300);
  int max_entries = 100;
};

// The explained waits, the longest first.
std::vector<proto::WhyEntry> ExplainWaits(const ClusterState& state,
                                          const WhyOptions& options);

}  // namespace plexus
