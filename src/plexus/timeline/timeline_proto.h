// A Timeline's events as they travel (proto::TimelineRing), in chunks that
// keep each message small.
#pragma once

#include <cstdint>
#include <vector>

#include "plexus/proto/plexus.pb.h"
#include "plexus/timeline/timeline.h"

namespace plexus {

void ToProto(const TimelineEvent& event, proto::TimelineEvent* out);

// The events of `timeline` that end at or after `since_ns`, with the labels
// they name and the ring's counters, as rings of at most `per_chunk` events
// each (at least one ring, which carries the labels and counters).
std::vector<proto::TimelineRing> RingChunks(const Timeline& timeline,
                                            int64_t since_ns,
                                            int per_chunk = 8192);

}  // namespace plexus
