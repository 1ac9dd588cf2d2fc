// The ops that copy one shard of a buffer from one worker to another,
// shared by recovery (server/recovery/recovery.cc) and snapshots
// (server/recovery/snapshots.cc).
#pragma once

#include <cstdint>

#include "plexus/common/types.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus::internal {

// A copy of shard `src_shard` of buffer `src_id`, on worker `src_worker`,
// into (dst_id, dst_shard) on `dst`: the source pushes it once it is ready
// and the destination takes it as the client's (`report`: and says when it
// arrived, CallsDone.copies_done).
void CopyShard(uint64_t src_id, int32_t src_shard, int64_t src_worker,
               uint64_t dst_id, int32_t dst_shard, const DeviceRef& dst,
               const TensorSpec& spec, bool report, WorkerOps* ops);

}  // namespace plexus::internal
