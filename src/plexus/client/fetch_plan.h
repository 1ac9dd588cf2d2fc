// Which shards of a value a fetch reads, the one rule for it: every
// device's shard of a split or partial value, one replica (device 0's) of
// a replicated one, and for a mesh sharding the first device holding each
// distinct block. DataPath::Fetch reads what it lists; a relayed call
// (DataPath::RelayCall) has its workers answer only those shards.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus {

struct FetchPlan {
  std::vector<int> reads;  // device positions (shards), ascending
  std::vector<Box> boxes;  // mesh only: each read's block
};

// The plan for a value of layout `arg` over `n` devices; an error where
// the mesh cannot be cut into `n` blocks.
absl::StatusOr<FetchPlan> PlanFetch(const ArgSpec& arg, int n);

}  // namespace plexus
