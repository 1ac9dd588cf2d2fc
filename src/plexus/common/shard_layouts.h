// ShardLayouts: a host's record of where its devices are in the slices'
// maps (proto::ShardLayout ops), and the expansion of an Execute that names
// one into its tasks.
//
// An own-shards call (every shard reads its own shard of each input: the
// usual SPMD call) differs between its hosts only in each task's device
// and shard. The server tells each host of a slice's map its (device,
// shard) pairs once, ahead of the first call on that map, and from then on
// sends every host the same Execute bytes: a template task and the
// layout's id (proto::Execute.layout_id, .own_task). Expand turns that back
// into the tasks the server would have listed, field for field, so nothing
// after it (the task runner, the simulated hosts) knows the difference.
//
// Layouts are kept per client and forgotten with it (ClientGone); a slice's
// new map is a new layout. Not thread-safe: one per op applier, used on its
// thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

class ShardLayouts {
 public:
  // Keeps `layout` (an op from the server). A second op with the same id
  // replaces the first.
  void Add(const proto::ShardLayout& layout);
  // Forgets every layout of `client_id`.
  void ForgetClient(uint64_t client_id);
  size_t size() const { return layouts_.size(); }

  // An Execute that names a layout gets its tasks, one per device of the
  // layout, in its order: `own_task` with the device and shard set and each
  // input's first piece reading that shard; `layout_id` and `own_task` are
  // cleared. An Execute without one is left as it is. FailedPrecondition,
  // naming the call and the layout, when the layout was never told (or its
  // client is gone): the call cannot run here.
  absl::Status Expand(proto::Execute* exec) const;

 private:
  struct Layout {
    uint64_t client_id = 0;
    std::vector<int32_t> devices;
    std::vector<int32_t> shards;
  };
  absl::flat_hash_map<uint64_t, Layout> layouts_;
};

}  // namespace plexus
